"""A stopped window's RESULTs (per target and aggregate), its whole stop answer and its
per-scrape series. Pure; the answer's advice is the caller's (`Advisor`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from exporter.core.aisbench import (
    NO_ACTIVITY,
    NO_METRICS,
    NO_USABLE_SPAN,
    Coverage,
    Result,
    Status,
    aggregate,
    fetch_error,
    unobserved_spans,
    unobserved_text,
)
from exporter.core.anomaly import Anomaly, AnomalyTally
from exporter.core.counting import Accumulator
from exporter.core.derive import acceptance_length, acceptance_ratio, has_activity
from exporter.core.dialects import SGLANG_LENGTH, dialect_note, is_estimate
from exporter.core.isotime import iso_utc, with_iso_times
from exporter.core.requestblock import per_request_block
from exporter.core.snapshot import Counts
from exporter.core.window import TargetRef, Window


class Advisor(Protocol):
    """Advice for a stop answer (`analysis.advise`): a RESULT's, and the whole answer's."""

    def result(self, body: Mapping[str, Any]) -> dict[str, Any] | None: ...

    def window(self, answer: Mapping[str, Any],
               made: Mapping[str, dict[str, Any] | None]) -> dict[str, Any]: ...


def target_result(window: Window, name: str) -> Result:
    """The RESULT of one target of a stopped window."""
    ref = window.targets[name]
    acc = window.accumulators.get(name)
    notes = []
    if start_error := window.start_errors.get(name):
        notes.append(fetch_error(ref.url, start_error, "start"))
    if stop_error := window.stop_errors.get(name):
        notes.append(fetch_error(ref.url, stop_error, "stop"))
    if name in window.late_baselines:
        notes.append(window.late_baselines[name])
    base = _described(ref, acc, started=name not in window.start_errors)
    if name in window.removed:
        # The target left the window before its stop: N/A, with what was seen until then.
        until = acc.totals() if acc and acc.scrapes >= 2 and has_activity(acc.totals()) else None
        return Result(Status.NA, **base, error="; ".join([window.removed[name], *notes]),
                      increase_until_removed=until)
    # Why the span the numbers cover starts late or ends early: unusable scrapes at its ends.
    anomalies = [] if acc is None else [
        t for t in map(_anomaly_text, (acc.anomalies_before, acc.anomalies_after)) if t]
    if acc is None or acc.scrapes == 0:
        return _uncounted(base, anomalies, notes, NO_METRICS)
    if is_estimate(acc.dialect):
        # SGLang has no counters: the time-weighted means of its interval gauges, flagged.
        means = acc.gauge_means()
        if acc.scrapes < 2 or SGLANG_LENGTH not in means:
            return Result(Status.NA, **base, error=_no_activity(notes))
        return Result(Status.OK, **base, gauge_means=means, **_coverage(window, acc, notes))
    if not acc.has_series:
        return Result(Status.NA, **base, error=NO_METRICS)
    if acc.scrapes < 2:  # one usable scrape is a baseline with nothing to compare it to
        return _uncounted(base, anomalies, notes, NO_ACTIVITY)
    counts = acc.totals()
    if not has_activity(counts):
        return Result(Status.NA, **base, error=_no_activity(notes))
    return Result(
        Status.OK, **base, increase=counts, per_model=acc.by_model(), by_load=acc.by_load,
        reset_note=_reset_note(window, acc),
        anomaly_note=_anomaly_inside_note(acc.anomalies_inside),
        **_coverage(window, acc, notes + anomalies),
    )


def _described(ref: TargetRef, acc: Accumulator | None, *, started: bool) -> dict[str, Any]:
    """The fields of a target's RESULT known whatever its outcome."""
    named = {"url": ref.url, "target": ref.name, "host_port": ref.host_port}
    if acc is None:
        return named | {"scrapes": 0, "before": None, "after": None}
    return named | {
        "model_names": tuple(acc.model_names),
        "engines": len(acc.engines),
        "dialect": acc.dialect or None,
        "dialect_note": dialect_note(acc.dialect),
        "read": acc.read or None,
        "resets": acc.resets,
        "scrapes": acc.scrapes,
        "first_scrape_at": acc.first_at,
        "last_scrape_at": acc.last_at,
        **_raw_pair(acc, started),
    }


def _raw_pair(acc: Accumulator, started: bool) -> dict[str, Any]:
    """AISBench's before/after: the first and last usable scrape, None (not zeros) if none."""
    if acc.scrapes == 0 or is_estimate(acc.dialect) or not acc.has_series:
        return {"before": None, "after": None}
    before = acc.before or Counts()
    if acc.scrapes >= 2:
        return {"before": before, "after": acc.current()}
    # One usable scrape: the start's, unless the start failed or was not usable.
    if started and not acc.anomalies_before.count:
        return {"before": before, "after": None}
    return {"before": None, "after": before}


def _no_activity(notes: list[str]) -> str:
    return NO_ACTIVITY if not notes else f"{NO_ACTIVITY} ({'; '.join(notes)})"


def _coverage(window: Window, acc: Accumulator, notes: list[str]) -> dict[str, Any]:
    # A restart inside the window is never full (`aisbench.unobserved_span`).
    unobserved = tuple(unobserved_spans(acc.reset_spans, acc.restart_times, window.downtimes))
    if not notes and not acc.resets:
        return {"coverage": Coverage.FULL, "coverage_note": None}
    parts = []
    if notes:
        stopped = window.stopped_at or acc.last_at or window.started_at
        parts.append(
            f"the numbers cover {iso_utc(acc.first_at or 0.0)} to "
            f"{iso_utc(acc.last_at or 0.0)} of the window {iso_utc(window.started_at)} to "
            f"{iso_utc(stopped)}; " + "; ".join(notes))
    if unobserved:
        parts.append(unobserved_text(unobserved))
    elif acc.resets:  # a state saved before the spans were kept: no times to name
        parts.append(f"not counted: what the server counted from our last scrape before each "
                     f"of {acc.resets} restart(s) to the restart")
    return {"coverage": Coverage.PARTIAL, "coverage_note": "partial: " + "; ".join(parts),
            "unobserved": unobserved}


def _reset_note(window: Window, acc: Accumulator) -> str | None:
    if not acc.resets:
        return None
    spans = unobserved_spans(acc.reset_spans, acc.restart_times)
    seconds = f" ({sum(s['seconds'] for s in spans):.3f} s in all: `unobserved`)" if spans else ""
    note = (
        f"server restart seen {acc.resets} time(s) inside the window; missing: what the "
        f"server counted from our last scrape before each restart to the restart{seconds}"
    )
    while_down = [
        (down, up) for down, up in window.downtimes
        if any(prev <= down and seen >= up for prev, seen in acc.reset_spans)
    ]
    if while_down:
        down, up = while_down[-1]
        note += (
            f"; the server restarted while the exporter was down ({iso_utc(down)} to "
            f"{iso_utc(up)}): what it counted between our last scrape and its restart is lost"
        )
    return note


def _what(first: Anomaly) -> str:
    return f"{first.series} was {first.value} at {iso_utc(first.at)}"


def _anomaly_text(tally: AnomalyTally) -> str | None:
    """`<series> was NaN at <time> (scrape not used)`, and how many more scrapes alike."""
    first = tally.first
    if first is None:
        return None
    text = _what(first)
    if first.others:
        text += f" ({first.others} more unusable value(s) in that scrape)"
    if tally.count > 1 and tally.last is not None:
        text += f" (scrape not used, nor {tally.count - 1} more until {iso_utc(tally.last.at)})"
    else:
        text += " (scrape not used)"
    return text


def _uncounted(base: dict[str, Any], anomalies: list[str], notes: list[str],
               reason: str) -> Result:
    """N/A without two usable scrapes: why (unusable scrapes), else the notes or `reason`."""
    if anomalies:
        return Result(Status.NA, **base, error=f"{NO_USABLE_SPAN}: " + "; ".join(notes + anomalies))
    return Result(Status.NA, **base, error="; ".join(notes) or reason)


def _anomaly_inside_note(tally: AnomalyTally) -> str | None:
    first = tally.first
    if first is None:
        return None
    what = _what(first)
    scrapes = "1 scrape" if tally.count == 1 else f"{tally.count} scrapes"
    first_of = "" if tally.count == 1 else "first: "
    return (
        f"{scrapes} inside the span not used: {first_of}{what}; "
        "the next usable values bridge it exactly"
    )


_Made = tuple[tuple[Any, ...], float | None, Result, dict[str, Any], dict[str, Any] | None]


class AnswerParts:
    """A stop answer made target by target, each RESULT (and advice) once its stop scrape is in;
    made again if its inputs (for a partial one, the stop time too) changed since."""

    def __init__(self, window: Window, advisor: Advisor):
        self.window = window
        self.advisor = advisor
        self._made: dict[str, _Made] = {}

    def _inputs(self, name: str) -> tuple[Any, ...]:
        """What `target_result(window, name)` reads, but the stop time."""
        w = self.window
        acc = w.accumulators.get(name)
        return (w.targets[name], acc, acc.feeds if acc is not None else 0, w.removed.get(name),
                w.start_errors.get(name), w.stop_errors.get(name), w.late_baselines.get(name),
                len(w.downtimes))

    def target(self, name: str) -> tuple[Result, dict[str, Any], dict[str, Any] | None]:
        """One target's RESULT, its JSON and its advice; made again only if out of date."""
        inputs = self._inputs(name)
        made = self._made.get(name)
        if made is not None and made[0] == inputs and (
                made[2].coverage is not Coverage.PARTIAL or made[1] == self.window.stopped_at):
            return made[2], made[3], made[4]
        result = target_result(self.window, name)
        body = result.to_json(iso_times=True)
        advice = self.advisor.result(body)
        self._made[name] = (inputs, self.window.stopped_at, result, body, advice)
        return result, body, advice

    def answer(self) -> dict[str, Any]:
        """The whole stop answer, from the RESULTs made so far and the rest."""
        window = self.window
        made = {name: self.target(name) for name in window.targets}
        # ISO 8601 UTC beside each Unix time; only the head is walked, each RESULT adds its own.
        head = with_iso_times(window.summary() | {"stopped_at": window.stopped_at})
        answer: dict[str, Any] = head | {
            "results": {name: m[1] for name, m in made.items()},
            "aggregate": aggregate((name, m[0]) for name, m in made.items()).to_json(
                iso_times=True),
        }
        answer["advice"] = self.advisor.window(answer, {name: m[2] for name, m in made.items()})
        if window.edges is not None:
            answer["edges"] = window.edges
        if (per_request := per_request_block(window.per_request, answer)) is not None:
            answer["per_request"] = per_request
        return answer


def window_series(window: Window) -> dict[str, Any]:
    """Per target, per scrape: cumulative and since-the-previous-scrape ratio and length."""
    targets = {}
    for name, points in window.series.items():
        rows = []
        previous = None
        for at, drafts, draft_tokens, accepted in points:
            counts = Counts(drafts, draft_tokens, accepted)
            row = {"at": at, "drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted,
                   **_ratio_pair("", counts)}
            if previous is not None:
                row |= _ratio_pair("interval_", counts - previous)
            rows.append(row)
            previous = counts
        targets[name] = rows
    return {"id": window.id, "name": window.name, "started_at": window.started_at,
            "stopped_at": window.stopped_at, "targets": targets}


def _ratio_pair(prefix: str, counts: Counts) -> dict[str, Any]:
    return {f"{prefix}acceptance_ratio": acceptance_ratio(counts),
            f"{prefix}acceptance_length": acceptance_length(counts)}
