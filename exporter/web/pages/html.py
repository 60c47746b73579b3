"""What every HTML page shares: the frame, number formats, and the inline SVG charts (no
external assets; tables scroll inside their own box, charts scale to the width they get)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

from exporter import __version__

STYLE = """
body{font-family:system-ui,sans-serif;margin:1em 2em;color:#222;max-width:1400px}
@media (max-width:600px){body{margin:.5em}}
h1{font-size:1.5em;overflow-wrap:anywhere}h2{font-size:1.2em}h3{font-size:1em}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top}td.num,th.num{text-align:right}
.up{color:#070}.down{color:#b00}.err{color:#b00;font-size:90%}.note{color:#a60;font-size:90%}
.stale{color:#999}.stale svg rect{fill:#bbb}
small{color:#666}pre{overflow-x:auto;background:#f6f6f6;padding:.5em;font-size:85%}
td.name{min-width:7em;max-width:14em;overflow-wrap:anywhere}td.notes{min-width:18em}
@media (max-width:600px){td.name{min-width:5em;max-width:8em}td,th{padding:3px 4px}}
details>summary{cursor:pointer;font-weight:bold}
svg.chart{width:100%;max-width:720px;height:auto}
.legend span{display:inline-block;margin-right:1em;white-space:nowrap}
.legend i{display:inline-block;width:1.2em;height:.25em;vertical-align:middle;margin-right:.3em}
"""

# The console's decimals, so a page and a terminal show the same figures.
RATE = ".2f"  # acceptance rate in %
LENGTH = ".2f"  # acceptance length
POSITION = ".4f"  # per-position acceptance ratio

COLOURS = ("#3b7dd8", "#d8743b", "#2a9d5c", "#b03bd8", "#d83b5b", "#7d7d3b", "#3bc4d8")
AGGREGATE_COLOUR = "#222"


def series_colour(i: int) -> str:
    """The i-th line's colour: the palette, then hues a golden angle apart (never one twice)."""
    if i < len(COLOURS):
        return COLOURS[i]
    n = i - len(COLOURS)
    # Lightness steps too, so hues that come close again still differ.
    return f"hsl({(n * 137.508 + 20) % 360:.2f},65%,{38 + 8 * (n % 3)}%)"


def page(title: str, body: str, *, refresh: float | None = None, style: str = "") -> str:
    """A whole HTML document: viewport meta, the shared style, and an optional meta refresh."""
    refresh_meta = ("" if refresh is None
                    else f'<meta http-equiv="refresh" content="{max(1, math.ceil(refresh))}">')
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{refresh_meta}<title>{escape(title)}</title><style>{STYLE}{style}</style></head>"
        f"<body>\n{body}\n<p><small>specdec-exporter {escape(__version__)}</small></p>"
        "</body></html>\n"
    )


def fmt(value: float | None, spec: str) -> str:
    """A number in the given format, or an en dash for none."""
    return "–" if value is None else format(value, spec)


def utc(ts: float | None) -> str:
    """A Unix time as people read it on a page: `2026-12-02 18:00:05 UTC`."""
    return "–" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def table(headers: Sequence[str], rows: Iterable[str]) -> str:
    """A table in its own scrolling box, so a narrow screen scrolls it, not the page."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join(rows) or f'<tr><td colspan="{len(headers)}">none</td></tr>'
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def position_bars(per_position: Mapping[str, float], width: int = 220, height: int = 60) -> str:
    """A small inline SVG bar chart of per-position acceptance (0..1), positions in order."""
    if not per_position:
        return ""
    positions = sorted(per_position, key=int)
    bar = width / len(positions)
    parts = [f'<svg width="{width}" height="{height + 14}" viewBox="0 0 {width} {height + 14}" '
             'role="img" aria-label="per-position acceptance">']
    for i, pos in enumerate(positions):
        ratio = max(0.0, min(1.0, per_position[pos]))
        h = ratio * height
        x = i * bar
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{height - h:.1f}" width="{max(bar - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="#3b7dd8"><title>position {escape(pos)}: '
            f"{format(ratio, POSITION)}</title></rect>"
            f'<text x="{x + bar / 2:.1f}" y="{height + 12}" font-size="10" '
            f'text-anchor="middle">{escape(pos)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _ticks(span: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to span: steps of 1, 2 or 5 times a power of ten."""
    if span <= 0:
        return [0.0]
    raw = span / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(span / step) + 1)]


def line_chart(lines: Mapping[str, Sequence[tuple[float, float]]], *, start: float, end: float,
               aggregate: Sequence[tuple[float, float]] = ()) -> str:
    """An inline SVG chart of 0..100 values over time; its legend is HTML below, so it wraps."""
    drawn = {name: points for name, points in lines.items() if points}
    if not drawn and not aggregate:
        return ""
    x_label, y_label = "time since window start (s)", "acceptance rate (%)"
    width, height = 720, 260
    left, right, top, bottom = 48, 12, 10, height - 40
    span = max(end - start, 1e-9)

    def x(at: float) -> float:
        return left + (at - start) / span * (width - left - right)

    def y(value: float) -> float:
        return bottom - max(0.0, min(100.0, value)) / 100 * (bottom - top)

    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{escape(y_label)} over {escape(x_label)}">']
    for value in (0, 25, 50, 75, 100):
        parts.append(f'<line x1="{left}" y1="{y(value):.1f}" x2="{width - right}" '
                     f'y2="{y(value):.1f}" stroke="#eee"/>'
                     f'<text class="tick" x="{left - 4}" y="{y(value) + 3:.1f}" font-size="10" '
                     f'text-anchor="end">{value}</text>')
    for tick in _ticks(span):
        parts.append(f'<text class="tick" x="{x(start + tick):.1f}" y="{bottom + 14}" '
                     f'font-size="10" text-anchor="middle">{tick:g}</text>')
    parts.append(
        f'<line x1="{left}" y1="{bottom}" x2="{width - right}" y2="{bottom}" stroke="#999"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#999"/>'
        f'<text class="axis-label" x="{(left + width - right) / 2:.0f}" y="{height - 6}" '
        f'font-size="11" text-anchor="middle">{escape(x_label)}</text>'
        f'<text class="axis-label" x="12" y="{(top + bottom) / 2:.0f}" font-size="11" '
        f'text-anchor="middle" transform="rotate(-90 12 {(top + bottom) / 2:.0f})">'
        f"{escape(y_label)}</text>"
    )
    legend = []
    for i, (name, points) in enumerate(sorted(drawn.items())):
        colour = series_colour(i)
        parts.append(_polyline(points, x, y, colour, 1.5, name))
        legend.append(_legend_item(colour, name))
    if aggregate:
        parts.append(_polyline(aggregate, x, y, AGGREGATE_COLOUR, 3, "all targets"))
        legend.append(_legend_item(AGGREGATE_COLOUR, "all targets (aggregate)"))
    parts.append("</svg>")
    return "".join(parts) + f'<div class="legend">{"".join(legend)}</div>'


def _polyline(points: Sequence[tuple[float, float]], x: Any, y: Any, colour: str,
              stroke: float, name: str) -> str:
    coords = " ".join(f"{x(at):.1f},{y(value):.1f}" for at, value in points)
    return (f'<polyline fill="none" stroke="{colour}" stroke-width="{stroke}" '
            f'points="{coords}"><title>{escape(name)}</title></polyline>')


def _legend_item(colour: str, name: str) -> str:
    return f'<span><i style="background:{colour}"></i>{escape(name)}</span>'
