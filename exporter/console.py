"""AISBench's console block, byte for byte: title, rules, 46-column labels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_LABEL_WIDTH = 46


def _frame(label: str, rows: list[tuple[str, str]]) -> str:
    title = f"========== Speculative Decoding Metrics  [{label}] =========="
    rule = "=" * (len(title) - 1)
    lines = [rule, title, rule]
    lines += [f"{name:<{_LABEL_WIDTH}}{value}" for name, value in rows]
    return "\n".join(lines) + "\n"


def _or_na(value: float | None, spec: str) -> str:
    return "N/A" if value is None else format(value, spec)


def format_block(label: str, result: Mapping[str, Any]) -> str:
    """One RESULT as the console block titled `[label]` (host:port, or `all`)."""
    data = result.get("data") or {}
    rate, length = data.get("acceptance_rate"), data.get("acceptance_length")
    if result.get("status") != "ok" or (rate is None and length is None):
        reason = result.get("error") or "No spec decode activity detected during benchmark window"
        return _frame(label, [("Status", "N/A"), ("Reason", reason)])
    per_pos = data.get("per_position_acceptance_rates") or {}
    positions = sorted(per_pos, key=int)  # numeric order: 0, 1, 2, ..., 10, never text order
    per_pos_text = "{" + ", ".join(f"{int(p)}: {per_pos[p]:.4f}" for p in positions) + "}"
    if data.get("num_drafts"):
        # From the counts, not the 3-decimal rounded value: no double rounding on screen.
        length = 1.0 + data["accepted_tokens"] / data["num_drafts"]
    rows = [
        ("Acceptance rate (%)", _or_na(rate, ".2f")),
        ("Acceptance length", _or_na(length, ".2f")),
        ("Drafts", _or_na(data.get("num_drafts"), "")),
        ("Draft tokens", _or_na(data.get("draft_tokens"), "")),
        ("Accepted tokens", _or_na(data.get("accepted_tokens"), "")),
        ("Per-position acceptance rates", per_pos_text),
    ]
    return _frame(label, rows)


def format_window(answer: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> str:
    """Every target's block of a stopped window, then `all` when it covers two or more."""
    results: Mapping[str, Any] = answer.get("results") or {}
    blocks = []
    for name, result in results.items():
        label = (labels or {}).get(name) or result.get("host_port") or name
        blocks.append(format_block(label, result))
    if len(results) >= 2 and answer.get("aggregate"):
        blocks.append(format_block("all", answer["aggregate"]))
    return "".join(blocks)
