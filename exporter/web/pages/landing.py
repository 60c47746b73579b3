"""The landing page: plain HTML with inline SVG, built from the same views as the JSON API."""

from __future__ import annotations

from html import escape
from typing import Any

from exporter import __version__
from exporter.core.stopanswer import window_series
from exporter.server.stateview import StateView
from exporter.web.jsonviews import target_view
from exporter.web.pages.compare import compare_form
from exporter.web.pages.html import LENGTH, RATE, fmt, line_chart, page, position_bars, table, utc
from exporter.web.pages.window import acceptance_lines

# The page reloads itself this often at most: a reading eye, not every scrape (1s in the demo).
GENTLE_REFRESH = 30.0


def _no_figure_reason(view: dict[str, Any], live_span: str) -> str:
    """Why a target shows no live acceptance: the en dash is never left unexplained."""
    if not view["up"]:
        return "down, no figures seen" if view["last_seen_at"] is None else "down"
    if view["spec_decode_present"] is False:
        return "no spec-decode series on the page"
    return f"no drafts in the last {live_span}"


def _target_row(view: dict[str, Any], live_span: str) -> str:
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
    ratio = live.get("acceptance_ratio")
    rate = fmt(ratio * 100 if ratio is not None else None, RATE)
    if not live:
        rate += f"<div><small>{escape(_no_figure_reason(view, live_span))}</small></div>"
    engines = f"<br><small>engines: {view['engines']}</small>" if view["engines"] else ""
    css = ' class="stale"' if stale else ""
    # The acceptance columns first: on a phone they are what shows without scrolling.
    return (
        f'<tr{css}><td class="name">{escape(view["name"])}<br>'
        f"<small>{escape(view['url'])}</small></td>"
        f'<td class="num">{rate}</td>'
        f'<td class="num">{fmt(live.get("acceptance_length"), LENGTH)}</td>'
        f"<td>{state}{error}</td>"
        f"<td>{escape(', '.join(view['model_names'])) or '–'}{engines}</td>"
        f"<td>{position_bars(live.get('per_position') or {})}</td></tr>"
    )


def _summary(views: list[dict[str, Any]], live_span: str) -> str:
    """`N of M up`, how many are down (listed first) and how many show no drafts."""
    up = sum(1 for v in views if v["up"])
    parts = [f"<b>{up} of {len(views)} up</b>"]
    if down := len(views) - up:
        parts.append(f'<span class="down">{down} down</span> (listed first)')
    if quiet := sum(1 for v in views if v["up"] and not v["live"]):
        parts.append(f"{quiet} up without drafts in the last {live_span}")
    return f'<p class="summary">{" · ".join(parts)}</p>'


def _window_row(state: dict[str, Any]) -> str:
    status = "open" if state.get("stopped_at") is None else "stopped"
    aggregate = (state.get("aggregate") or {}).get("data") or {}
    rate = aggregate.get("acceptance_rate")
    return (
        f"<tr><td class=\"name\"><a href=\"/windows/{escape(state['id'])}\">"
        f"{escape(state['id'])}</a><br><small>{escape(state['name'])}</small></td>"
        f'<td class="num">{fmt(rate, RATE)}</td>'
        f'<td class="num">{fmt(aggregate.get("acceptance_length"), LENGTH)}</td>'
        f"<td>{status}</td><td>{utc(state['started_at'])}</td>"
        f"<td>{utc(state.get('stopped_at'))}</td>"
        f"<td>{escape(', '.join(state['targets']))}</td></tr>"
    )


def render_landing(view: StateView, refresh: bool = True) -> str:
    """The whole page; it reloads itself every GENTLE_REFRESH (or scrape interval, if longer)
    unless `refresh` is off."""
    now = view.now
    views = [target_view(s, view.live[n], now) for n, s in view.targets.items()]
    views.sort(key=lambda v: v["up"])  # down ones first, each group in the config's order
    listed = view.windows()
    windows = [w.state() for w in listed[:20]]
    live_span = f"{view.config.live_window:g}s"
    discovery = "".join(
        f'<div class="err">discovery: {escape(error)}</div>'
        for error in view.discovery_errors.values()
    )
    target_table = _summary(views, live_span) + table(
        ["target", f"acceptance rate % ({live_span})", f"acceptance length ({live_span})",
         "state", "model", "per-position acceptance"],
        (_target_row(v, live_span) for v in views))
    window_table = table(
        ["window", "acceptance rate %", "acceptance length", "state", "started", "stopped",
         "targets"],
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
    every = max(GENTLE_REFRESH, view.config.scrape_interval)
    refreshing = (f'refreshes every {every:g}s · <a href="/?refresh=0">stop</a>'
                  if refresh else '<a href="/">refresh by itself</a>')
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
    return page("specdec-exporter", body, refresh=every if refresh else None)
