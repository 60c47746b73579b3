"""Console text of `compare` and `advise` (the figures come from compare.py and advise.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exporter.analysis.stats import ASSUMPTION
from exporter.web.pages.compare import FORMATS, NAMES, estimate_text

_SPELLED = "{} [{}, {}]"  # an estimate and its interval on one console line


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as lines, each column but the last padded to its widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]])
            for r in rows]


def _drafts(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def format_entry(name: str, entry: Mapping[str, Any]) -> list[str]:
    """One target's (or the aggregate's) comparison as table lines."""
    lines = [f"[{name}]  A: {_drafts(entry.get('a_drafts'))} drafts, "
             f"B: {_drafts(entry.get('b_drafts'))} drafts"]
    rows = [("metric", "A", "B", "B - A", "verdict")]
    for row in entry["metrics"]:
        spec = FORMATS.get(row["metric"], ".4f")
        rows.append((
            NAMES.get(row["metric"], row["metric"].replace("_", " ")),
            estimate_text(row["a"], spec, spelled=_SPELLED),
            estimate_text(row["b"], spec, spelled=_SPELLED),
            estimate_text(row["difference"], spec, signed=True, spelled=_SPELLED), row["verdict"],
        ))
    if len(rows) > 1:
        lines += _aligned(rows)
    lines.extend(f"  note: {note}" for note in entry.get("notes", []))
    return lines


def _segment_text(e: Mapping[str, Any] | None, signed: bool = False) -> str:
    return "too few requests" if e is None else estimate_text(e, ".3f", signed, _SPELLED)


def format_segments(segments: Mapping[str, Any]) -> list[str]:
    """Acceptance length segment by segment (the aggregate's), one table per dimension."""
    lines = []
    for dimension, entries in segments.items():
        rows = [(dimension, "A", "B", "B - A", "verdict")] + [(
            f"{row['value']} ({row['a_requests']}/{row['b_requests']} req)",
            _segment_text(row["a"]), _segment_text(row["b"]),
            _segment_text(row["difference"], signed=True), row["verdict"]) for row in entries]
        lines += [f"[acceptance length by {dimension}]", *_aligned(rows), ""]
    return lines


def format_comparison(body: Mapping[str, Any]) -> str:
    """The whole `compare` console output."""
    lines = [f"A: {body['a']}", f"B: {body['b']}", ASSUMPTION + ".", ""]
    for name, entry in body["targets"].items():
        lines += format_entry(name, entry) + [""]
    if body.get("aggregate") is not None and len(body["targets"]) != 1:
        lines += format_entry("all", body["aggregate"]) + [""]
    if not body["targets"] and body.get("aggregate") is None:
        lines += ["no target in both A and B has results to compare", ""]
    lines += format_segments(body.get("segments") or {})
    for side, key in (("A", "only_in_a"), ("B", "only_in_b")):
        if body.get(key):
            lines.append(f"only in {side}: {', '.join(body[key])}")
    for check in body.get("gates", []):
        if check["verdict"] == "unknown":
            lines.append(f"SKIP {check['gate']} [{check['target']}]: no interval to test")
        if check["verdict"] == "worse":
            # Worse but within the limit is worth a line too: the next run may trip it.
            unit = "%" if check["gate"].endswith("%") else ""
            lines.append(f"{'FAIL' if check['tripped'] else 'pass'} {check['gate']} "
                         f"[{check['target']}]: B is worse by {check['drop']:.4g}{unit}, "
                         f"at least {check['least_drop']:.4g}{unit} with 95% confidence")
    if body.get("gates"):
        lines.append("gates: tripped" if body.get("tripped") else "gates: passed")
    return "\n".join(lines).rstrip("\n") + "\n"


def _speed_lines(name: str, entry: Mapping[str, Any]) -> list[str]:
    rows = [("figure", "A", "B", "speed-up B over A [95%]", "verdict")]
    for row in entry["rows"]:
        up = row["speedup"]
        rows.append((f"{row['figure']} {row['stat']}", f"{row['a']:.4g}", f"{row['b']:.4g}",
                     estimate_text(up, ".3f", spelled=_SPELLED) + "x", row["verdict"]))
    return [f"[{name}]  timed answers A: {entry['a_timed']}, B: {entry['b_timed']}",
            *_aligned(rows)]


def format_speedup(body: Mapping[str, Any]) -> str:
    """`compare`'s paired speed-up section and its gate (none when no window was timed)."""
    speed = body.get("speedup")
    if speed is None:
        return ""
    lines = ["", "Paired speed-up (A without speculative decoding, B with it): " + speed["method"]]
    for name, entry in speed["targets"].items():
        lines += _speed_lines(name, entry)
    if speed["aggregate"] is not None and len(speed["targets"]) != 1:
        lines += _speed_lines("all", speed["aggregate"])
    lines += [f"no timings in {side}" for side in speed["missing"]]
    for dimension, values in speed["by"].items():
        for value, entry in values.items():
            name = f"{dimension} {value}"
            lines += _speed_lines(name, entry) if entry["rows"] else [
                f"[{name}]  timed answers A: {entry['a_timed']}, B: {entry['b_timed']}: "
                + entry["note"]]
    gate = body.get("speed_gate")
    for check in (gate or {}).get("checks", []):
        up = check["speedup"]
        if up["high"] is not None:
            lines.append(f"{'FAIL' if check['tripped'] else 'pass'} --fail-if-slower "
                         f"{check['ratio']:g} [{check['target']}]: speed-up {up['value']:.3f}x,"
                         f" at most {up['high']:.3f}x with 95% confidence")
    return "\n".join(lines) + "\n"


def format_advice(name: str, advice: Mapping[str, Any] | None) -> str:
    """One target's advisor table."""
    lines = [f"========== Speculation advisor  [{name}] =========="]
    if advice is None or advice.get("error"):
        reason = (advice or {}).get("error") or "no per-position rates: nothing to advise"
        return f"{lines[0]}\n{reason}\n"
    dist = advice["distribution"]
    costs = list(advice["best"])
    lines.append(f"measured k = {advice['k']}; accepted tokens per draft X: mean "
                 f"{dist['mean']:.3f}, variance {dist['variance']:.3f}")
    if not advice["monotone"]:
        lines.append(f"note: {dist['note']}")
    lines.append("P(X = j)   " + "  ".join(
        f"{j}: {p:.4f}" for j, p in dist["probabilities"].items()))
    header = ["k'", "tokens/step"] + [f"S c={c}" for c in costs]
    rows = [header]
    for row in advice["rows"]:
        mark = "*" if row["estimate"] else ""
        rows.append([f"{row['k']}{mark}", f"{row['length']:.3f}"]
                    + [f"{row['speedup'][c]:.3f}" for c in costs])
    lines += _aligned(rows)
    best = []
    for c in costs:
        top = advice["best"][c]
        mark = "*" if top["estimate"] else ""
        choice = "0 (no speculation)" if top["k"] == 0 else f"{top['k']}{mark}"
        best.append(f"c={c}: k'={choice} S={top['speedup']:.3f}")
    lines.append("best: " + "; ".join(best))
    ratio = advice.get("tail_ratio")
    ratio_text = "none (no accepted token)" if ratio is None else f"{ratio:.4f}"
    lines.append(f"* estimate: rates past k = {advice['k']} from a geometric fit of the "
                 f"measured ones, ratio {ratio_text}")
    lines.append("S = L / (1 + c k'): speed-up over no speculation; c = draft cost per token "
                 "relative to one target forward pass")
    return "\n".join(lines) + "\n"


def format_window_advice(label: str, body: Mapping[str, Any]) -> str:
    """Every target's advisor table, then the aggregate's when there are two or more."""
    parts = [f"window: {label}\n"]
    measured = body.get("measured_cost")
    if measured is not None and "value" in measured:
        parts.append(f"draft cost measured: c = {measured['value']:.4g} (a spec step "
                     f"{measured['step_ratio']:.3f}x a no-spec one: TPOT "
                     f"{measured['tpot_ms']:.4g} ms x length {measured['acceptance_length']:.3f}"
                     f" over the baseline's {measured['baseline_tpot_ms']:.4g} ms, "
                     f"{measured['draft_tokens_per_step']:.3g} tokens drafted a step)\n"
                     + (f"note: {measured['note']}\n" if measured["note"] else "")
                     + f"costs used: {measured['source']}\n" + "".join(
                         f"  concurrency {band}: c = {c['value']:.4g} (a step "
                         f"{c['step_ratio']:.3f}x)\n"
                         for band, c in measured["by_concurrency"].items()))
    elif measured is not None:
        parts.append(f"draft cost not measured: {measured['error']}; assumed costs shown\n")
    results = body["results"]
    for name, advice in results.items():
        parts.append(format_advice(name, advice))
    if len(results) >= 2:
        parts.append(format_advice("all", body.get("aggregate")))
    parts.append("k is ranked by S, not by acceptance rate (the rate falls as k grows, by "
                 "arithmetic)\n")
    return "\n".join(parts)
