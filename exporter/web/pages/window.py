"""`GET /windows/{id}`: one window as a page of `SECTIONS`, each a function of its JSON state
and its time series to HTML."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from exporter.core.console import format_window
from exporter.core.isotime import iso_utc
from exporter.web.pages.advice import STYLE as ADVICE_STYLE
from exporter.web.pages.advice import advice_sections
from exporter.web.pages.html import (
    LENGTH,
    RATE,
    fmt,
    line_chart,
    page,
    position_bars,
    table,
)
from exporter.web.pages.requests import per_request_section, segments_section

Section = Callable[[Mapping[str, Any], Mapping[str, Any]], str]
Point = tuple[float, float]

# Result keys whose text the per-target table shows as notes, in this order.
_NOTE_KEYS = ("coverage_note", "reset_note", "anomaly_note", "dialect_note")


def acceptance_lines(series: Mapping[str, Any]) -> tuple[dict[str, list[Point]], list[Point]]:
    """Cumulative acceptance rate (%) per target, and of the summed counts (never an average of
    ratios), each target interpolated between its samples (their latest would draw our phase)."""
    lines: dict[str, list[Point]] = {}
    cumulative: list[list[tuple[float, float, float]]] = []
    for name, points in (series.get("targets") or {}).items():
        samples: dict[float, tuple[float, float]] = {}  # one per moment: the last
        for point in points:
            samples[point["at"]] = (point.get("draft_tokens") or 0, point.get("accepted") or 0)
        ordered = sorted(samples.items())
        lines[name] = [(at, 100.0 * a / t) for at, (t, a) in ordered if t > 0]
        if ordered:
            cumulative.append([(at, t, a) for at, (t, a) in ordered])
    return lines, _summed_line(cumulative)


def _summed_line(targets: Sequence[Sequence[tuple[float, float, float]]]) -> list[Point]:
    """100 x summed accepted / summed tokens of piecewise-linear (time, tokens, accepted) samples
    where all are defined: one sweep, as the sum changes slope only at samples."""
    if not targets:
        return []
    first, last = max(s[0][0] for s in targets), min(s[-1][0] for s in targets)
    if first > last:
        return []
    tokens = accepted = slope_t = slope_a = 0.0
    changes: dict[float, tuple[float, float]] = {}
    for samples in targets:
        i = max(0, bisect.bisect_right([at for at, _, _ in samples], first) - 1)
        t0, x0, y0 = samples[i]
        slope = _slopes(samples, i)
        tokens += x0 + slope[0] * (first - t0)
        accepted += y0 + slope[1] * (first - t0)
        slope_t, slope_a = slope_t + slope[0], slope_a + slope[1]
        for j in range(i + 1, len(samples)):
            if samples[j][0] >= last:
                break
            new, old = _slopes(samples, j), _slopes(samples, j - 1)
            dt, da = changes.get(samples[j][0], (0.0, 0.0))
            changes[samples[j][0]] = (dt + new[0] - old[0], da + new[1] - old[1])
    line: list[Point] = []
    at = first
    for moment in sorted({first, last, *changes}):
        tokens += slope_t * (moment - at)
        accepted += slope_a * (moment - at)
        at = moment
        if tokens > 0:
            line.append((moment, 100.0 * accepted / tokens))
        dt, da = changes.get(moment, (0.0, 0.0))
        slope_t, slope_a = slope_t + dt, slope_a + da
    return line


def _slopes(samples: Sequence[tuple[float, float, float]], i: int) -> tuple[float, float]:
    """Tokens' and accepted's growth per second from sample i to the next."""
    if i + 1 >= len(samples):
        return 0.0, 0.0
    (t0, x0, y0), (t1, x1, y1) = samples[i], samples[i + 1]
    return (x1 - x0) / (t1 - t0), (y1 - y0) / (t1 - t0)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def header_section(state: Mapping[str, Any], series: Mapping[str, Any]) -> str:
    started, stopped = state.get("started_at"), state.get("stopped_at")
    end = stopped if stopped is not None else series.get("now")
    rows = [
        ("id", escape(state["id"])),
        ("state", "open" if stopped is None else "stopped"),
        ("started", iso_utc(started) if started is not None else "–"),
        ("stopped", iso_utc(stopped) if stopped is not None else "– (still open)"),
        ("duration", _duration(end - started) if end is not None and started is not None
         else "–"),
        ("targets", escape(", ".join(state.get("targets") or [])) or "none"),
    ]
    name = state.get("name") or state["id"]
    facts = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return (f'<p><a href="/">← all targets and windows</a> · '
            f'<a href="/api/v1/windows/{escape(state["id"])}">JSON</a></p>'
            f"<h1>Window {escape(name)}</h1>"
            f'<div class="scroll"><table>{facts}</table></div>')


def console_section(state: Mapping[str, Any], series: Mapping[str, Any]) -> str:
    """The console blocks as `window stop` prints them: last, folded (the tables say it all)."""
    if not state.get("results"):
        return ""
    return ('<details class="console"><summary>Console text (as <code>window stop</code> '
            f"prints it)</summary><pre>{escape(format_window(state))}</pre></details>")


def _target_row(name: str, result: Mapping[str, Any]) -> str:
    data = result.get("data") or {}
    ok = result.get("status") == "ok"
    notes = [result[k] for k in _NOTE_KEYS if result.get(k)]
    if result.get("coverage") == "partial" and not result.get("coverage_note"):
        notes.insert(0, "partial coverage")
    if result.get("estimate"):
        notes.insert(0, "estimate, not exact counts")
    status = '<span class="up">ok</span>' if ok else '<span class="down">N/A</span>'
    error = "" if ok else f'<div class="err">{escape(result.get("error") or "")}</div>'
    cells = [fmt(data.get("acceptance_rate"), RATE), fmt(data.get("acceptance_length"), LENGTH),
             fmt(data.get("num_drafts"), ""), fmt(data.get("draft_tokens"), ""),
             fmt(data.get("accepted_tokens"), "")]
    numbers = "".join(f'<td class="num">{c}</td>' for c in cells)
    note_html = "".join(f'<div class="note">{escape(str(n))}</div>' for n in notes)
    where = result.get("host_port") or result.get("url") or ""
    return (f'<tr><td class="name">{escape(name)}<br><small>{escape(str(where))}</small></td>'
            f'<td>{status}{error}</td>{numbers}<td class="notes">{note_html or "–"}</td></tr>')


def results_section(state: Mapping[str, Any], series: Mapping[str, Any]) -> str:
    """Per target: status, figures and every note (partial coverage, restarts, caveats)."""
    results: Mapping[str, Any] = state.get("results") or {}
    if not results:
        errors: Mapping[str, str] = state.get("errors") or {}
        scrapes: Mapping[str, int] = state.get("scrapes") or {}
        rows = [f"<tr><td>{escape(t)}</td><td class=\"num\">{scrapes.get(t, 0)}</td>"
                f"<td>{escape(errors.get(t, '')) or '–'}</td></tr>"
                for t in state.get("targets") or []]
        return ("<h2>Targets</h2><p>Results appear here when the window is stopped.</p>"
                + table(["target", "scrapes so far", "last error"], rows))
    rows = [_target_row(name, result) for name, result in results.items()]
    aggregate = state.get("aggregate")
    if aggregate and len(results) >= 2:
        rows.append(_target_row("all (aggregate)", aggregate))
    headers = ["target", "status", '<span class="num">acceptance rate %</span>',
               "acceptance length", "drafts", "draft tokens", "accepted tokens", "notes"]
    return "<h2>Results</h2>" + table(headers, rows)


def unobserved_section(state: Mapping[str, Any], series: Mapping[str, Any]) -> str:
    """Per restart inside the window, the span no scrape saw: what its numbers miss."""
    rows = []
    for name, result in (state.get("results") or {}).items():
        spans = result.get("unobserved")
        # A peer's answer is vetted for what the console reads, not for this: skip the odd.
        for span in spans if isinstance(spans, list) else []:
            if not isinstance(span, Mapping):
                continue
            seconds = span.get("seconds")
            cells = [escape(name), escape(str(span.get("from_iso"))),
                     escape(str(span.get("to_iso"))),
                     fmt(seconds if isinstance(seconds, int | float) else None, ".3f"),
                     escape(str(span.get("restart")))]
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        return ""
    return ("<h2>Unobserved at server restarts</h2><p>What a server counted from our last "
            "scrape before its restart to the restart is not in its numbers (its result is "
            "partial).</p>"
            + table(["target", "from (last scrape)", "to (restart)", "seconds", "restart"],
                    rows))


def positions_section(state: Mapping[str, Any], series: Mapping[str, Any]) -> str:
    results: Mapping[str, Any] = state.get("results") or {}
    entries = list(results.items())
    if state.get("aggregate") and len(results) >= 2:
        entries.append(("all (aggregate)", state["aggregate"]))
    cells = []
    for name, result in entries:
        per_pos = (result.get("data") or {}).get("per_position_acceptance_rates") or {}
        if per_pos:
            cells.append(f"<td>{escape(name)}<br>{position_bars(per_pos)}</td>")
    if not cells:
        return ""
    return ("<h2>Per-position acceptance</h2>"
            f'<div class="scroll"><table><tr>{"".join(cells)}</tr></table></div>')


def chart_section(state: Mapping[str, Any], series: Mapping[str, Any]) -> str:
    lines, aggregate = acceptance_lines(series)
    start = state.get("started_at") or 0.0
    ends = [p[-1][0] for p in lines.values() if p] + [p[0] for p in aggregate[-1:]]
    end = state.get("stopped_at") or (max(ends) if ends else start)
    svg = line_chart(lines, start=start, end=max(end, start + 1e-9),
                     aggregate=aggregate if len(lines) >= 2 else ())
    if not svg:
        return ("<h2>Acceptance through the window</h2><p>No scrape with drafts yet.</p>")
    return ("<h2>Acceptance through the window</h2>"
            "<p><small>Cumulative since the window's start: each point is what the result "
            "would say had the window stopped then.</small></p>" + svg)


def advisor_section(state: Mapping[str, Any], series: Mapping[str, Any]) -> str:
    """The advice of a stopped window (none for an open one)."""
    if state.get("results") is None:
        return ""
    return "<h2>Which k: the speculation advisor</h2>" + advice_sections(state)


# The answer first (results, per position, per request), then how it came about, and the
# console text, which says the same as the tables, last.
SECTIONS: list[Section] = [header_section, results_section, positions_section,
                           per_request_section, segments_section, unobserved_section, chart_section,
                           advisor_section, console_section]


def render_window_page(state: Mapping[str, Any], series: Mapping[str, Any]) -> str:
    """The whole page of one window: its state (GET /api/v1/windows/{id}) and series."""
    body = "\n".join(section(state, series) for section in SECTIONS)
    name = state.get("name") or state["id"]
    return page(f"window {name} · specdec-exporter", body, style=ADVICE_STYLE)
