"""The window page's per-request sections: how acceptance spread across the proxied requests,
one box plot per target on one acceptance-length axis; and acceptance length by concurrency and
by tag, each segment with its 95% interval."""

from __future__ import annotations

import math
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


CHARTED = ("concurrency", "tag")  # the segments the page draws (all are in the JSON)


def _figure(segment: object) -> tuple[float, float, float] | None:
    """A segment's acceptance length and interval if all are numbers (a peer's is not vetted)."""
    length = segment.get("acceptance_length") if isinstance(segment, Mapping) else None
    if not isinstance(length, Mapping) or not all(
            isinstance(length.get(k), int | float) for k in ("value", "low", "high")):
        return None
    return float(length["value"]), float(length["low"]), float(length["high"])


def segment_chart(dimension: str, segments: Mapping[str, Any]) -> str:
    """An inline SVG: per segment its acceptance length (dot) and 95% interval (whisker), or
    why it has none, on one axis from 1."""
    figures = {str(v): _figure(s) for v, s in segments.items()}
    top = float(math.ceil(max([2.0] + [f[2] for f in figures.values() if f is not None])))
    height = ROW * len(figures) + 20

    def x(value: float) -> float:
        return LEFT + (max(value, 1.0) - 1.0) / (top - 1.0) * WIDTH

    parts = [f'<svg class="chart segments" viewBox="0 0 {LEFT + WIDTH + 20} {height}" '
             f'role="img" aria-label="acceptance length by {escape(dimension)}">']
    for i, (value, figure) in enumerate(figures.items()):
        mid = i * ROW + ROW / 2
        requests = segments[value].get("requests") if isinstance(segments[value], Mapping) else 0
        parts.append(f'<text x="{LEFT - 6}" y="{mid + 4:.1f}" font-size="11" text-anchor="end">'
                     f"{escape(value)} ({escape(str(requests))})</text>")
        if figure is None:
            parts.append(f'<text x="{LEFT + 4}" y="{mid + 4:.1f}" font-size="11" fill="#888">'
                         "too few requests for a figure</text>")
            continue
        value_, low, high = figure
        parts.append(f'<line x1="{x(low):.1f}" x2="{x(high):.1f}" y1="{mid:.1f}" y2="{mid:.1f}"'
                     f' stroke="#3b7dd8" stroke-width="2"/><circle cx="{x(value_):.1f}" '
                     f'cy="{mid:.1f}" r="4" fill="#3b7dd8"><title>{fmt(value_, LENGTH)} '
                     f"[{fmt(low, LENGTH)}, {fmt(high, LENGTH)}]</title></circle>")
    for tick in range(1, int(top) + 1):
        parts.append(f'<text x="{x(tick):.1f}" y="{height - 6}" font-size="10" '
                     f'text-anchor="middle">{tick}</text>')
    return "".join(parts) + "</svg>"


def segments_section(state: Mapping[str, Any], series: Mapping[str, Any]) -> str:
    """Acceptance length by concurrency and by tag over every proxied target (the aggregate)."""
    block = state.get("per_request")
    aggregate = block.get("aggregate") if isinstance(block, Mapping) else None
    by = aggregate.get("by") if isinstance(aggregate, Mapping) else None
    if not isinstance(by, Mapping):
        return ""
    charts = [f"<h3>by {escape(d)}</h3>" + segment_chart(d, by[d]) for d in CHARTED
              if isinstance(by.get(d), Mapping) and by[d]]
    if not charts:
        return ""
    return ("<h2>Acceptance length by concurrency and by tag (recording proxy)</h2><p><small>"
            "Token-weighted within each segment (1 + accepted / steps) with its 95% interval "
            "(delta method over requests); concurrency is the requests in flight through the "
            "proxy as each started; the tag is the client's X-Specdec-Tag header. Segments of "
            "fewer than 10 requests give no figure.</small></p>" + "".join(charts))
