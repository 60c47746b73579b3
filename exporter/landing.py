"""The landing page: plain HTML with inline SVG, built from the same views as the JSON API."""

from __future__ import annotations

import time
from collections.abc import Mapping
from html import escape
from typing import Any

from exporter import __version__
from exporter.compare_page import compare_form
from exporter.results import window_series
from exporter.service import ExporterService
from exporter.views import target_view

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top}.up{color:#070}.down{color:#b00}.err{color:#b00;font-size:90%}
small{color:#666}
"""


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _when(ts: float | None) -> str:
    return "–" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def position_bars(per_position: Mapping[str, float], width: int = 220, height: int = 60) -> str:
    """A small inline SVG bar chart of per-position acceptance (0..1), positions in order."""
    if not per_position:
        return ""
    positions = sorted(per_position, key=int)
    bar = width / len(positions)
    parts = [f'<svg width="{width}" height="{height + 14}" role="img" '
             f'aria-label="per-position acceptance">']
    for i, pos in enumerate(positions):
        ratio = max(0.0, min(1.0, per_position[pos]))
        h = ratio * height
        x = i * bar
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{height - h:.1f}" width="{max(bar - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="#3b7dd8"><title>position {escape(pos)}: '
            f"{ratio:.4f}</title></rect>"
            f'<text x="{x + bar / 2:.1f}" y="{height + 12}" font-size="10" '
            f'text-anchor="middle">{escape(pos)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


_COLOURS = ("#3b7dd8", "#d8743b", "#3bd87d", "#b03bd8", "#d83b5b", "#7d7d3b", "#3bc4d8")


def series_chart(series: Mapping[str, Any], width: int = 640, height: int = 180) -> str:
    """Inline SVG line chart: each target's acceptance ratio between consecutive scrapes.

    Warm-up, drift and the steady state show here, where the window's average hides them.
    """
    lines = {
        name: [(p["at"], p["interval_acceptance_ratio"]) for p in points
               if p.get("interval_acceptance_ratio") is not None]
        for name, points in series.get("targets", {}).items()
    }
    lines = {name: points for name, points in lines.items() if points}
    if not lines:
        return ""
    start = series.get("started_at") or min(p[0][0] for p in lines.values())
    end = max(p[-1][0] for p in lines.values())
    span = max(end - start, 1e-9)
    left, bottom = 36, height - 18
    parts = [f'<svg width="{width}" height="{height}" role="img" '
             f'aria-label="acceptance ratio over the window">',
             f'<line x1="{left}" y1="{bottom}" x2="{width}" y2="{bottom}" stroke="#999"/>',
             f'<line x1="{left}" y1="4" x2="{left}" y2="{bottom}" stroke="#999"/>',
             f'<text x="2" y="12" font-size="10">1.0</text>'
             f'<text x="2" y="{bottom}" font-size="10">0.0</text>',
             f'<text x="{width - 4}" y="{height - 4}" font-size="10" text-anchor="end">'
             f"{span:.0f}s</text>"]
    for i, (name, points) in enumerate(sorted(lines.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        coords = " ".join(
            f"{left + (at - start) / span * (width - left - 4):.1f},"
            f"{bottom - max(0.0, min(1.0, ratio)) * (bottom - 4):.1f}"
            for at, ratio in points
        )
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'points="{coords}"><title>{escape(name)}</title></polyline>')
        parts.append(f'<text x="{left + 6}" y="{14 + 12 * i}" font-size="10" '
                     f'fill="{colour}">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _target_row(view: dict[str, Any]) -> str:
    live = view["live"] or {}
    state = '<span class="up">up</span>' if view["up"] else '<span class="down">down</span>'
    error = (
        f'<div class="err">{escape(view["last_error"])} <small>{_when(view["last_error_at"])}'
        "</small></div>" if view["last_error"] else ""
    )
    if view["up"] and view["spec_decode_present"] is False:
        error += '<div class="err">no spec-decode series on the page</div>'
    ratio = live.get("acceptance_ratio")
    return (
        f"<tr><td>{escape(view['name'])}<br><small>{escape(view['url'])}</small></td>"
        f"<td>{state}{error}</td>"
        f"<td>{escape(', '.join(view['model_names']))}<br><small>engines: {view['engines']}"
        "</small></td>"
        f"<td>{_fmt(ratio * 100 if ratio is not None else None, '.2f')}</td>"
        f"<td>{_fmt(live.get('acceptance_length'), '.2f')}</td>"
        f"<td>{position_bars(live.get('per_position') or {})}</td></tr>"
    )


def _window_row(state: dict[str, Any]) -> str:
    status = "open" if state.get("stopped_at") is None else "stopped"
    aggregate = (state.get("aggregate") or {}).get("data") or {}
    rate = aggregate.get("acceptance_rate")
    return (
        f"<tr><td><a href=\"/api/v1/windows/{escape(state['id'])}\">{escape(state['id'])}</a>"
        f"</td><td>{escape(state['name'])}</td><td>{status}</td>"
        f"<td>{_when(state['started_at'])}</td><td>{_when(state.get('stopped_at'))}</td>"
        f"<td>{escape(', '.join(state['targets']))}</td>"
        f"<td>{_fmt(rate, '.2f')}</td><td>{_fmt(aggregate.get('acceptance_length'), '.3f')}</td>"
        "</tr>"
    )


def render_landing(service: ExporterService) -> str:
    """The whole page."""
    now = service.clock()
    views = [target_view(s, service.live[n], now) for n, s in service.targets.items()]
    windows = [w.state() for w in service.list_windows()[:20]]
    target_rows = "".join(_target_row(v) for v in views) or '<tr><td colspan="6">none</td></tr>'
    window_rows = "".join(_window_row(w) for w in windows) or '<tr><td colspan="8">none</td></tr>'
    live_span = f"{service.config.live_window:g}s"
    discovery = "".join(
        f'<div class="err">discovery: {escape(error)}</div>'
        for error in service.discovery.errors().values()
    )
    recent = service.list_windows()[:1]
    chart = ""
    if recent and (svg := series_chart(window_series(service.window_with_series(recent[0].id)))):
        chart = (f"<h3>Acceptance ratio through window {escape(recent[0].id)} "
                 f"(between consecutive scrapes)</h3>{svg}")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>specdec-exporter</title>
<style>{_STYLE}</style></head><body>
<h1>specdec-exporter <small>{escape(__version__)}</small></h1>
<p><a href="/metrics">/metrics</a> · <a href="/api/v1/targets">/api/v1/targets</a> ·
<a href="/api/v1/windows">/api/v1/windows</a> · <a href="/-/healthy">/-/healthy</a> ·
<a href="/-/ready">/-/ready</a></p>
<h2>Targets</h2>
{discovery}
<table><tr><th>target</th><th>state</th><th>model</th><th>acceptance rate % ({live_span})</th>
<th>acceptance length ({live_span})</th><th>per-position acceptance</th></tr>
{target_rows}</table>
<h2>Windows</h2>
<table><tr><th>id</th><th>name</th><th>state</th><th>started</th><th>stopped</th><th>targets</th>
<th>acceptance rate %</th><th>acceptance length</th></tr>
{window_rows}</table>
{compare_form(windows)}
{chart}
</body></html>
"""
