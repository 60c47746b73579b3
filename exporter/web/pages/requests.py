"""The window page's per-request section: how acceptance spread across the proxied requests,
one box plot per target on one acceptance-length axis."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from exporter.web.pages.html import LENGTH, fmt, table

_KEYS = ("min", "p5", "p50", "p95", "max", "mean")
ROW, LEFT, WIDTH = 26, 140, 520  # px: one box's height, the names' column, the axis


def _summary(block: object) -> dict[str, float] | None:
    """A block's acceptance-length summary if all are numbers (a peer's block is not vetted)."""
    summary = block.get("acceptance_length") if isinstance(block, Mapping) else None
    if not isinstance(summary, Mapping) or not all(
            isinstance(summary.get(k), int | float) for k in _KEYS):
        return None
    return {k: float(summary[k]) for k in _KEYS}


def spread_chart(boxes: list[tuple[str, dict[str, float]]]) -> str:
    """An inline SVG of one box per (name, summary), on a shared axis from 1."""
    top = max(max(s["max"] for _, s in boxes), 2.0)
    height = ROW * len(boxes) + 20

    def x(value: float) -> float:
        return LEFT + (value - 1.0) / (top - 1.0) * WIDTH

    parts = [f'<svg class="chart" viewBox="0 0 {LEFT + WIDTH + 20} {height}" role="img" '
             'aria-label="acceptance length across requests">']
    for i, (name, s) in enumerate(boxes):
        mid = i * ROW + ROW / 2
        parts.append(
            f'<text x="{LEFT - 6}" y="{mid + 4:.1f}" font-size="11" text-anchor="end">'
            f"{escape(name)}</text>"
            f'<line x1="{x(s["min"]):.1f}" x2="{x(s["max"]):.1f}" y1="{mid:.1f}" '
            f'y2="{mid:.1f}" stroke="#888"/>'
            f'<rect x="{x(s["p5"]):.1f}" y="{mid - 7:.1f}" '
            f'width="{max(x(s["p95"]) - x(s["p5"]), 1):.1f}" height="14" fill="#cfe0f6" '
            f'stroke="#3b7dd8"><title>p5 {fmt(s["p5"], LENGTH)} – p95 '
            f'{fmt(s["p95"], LENGTH)}</title></rect>'
            f'<line x1="{x(s["p50"]):.1f}" x2="{x(s["p50"]):.1f}" y1="{mid - 7:.1f}" '
            f'y2="{mid + 7:.1f}" stroke="#222" stroke-width="2"/>'
            f'<circle cx="{x(s["mean"]):.1f}" cy="{mid:.1f}" r="3" fill="#d8743b">'
            f'<title>mean {fmt(s["mean"], LENGTH)}</title></circle>')
    axis = height - 6
    for tick in range(1, int(top) + 1):
        parts.append(f'<text x="{x(tick):.1f}" y="{axis}" font-size="10" '
                     f'text-anchor="middle">{tick}</text>')
    parts.append("</svg>")
    return "".join(parts)


def per_request_section(state: Mapping[str, Any], series: Mapping[str, Any]) -> str:
    """What the recording proxy saw: the spread of acceptance length across requests."""
    block = state.get("per_request")
    if not isinstance(block, Mapping):
        return ""
    targets = block.get("targets")
    entries = list(targets.items()) if isinstance(targets, Mapping) else []
    if len(entries) >= 2:
        entries.append(("all", block.get("aggregate")))
    boxes = [(str(name), s) for name, b in entries if (s := _summary(b)) is not None]
    rows = []
    for name, b in entries:
        if not isinstance(b, Mapping):
            continue
        s = _summary(b)
        cells = [escape(str(name)), escape(str(b.get("requests"))),
                 escape(str(b.get("with_stats")))]
        cells += [fmt(s[k], LENGTH) if s else "–" for k in ("mean", "p5", "p50", "p95")]
        cells.append(escape(str(b.get("reason") or "")))
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        return ""
    return ("<h2>Acceptance across requests (recording proxy)</h2><p><small>Each request "
            "counts once here; the results above weight by tokens. Line: min to max; box: p5 "
            "to p95; bar: median; dot: mean.</small></p>"
            + (spread_chart(boxes) if boxes else "")
            + table(["target", "requests", "with stats", "mean", "p5", "p50", "p95", "note"],
                    rows))
