"""A window from a Prometheus store's raw samples: each scrape the store took (its series share
one timestamp) is rebuilt as the page it read and fed to a `counting.Accumulator` as a live
scrape is, so the result follows the same rules and has the same shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.core.counting import Accumulator
from exporter.core.dialects import DIALECTS, Dialect
from exporter.core.isotime import iso_utc
from exporter.core.parse import parse_page
from exporter.core.redact import redact_url
from exporter.core.results import window_answer
from exporter.core.window import TargetRef, Window, new_window_id

# A gap is a stretch between two consecutive samples longer than this many scrape intervals.
GAP_INTERVALS = 2.0
SOURCE = "prometheus"


@dataclass(frozen=True)
class RawSeries:
    """One series as the store holds it: its labels (with `__name__`) and its samples."""

    labels: Mapping[str, str]
    samples: Sequence[tuple[float, float]]  # (Unix seconds, value), in time order


def family_names() -> list[str]:
    """Every spec-decode metric name of every dialect, as the store names it."""
    names: set[str] = set()
    for spec in DIALECTS.values():
        names.update(name.decode() for name in spec.names)
    return sorted(names)


def group_targets(series: Iterable[RawSeries], by: Sequence[str]) -> dict[str, list[RawSeries]]:
    """Series per target (named by its `by` labels' values, `instance` by default), in order."""
    groups: dict[str, list[RawSeries]] = {}
    for one in series:
        name = ",".join(one.labels.get(label, "") for label in by or ("instance",))
        groups.setdefault(name, []).append(one)
    return dict(sorted(groups.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _line(labels: Mapping[str, str], value: float) -> str:
    pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())
                     if k != "__name__")
    text = "NaN" if math.isnan(value) else repr(value).replace("inf", "Inf")
    return f"{labels['__name__']}{{{pairs}}} {text}\n"


def coverage(times: Sequence[float], frm: float, to: float) -> dict[str, Any]:
    """What one target's samples cover of [frm, to]: ends, interval seen, gaps, and a note."""
    if not times:
        return {"first_sample": None, "last_sample": None, "interval": None, "gaps": [],
                "note": f"no sample between {iso_utc(frm)} and {iso_utc(to)}"}
    steps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
    interval = steps[len(steps) // 2] if steps else None
    gaps = [[a, b] for a, b in zip(times, times[1:], strict=False)
            if interval is not None and b - a > GAP_INTERVALS * interval]
    note = (f"counts cover the samples from {iso_utc(times[0])} to {iso_utc(times[-1])}; "
            f"activity between {iso_utc(frm)} and the first sample, and between the last "
            f"sample and {iso_utc(to)}, is not in them")
    if gaps:
        note += f"; {len(gaps)} gap(s) longer than {GAP_INTERVALS:g} scrape intervals"
    return {"first_sample": times[0], "first_sample_iso": iso_utc(times[0]),
            "last_sample": times[-1], "last_sample_iso": iso_utc(times[-1]),
            "interval": interval, "gaps": gaps, "note": note}


def account(series: Sequence[RawSeries]) -> tuple[Accumulator, list[float]]:
    """One target's accumulator fed with every page the store read, and those pages' times."""
    lines: dict[float, list[str]] = {}
    for one in series:
        for at, value in one.samples:
            lines.setdefault(at, []).append(_line(one.labels, value))
    acc = Accumulator()
    times = sorted(lines)
    for at in times:
        acc.feed(parse_page("".join(lines[at]).encode(), Dialect.AUTO), at)
    return acc, times


def history_answer(series: Iterable[RawSeries], frm: float, to: float, *, query_url: str,
                   by: Sequence[str] = (), name: str = "history",
                   window_id: str | None = None, notes: Sequence[str] = ()) -> dict[str, Any]:
    """The stop answer of a window over [frm, to] made from the store's raw samples."""
    window = Window(id=window_id or new_window_id(frm), name=name, targets={}, labels={},
                    started_at=frm, stopped_at=to)
    covered: dict[str, dict[str, Any]] = {}
    for target, members in group_targets(series, by).items():
        window.targets[target] = TargetRef(target, target, target)
        acc, times = account(members)
        window.accumulators[target] = acc
        covered[target] = coverage(times, frm, to)
    answer = window_answer(window)
    for target, result in answer["results"].items():
        result["history"] = covered[target]
        result["coverage_note"] = "; ".join(
            n for n in (result.get("coverage_note"), covered[target]["note"]) if n)
    answer["source"] = SOURCE
    answer["query"] = redact_url(query_url)
    answer["store_notes"] = list(notes)  # what the store did that the reader should know
    return answer
