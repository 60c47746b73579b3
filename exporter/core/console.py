"""AISBench's console block, byte for byte (`spec_decode/reporter.py`): an empty line, rules
two `=` shorter than the title, the title, 46-column labels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.core.aisbench import NO_ACTIVITY

_LABEL_WIDTH = 46


def _frame(label: str, rows: list[tuple[str, str]]) -> str:
    title = f"========== Speculative Decoding Metrics  [{label}] =========="
    rule = "=" * (len(title) - 2)
    lines = ["", rule, title, rule]
    lines += [f"{name:<{_LABEL_WIDTH}}{value}" for name, value in rows]
    return "\n".join(lines) + "\n"


def _or_na(value: float | None, spec: str) -> str:
    return "N/A" if value is None else format(value, spec)


def format_block(label: str, result: Mapping[str, Any]) -> str:
    """One RESULT as the console block titled `[label]` (host:port, or `all`)."""
    data = result.get("data") or {}
    rate, length = data.get("acceptance_rate"), data.get("acceptance_length")
    if result.get("status") != "ok" or (rate is None and length is None):
        reason = result.get("error") or NO_ACTIVITY
        return _frame(label, [("Status", "N/A"), ("Reason", reason)])
    per_pos = data.get("per_position_acceptance_rates") or {}
    positions = sorted(per_pos, key=int)  # numeric order: 0, 1, 2, ..., 10, never text order
    per_pos_text = "{" + ", ".join(f"{int(p)}: {per_pos[p]:.4f}" for p in positions) + "}"
    rows = [
        ("Acceptance rate (%)", _or_na(rate, ".2f")),
        ("Acceptance length", _or_na(length, ".2f")),
        ("Drafts", _or_na(data.get("num_drafts"), "")),
        ("Draft tokens", _or_na(data.get("draft_tokens"), "")),
        ("Accepted tokens", _or_na(data.get("accepted_tokens"), "")),
        ("Per-position acceptance rates", per_pos_text),
    ]
    return _frame(label, rows)


def format_caveats(result: Mapping[str, Any]) -> str:
    """One `Note:` line per thing the block cannot carry; nothing for a clean full result."""
    if result.get("status") != "ok":
        return ""  # the block's Reason says it all
    notes = []
    coverage_note = result.get("coverage_note")
    if result.get("coverage") == "partial" and coverage_note:
        notes.append("partial coverage: " + coverage_note.removeprefix("partial: "))
    resets = result.get("resets") or 0
    if result.get("unobserved") and result.get("coverage") == "partial" and coverage_note:
        pass  # the coverage line names each restart's unobserved span: one line for it all
    elif result.get("reset_note"):
        notes.append(result["reset_note"])
    elif resets:
        notes.append(f"server restarts: {resets}; what the server counted from our last scrape "
                     "before each restart to the restart is not counted")
    if result.get("anomaly_note"):
        notes.append(result["anomaly_note"])
    if result.get("estimate"):
        notes.append("estimate, not exact counts: " + (result.get("dialect_note") or ""))
    elif result.get("dialect_note"):
        notes.append(result["dialect_note"])
    return "".join(f"Note: {note}\n" for note in notes)


def format_window(answer: Mapping[str, Any]) -> str:
    """Every target's block of a stopped window with its notes, then `all` for two or more."""
    results: Mapping[str, Any] = answer.get("results") or {}
    blocks = []
    for name, result in results.items():
        label = result.get("host_port") or name
        # The title is host:port, as AISBench prints it; a differing target name follows.
        named = f"Target: {name}\n" if name != label else ""
        blocks.append(format_block(label, result) + named + format_caveats(result))
    if len(results) >= 2 and answer.get("aggregate"):
        aggregate = answer["aggregate"]
        blocks.append(format_block("all", aggregate) + format_caveats(aggregate))
    return "".join(blocks)
