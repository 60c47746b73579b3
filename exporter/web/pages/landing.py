"""The landing page: plain HTML with inline SVG, built from the same views as the JSON API."""

from __future__ import annotations

from html import escape
from typing import Any

from exporter import __version__
from exporter.core.results import window_series
from exporter.server.stateview import StateView
from exporter.web.jsonviews import target_view
from exporter.web.pages.compare import compare_form
from exporter.web.pages.html import LENGTH, RATE, fmt, line_chart, page, position_bars, table, utc
from exporter.web.pages.window import acceptance_lines


def _target_row(view: dict[str, Any]) -> str:
    live = view["live"] or {}
    # A down target keeps its last live figures, greyed, with when they were last seen.
    stale = not view["up"] and bool(live)
    state = '<span class="up">up</span>' if view["up"] else '<span class="down">down</span>'
    if stale:
        state += f"<div><small>last seen {utc(view['last_seen_at'])}</small></div>"
    error = (
        f'<div class="err">{escape(view["last_error"])} <small>{utc(view["last_error_at"])}'
        "</small></div>" if view["last_error"] else ""
    )
    if view["up"] and view["spec_decode_present"] is False:
        error += '<div class="err">no spec-decode series on the page</div>'
    ratio = live.get("acceptance_ratio")
    css = ' class="stale"' if stale else ""
    return (
        f"<tr{css}><td>{escape(view['name'])}<br><small>{escape(view['url'])}</small></td>"
        f"<td>{state}{error}</td>"
        f"<td>{escape(', '.join(view['model_names']))}<br><small>engines: {view['engines']}"
        "</small></td>"
        f'<td class="num">{fmt(ratio * 100 if ratio is not None else None, RATE)}</td>'
        f'<td class="num">{fmt(live.get("acceptance_length"), LENGTH)}</td>'
        f"<td>{position_bars(live.get('per_position') or {})}</td></tr>"
    )


def _window_row(state: dict[str, Any]) -> str:
    status = "open" if state.get("stopped_at") is None else "stopped"
    aggregate = (state.get("aggregate") or {}).get("data") or {}
    rate = aggregate.get("acceptance_rate")
    return (
        f"<tr><td><a href=\"/windows/{escape(state['id'])}\">{escape(state['id'])}</a>"
        f"</td><td>{escape(state['name'])}</td><td>{status}</td>"
        f"<td>{utc(state['started_at'])}</td><td>{utc(state.get('stopped_at'))}</td>"
        f"<td>{escape(', '.join(state['targets']))}</td>"
        f'<td class="num">{fmt(rate, RATE)}</td>'
        f'<td class="num">{fmt(aggregate.get("acceptance_length"), LENGTH)}</td>'
        "</tr>"
    )


def render_landing(view: StateView, refresh: bool = True) -> str:
    """The whole page; it reloads itself every scrape interval unless `refresh` is off."""
    now = view.now
    views = [target_view(s, view.live[n], now) for n, s in view.targets.items()]
    listed = view.windows()
    windows = [w.state() for w in listed[:20]]
    live_span = f"{view.config.live_window:g}s"
    discovery = "".join(
        f'<div class="err">discovery: {escape(error)}</div>'
        for error in view.discovery_errors.values()
    )
    target_table = table(
        ["target", "state", "model", f"acceptance rate % ({live_span})",
         f"acceptance length ({live_span})", "per-position acceptance"],
        (_target_row(v) for v in views))
    window_table = table(
        ["id", "name", "state", "started", "stopped", "targets", "acceptance rate %",
         "acceptance length"],
        (_window_row(w) for w in windows))
    chart = ""
    if listed:
        recent = listed[0]
        lines, _ = acceptance_lines(window_series(view.with_series(recent.id)))
        end = recent.stopped_at or max((p[-1][0] for p in lines.values() if p), default=0)
        svg = line_chart(lines, start=recent.started_at, end=max(end, recent.started_at))
        if svg:
            chart = (f'<h3>Acceptance through window <a href="/windows/{escape(recent.id)}">'
                     f"{escape(recent.id)}</a></h3>{svg}")
    refreshing = (
        f'refreshes every {view.config.scrape_interval:g}s · <a href="/?refresh=0">stop</a>'
        if refresh else '<a href="/">refresh by itself</a>'
    )
    body = f"""<h1>specdec-exporter <small>{escape(__version__)}</small></h1>
<p><a href="/metrics">/metrics</a> · <a href="/api/v1/targets">/api/v1/targets</a> ·
<a href="/api/v1/windows">/api/v1/windows</a> · <a href="/-/healthy">/-/healthy</a> ·
<a href="/-/ready">/-/ready</a> · <small>{refreshing}</small></p>
<h2>Targets</h2>
{discovery}
{target_table}
<h2>Windows</h2>
{window_table}
{compare_form(windows)}
{chart}"""
    return page("specdec-exporter", body,
                refresh=view.config.scrape_interval if refresh else None)
