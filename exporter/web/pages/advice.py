"""HTML of a window's advice: the distribution of accepted tokens per draft as bars, the
advisor table. Plain server-rendered HTML with inline SVG, for the window and compare pages."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from exporter.analysis.advise import window_advice

STYLE = """
.advice td,.advice th{text-align:right}.advice td:first-child{text-align:left}
.est{color:#777;font-style:italic}.best{font-weight:bold;background:#eef6ee}
.better{color:#070;font-weight:bold}.worse{color:#b00;font-weight:bold}.same{color:#555}
.note{color:#a60}
"""


def distribution_bars(probabilities: Mapping[str, float], width: int = 260,
                      height: int = 80) -> str:
    """Inline SVG bars of P(X = j), j = 0..k: how many tokens a draft gets accepted."""
    if not probabilities:
        return ""
    items = sorted(probabilities.items(), key=lambda kv: int(kv[0]))
    top = max(max(p for _, p in items), 1e-9)
    bar = width / len(items)
    parts = [f'<svg width="{width}" height="{height + 28}" role="img" '
             'aria-label="distribution of accepted tokens per draft">']
    for i, (j, p) in enumerate(items):
        p = max(0.0, min(1.0, p))
        h = p / top * height
        x = i * bar
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{height - h + 12:.1f}" width="{max(bar - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="#3b7dd8"><title>P(X = {escape(j)}) = {p:.4f}</title></rect>'
            f'<text x="{x + bar / 2:.1f}" y="{height - h + 10:.1f}" font-size="9" '
            f'text-anchor="middle">{p:.2f}</text>'
            f'<text x="{x + bar / 2:.1f}" y="{height + 24}" font-size="10" '
            f'text-anchor="middle">{escape(j)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def advice_table(advice: Mapping[str, Any]) -> str:
    """The advisor table: k', L(k'), S(k') per draft cost, best per cost in bold."""
    costs = list(advice["best"])
    head = "".join(f"<th>S, c={escape(c)}</th>" for c in costs)
    rows = []
    for row in advice["rows"]:
        cells = []
        for c in costs:
            best = advice["best"][c]["k"] == row["k"]
            cells.append(f'<td{" class=best" if best else ""}>{row["speedup"][c]:.3f}</td>')
        label = f"{row['k']}*" if row["estimate"] else str(row["k"])
        css = ' class="est"' if row["estimate"] else ""
        rows.append(f"<tr{css}><td>{label}</td><td>{row['length']:.3f}</td>{''.join(cells)}"
                    "</tr>")
    best = "; ".join(
        f"c={escape(c)}: k'={'0 (no speculation)' if b['k'] == 0 else b['k']}"
        f"{'*' if b['estimate'] else ''} (S={b['speedup']:.3f})"
        for c, b in advice["best"].items()
    )
    ratio = advice.get("tail_ratio")
    ratio_text = "none" if ratio is None else f"{ratio:.4f}"
    return (
        f'<div class="scroll"><table class="advice"><tr><th>k\'</th><th>tokens per step L</th>'
        f"{head}</tr>{''.join(rows)}</table></div>"
        f"<p>Best k': {best}.<br><small>* estimate: rates past the measured k = "
        f"{advice['k']} come from a geometric fit of the measured ones (ratio {ratio_text}). "
        "S = L / (1 + c k') is the speed-up over no speculation, with c the cost of drafting "
        "one token relative to one target forward pass.</small></p>"
    )


def advice_section(name: str, advice: Mapping[str, Any] | None) -> str:
    """One target's (or the aggregate's) distribution bars and advisor table."""
    title = f"<h3>{escape(name)}</h3>"
    if advice is None or advice.get("error"):
        reason = (advice or {}).get("error") or "no per-position rates: nothing to advise"
        return f"{title}<p>{escape(reason)}</p>"
    dist = advice["distribution"]
    note = f'<p class="note">{escape(dist["note"])}</p>' if not advice["monotone"] else ""
    return (
        f"{title}{note}<p>Accepted tokens per draft X (mean {dist['mean']:.3f}, variance "
        f"{dist['variance']:.3f}):</p>{distribution_bars(dist['probabilities'])}"
        f"{advice_table(advice)}"
    )


def advice_sections(answer: Mapping[str, Any]) -> str:
    """A stopped window's advice: each target's section, then the aggregate's for several."""
    # Windows stopped before answers carried advice get it computed here.
    advice = answer.get("advice") or window_advice(answer)
    results = advice.get("results") or {}
    parts = [advice_section(name, item) for name, item in results.items()]
    if len(results) >= 2:
        parts.append(advice_section("all", advice.get("aggregate")))
    return "".join(parts)
