"""The compare page (`GET /compare?a=ID&b=ID`): per target and overall, A and B with their 95%
intervals, B - A and the verdict, both windows' advice; and the landing page's window picker."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from exporter.analysis.compare import compare_answers
from exporter.analysis.speedup import compare_speed
from exporter.analysis.stats import ASSUMPTION
from exporter.web.pages.advice import STYLE as ADVICE_STYLE
from exporter.web.pages.advice import advice_sections
from exporter.web.pages.html import page, utc

_STYLE = """
.side{display:flex;gap:2em;flex-wrap:wrap}.side>div{flex:1;min-width:min(320px,100%)}
""" + ADVICE_STYLE

FORMATS = {"acceptance_rate": ".2f", "acceptance_length": ".3f"}
NAMES = {"acceptance_rate": "acceptance rate %", "acceptance_length": "acceptance length"}
_VERDICT_CLASS = {"better": "better", "worse": "worse", "no significant difference": "same",
                  "faster": "better", "slower": "worse"}


def estimate_text(e: Mapping[str, Any], spec: str, signed: bool = False,
                  spelled: str = "{}<br><small>[{}, {}]</small>") -> str:
    """An estimate's value, and its interval when it has one (`spelled` joins the three)."""
    spec = ("+" if signed else "") + spec
    if e.get("low") is None:
        return format(e["value"], spec)
    return spelled.format(*(format(e[key], spec) for key in ("value", "low", "high")))


def interval_svg(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """A and B with their intervals on one scale: do the whiskers overlap?"""
    width, height = 180, 30
    values: list[float] = [v for e in (a, b) for v in (e["value"], e.get("low"), e.get("high"))
              if v is not None]
    lo, hi = min(values), max(values)
    span = (hi - lo) or abs(hi) or 1.0
    lo, hi = lo - span * 0.1, hi + span * 0.1

    def x(v: float) -> float:
        return 4 + (v - lo) / (hi - lo) * (width - 8)

    parts = [f'<svg width="{width}" height="{height}" role="img" '
             'aria-label="A and B with 95% intervals">']
    for y, e, colour, name in ((9, a, "#888", "A"), (21, b, "#3b7dd8", "B")):
        if e.get("low") is not None:
            parts.append(f'<line x1="{x(e["low"]):.1f}" y1="{y}" x2="{x(e["high"]):.1f}" '
                         f'y2="{y}" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<circle cx="{x(e["value"]):.1f}" cy="{y}" r="3" fill="{colour}">'
                     f"<title>{name}: {e['value']:.4g}</title></circle>")
    parts.append("</svg>")
    return "".join(parts)


def _entry_table(name: str, entry: Mapping[str, Any]) -> str:
    drafts = ""
    if entry.get("a_drafts") is not None or entry.get("b_drafts") is not None:
        drafts = (f" <small>A: {entry.get('a_drafts') or 0:.0f} drafts, "
                  f"B: {entry.get('b_drafts') or 0:.0f} drafts</small>")
    rows = []
    for row in entry["metrics"]:
        spec = FORMATS.get(row["metric"], ".4f")
        css = _VERDICT_CLASS.get(row["verdict"], "same")
        rows.append(
            f"<tr><td>{escape(NAMES.get(row['metric'], row['metric'].replace('_', ' ')))}</td>"
            f"<td>{estimate_text(row['a'], spec)}</td><td>{estimate_text(row['b'], spec)}</td>"
            f"<td>{interval_svg(row['a'], row['b'])}</td>"
            f"<td>{estimate_text(row['difference'], spec, signed=True)}</td>"
            f'<td class="{css}">{escape(row["verdict"])}</td></tr>'
        )
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in entry.get("notes", []))
    table = ""
    if rows:
        table = ('<div class="scroll"><table><tr><th>metric</th><th>A</th><th>B</th><th>'
                 '<span style="color:#888">● A</span> <span style="color:#3b7dd8">● B</span>'
                 "</th><th>B − A</th>"
                 f"<th>verdict</th></tr>{''.join(rows)}</table></div>")
    return f"<h3>{escape(name)}{drafts}</h3>{table}{notes}"


def segment_tables(segments: Mapping[str, Any]) -> str:
    """Acceptance length segment by segment (the aggregate's): one table per dimension."""
    def cell(e: Mapping[str, Any] | None, signed: bool = False) -> str:
        return "<small>too few requests</small>" if e is None else estimate_text(
            e, ".3f", signed)

    out = []
    for dimension, entries in segments.items():
        rows = "".join(
            f"<tr><td>{escape(str(r['value']))}</td><td>{r['a_requests']} / {r['b_requests']}"
            f"</td><td>{cell(r['a'])}</td><td>{cell(r['b'])}</td><td>"
            f"{interval_svg(r['a'], r['b']) if r['a'] and r['b'] else ''}</td>"
            f"<td>{cell(r['difference'], True)}</td>"
            f'<td class="{_VERDICT_CLASS.get(r["verdict"], "same")}">{escape(r["verdict"])}'
            "</td></tr>" for r in entries)
        out.append(f'<h3>acceptance length by {escape(dimension)}</h3><div class="scroll">'
                   f'<table class="segments"><tr><th>{escape(dimension)}</th><th>requests A / B'
                   "</th><th>A</th><th>B</th><th></th><th>B − A</th><th>verdict</th></tr>"
                   f"{rows}</table></div>")
    return "".join(out)


def ratio_svg(up: Mapping[str, Any]) -> str:
    """A speed-up and its interval on a log scale from 1/4 to 4, with the line at 1."""
    width, height = 180, 18

    def x(v: float) -> float:
        return 4 + (min(max(math.log(v, 4), -1.0), 1.0) + 1) / 2 * (width - 8)

    parts = [f'<svg class="ratio" width="{width}" height="{height}" role="img" '
             'aria-label="speed-up with its 95% interval; the line is 1 (no change)">',
             f'<line x1="{x(1):.1f}" y1="0" x2="{x(1):.1f}" y2="{height}" stroke="#bbb"/>']
    if up.get("low") is not None:
        parts.append(f'<line x1="{x(up["low"]):.1f}" y1="9" x2="{x(up["high"]):.1f}" y2="9" '
                     'stroke="#3b7dd8" stroke-width="2"/>')
    parts.append(f'<circle cx="{x(up["value"]):.1f}" cy="9" r="3" fill="#3b7dd8">'
                 f"<title>{up['value']:.3f}x</title></circle></svg>")
    return "".join(parts)


def _speed_table(name: str, entry: Mapping[str, Any]) -> str:
    head = (f"<h3>{escape(name)} <small>timed answers A: {entry['a_timed']}, B: "
            f"{entry['b_timed']}</small></h3>")
    if not entry["rows"]:
        return f'{head}<p class="note">{escape(entry["note"])}</p>'
    rows = "".join(
        f"<tr><td>{escape(row['figure'])} {row['stat']}</td><td>{row['a']:.4g}</td>"
        f"<td>{row['b']:.4g}</td><td>{estimate_text(row['speedup'], '.3f')}</td>"
        f"<td>{ratio_svg(row['speedup'])}</td>"
        f'<td class="{_VERDICT_CLASS.get(row["verdict"], "same")}">{escape(row["verdict"])}'
        "</td></tr>" for row in entry["rows"])
    return (f'{head}<div class="scroll"><table><tr><th>figure</th><th>A</th><th>B</th>'
            "<th>speed-up B over A</th><th>¼ · 1 · 4</th><th>verdict</th>"
            f"</tr>{rows}</table></div>")


def speed_section(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """The paired speed-up of B (with speculative decoding) over A (without); empty when
    neither window timed its requests."""
    speed = compare_speed(a, b)
    if speed is None:
        return ""
    tables = [_speed_table(name, entry) for name, entry in speed["targets"].items()]
    if speed["aggregate"] is not None and len(speed["targets"]) != 1:
        tables.append(_speed_table("all targets", speed["aggregate"]))
    tables += [_speed_table(f"{dimension} {value}", entry)
               for dimension, values in speed["by"].items() for value, entry in values.items()]
    missing = "".join(f'<p class="note">No timings in {side}.</p>' for side in speed["missing"])
    return (f'<section id="speedup"><h2>Paired speed-up</h2><p><small>A without speculative '
            f"decoding, B with it; above 1 is B faster. {escape(speed['method'])}; per "
            "concurrency band and tag where both windows have it; the --fail-if-slower gate "
            f"reads the targets and overall only.</small></p>{''.join(tables)}{missing}</section>")


def _window_head(side: str, answer: Mapping[str, Any]) -> str:
    wid = str(answer.get("id", ""))
    return (f'<div><h2>{side}: <a href="/windows/{escape(wid, quote=True)}">{escape(wid)}</a>'
            f"</h2><p>{escape(str(answer.get('name') or ''))}<br><small>"
            f"{utc(answer.get('started_at'))} to {utc(answer.get('stopped_at'))}"
            "</small></p></div>")


def _advice_column(side: str, answer: Mapping[str, Any]) -> str:
    return f"<div><h2>{side}: which k</h2>{advice_sections(answer)}</div>"


def render_compare(a: Mapping[str, Any], b: Mapping[str, Any],
                   windows: Sequence[Mapping[str, Any]] = ()) -> str:
    """The whole compare page of two stopped windows' answers."""
    body = compare_answers(a, b)
    sections = [_entry_table(name, entry) for name, entry in body["targets"].items()]
    if body["aggregate"] is not None and len(body["targets"]) != 1:
        sections.append(_entry_table("all targets", body["aggregate"]))
    if not sections:
        sections.append("<p>No target has results in both windows.</p>")
    only = "".join(
        f"<p>Only in {side}: {escape(', '.join(body[key]))}</p>"
        for side, key in (("A", "only_in_a"), ("B", "only_in_b")) if body[key]
    )
    title = f"compare {a.get('id')} vs {b.get('id')} · specdec-exporter"
    body_html = f"""<p><a href="/">specdec-exporter</a></p>
<h1>Is B better than A?</h1>
<div class="side">{_window_head("A", a)}{_window_head("B", b)}</div>
{compare_form(windows, a.get("id"), b.get("id"))}
<p><small>{escape(ASSUMPTION)}. Better and worse mean the 95% interval of B − A excludes 0.
</small></p>
{''.join(sections)}
{segment_tables(body["segments"])}
{only}
{speed_section(a, b)}
<div class="side">{_advice_column("A", a)}{_advice_column("B", b)}</div>"""
    return page(title, body_html, style=_STYLE)


def compare_form(windows: Sequence[Mapping[str, Any]], a: str | None = None,
                 b: str | None = None) -> str:
    """A small GET form to pick two stopped windows (newest first); empty with fewer than 2."""
    stopped = [w for w in windows if w.get("stopped_at") is not None]
    if len(stopped) < 2:
        return ""
    a = a or stopped[1]["id"]
    b = b or stopped[0]["id"]

    def options(chosen: str) -> str:
        return "".join(
            f'<option value="{escape(str(w["id"]), quote=True)}"'
            f'{" selected" if w["id"] == chosen else ""}>{escape(str(w["id"]))}'
            f"{' – ' + escape(str(w['name'])) if w.get('name') and w['name'] != w['id'] else ''}"
            "</option>"
            for w in stopped
        )

    return (f'<form action="/compare" method="get">Compare A <select name="a">{options(a)}'
            f'</select> with B <select name="b">{options(b)}</select> '
            '<button type="submit">compare</button></form>')


def render_picker(windows: Sequence[Mapping[str, Any]]) -> str:
    """`/compare` without a and b: the form alone."""
    form = compare_form(windows) or "<p>Compare needs two stopped windows.</p>"
    body_html = f'<p><a href="/">specdec-exporter</a></p><h1>Compare two windows</h1>{form}'
    return page("compare windows · specdec-exporter", body_html, style=_STYLE)
