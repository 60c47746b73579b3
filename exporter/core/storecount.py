"""A window from a Prometheus store's raw samples: each scrape the store took of one server
(its series share one timestamp) is rebuilt as the page it read and fed to that server's own
`counting.Accumulator` as a live scrape is, so the result follows the same rules and has the
same shape. A group of servers (`--by job`) is the exact sum of its servers' results.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from exporter.core.aisbench import MAX_COUNT, Result, aggregate
from exporter.core.counting import Accumulator
from exporter.core.dialects import DIALECTS, Dialect
from exporter.core.errors import ExporterError
from exporter.core.isotime import iso_utc, with_iso_times
from exporter.core.parse import parse_page
from exporter.core.redact import redact_url
from exporter.core.stopanswer import target_result
from exporter.core.window import TargetRef, Window, new_window_id

# A gap is a stretch between two consecutive samples longer than this many scrape intervals.
GAP_INTERVALS = 2.0


class CountError(ExporterError):
    """A store's samples add up to a count no float holds exactly (over 2^53)."""


@dataclass(frozen=True)
class RawSeries:
    """One series as the store holds it: its labels (with `__name__`) and its samples."""

    labels: Mapping[str, str]
    samples: Sequence[tuple[float, float]]  # (Unix seconds, value), in time order


def family_names() -> list[str]:
    """Every spec-decode metric name of every dialect, as the store names it."""
    return sorted({name.decode() for spec in DIALECTS.values() for name in spec.names})


def _group_name(labels: Mapping[str, str], by: Sequence[str], sep: str = ",") -> str:
    return sep.join(labels.get(label, "") for label in by or ("instance",))


def group_targets(series: Iterable[RawSeries], by: Sequence[str],
                  sep: str = ",") -> dict[str, list[RawSeries]]:
    """Series per target (named by its `by` labels' values, `instance` by default), in order."""
    groups: dict[str, list[RawSeries]] = {}
    for one in series:
        groups.setdefault(_group_name(one.labels, by, sep), []).append(one)
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


def _late_note(times: Sequence[float], interval: float | None, frm: float) -> str | None:
    """What to say of a server whose first sample comes well after the range's start."""
    if not times or interval is None or times[0] - frm <= GAP_INTERVALS * interval:
        return None
    return (f"its first sample in the store is at {iso_utc(times[0])}, after the range's "
            f"start ({iso_utc(frm)}): counted from it, as a target that appears mid-window")


def _count_group(window: Window, group: str, members: Sequence[RawSeries], frm: float,
                 to: float) -> dict[str, dict[str, Any]]:
    """Each server of `group` as a target of `window`; their coverage, by target name."""
    # Each server Prometheus scraped (its job and instance) counted on its own: one scrape of
    # it, one timestamp; two servers' scrapes are never one page.
    split = group_targets(members, ("job", "instance"), "/")
    covered: dict[str, dict[str, Any]] = {}
    for key, part in split.items():
        name = group if len(split) == 1 else f"{group} [{key}]"
        window.targets[name] = TargetRef(name, name, name)
        acc, times = account(part)
        window.accumulators[name] = acc
        covered[name] = coverage(times, frm, to)
        if late := _late_note(times, covered[name]["interval"], frm):
            window.late_baselines[name] = late  # in its RESULT's coverage note
            if len(split) > 1:  # the group's note is its servers' coverage notes
                covered[name]["note"] += "; " + late
    return covered


def _group_result(window: Window, group: str, names: Sequence[str]) -> Result:
    """One RESULT for `group`: its one server's, or the exact sum of its servers'."""
    if names == [group]:
        return target_result(window, group)
    parts = [(name, target_result(window, name)) for name in names]
    summed = aggregate(parts)
    return replace(
        summed, url=group, target=group, host_port=group, targets=None,
        error=summed.error if not summed.ok else None,
        dialect=next((r.dialect for _, r in parts if r.dialect), None),
        scrapes=sum(r.scrapes or 0 for _, r in parts),
        first_scrape_at=min((r.first_scrape_at for _, r in parts if r.first_scrape_at),
                            default=None),
        last_scrape_at=max((r.last_scrape_at for _, r in parts if r.last_scrape_at),
                           default=None))


def _group_coverage(covered: Mapping[str, dict[str, Any]], frm: float,
                    to: float) -> dict[str, Any]:
    """What a group's servers' samples cover: each server's, and their ends together."""
    if len(covered) == 1:
        return next(iter(covered.values()))
    firsts = [c["first_sample"] for c in covered.values() if c["first_sample"] is not None]
    lasts = [c["last_sample"] for c in covered.values() if c["last_sample"] is not None]
    out = coverage(sorted({*firsts, *lasts}), frm, to) | {"interval": None, "gaps": []}
    out["note"] = "; ".join(f"{name}: {c['note']}" for name, c in covered.items())
    return out | {"servers": dict(covered)}


def history_answer(series: Iterable[RawSeries], frm: float, to: float, *, query_url: str,
                   by: Sequence[str] = (), name: str = "history",
                   window_id: str | None = None, notes: Sequence[str] = (),
                   scraped: Iterable[Mapping[str, str]] = ()) -> dict[str, Any]:
    """The stop answer of a window over [frm, to] made from the store's raw samples; a group
    in `scraped` (a server the store scrapes) without spec-decode series is N/A, as live."""
    window = Window(id=window_id or new_window_id(frm), name=name, targets={}, labels={},
                    started_at=frm, stopped_at=to)
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for group, members in group_targets(series, by).items():
        groups[group] = _count_group(window, group, members, frm, to)
    for labels in scraped:
        group = _group_name(labels, by)
        if group not in groups:
            window.targets[group] = TargetRef(group, group, group)
            groups[group] = {group: coverage([], frm, to)}
    results: dict[str, Result] = {}
    bodies: dict[str, dict[str, Any]] = {}
    for group in sorted(groups):
        results[group] = _group_result(window, group, list(groups[group]))
        body = bodies[group] = results[group].to_json(iso_times=True)
        _check_counts(f"store {redact_url(query_url)}: target {group}", body.get("increase"))
        body["history"] = _group_coverage(groups[group], frm, to)
        body["coverage_note"] = "; ".join(
            n for n in (body.get("coverage_note"), body["history"]["note"]) if n)
    head: dict[str, Any] = with_iso_times(window.summary() | {"targets": list(bodies),
                                                                "stopped_at": to})
    return head | {
        "results": bodies,
        "aggregate": aggregate(results.items()).to_json(iso_times=True),
        "source": "prometheus", "query": redact_url(query_url),
        "store_notes": list(notes),  # what the store did that the reader should know
    }


def _check_counts(whose: str, increase: Any, where: str = "increase") -> None:
    """Each count within 2^53, where a float stops being exact (the peer vetting's rule)."""
    if isinstance(increase, Mapping):
        for key, value in increase.items():
            _check_counts(whose, value, f"{where}.{key}")
    elif isinstance(increase, int | float) and not increase <= MAX_COUNT:
        raise CountError(f"{whose}: {where} adds up to {increase:.6g}, over 2^53: "
                         "the store's samples are not counters a server could have counted")
