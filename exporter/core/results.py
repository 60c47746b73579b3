"""A stopped window's RESULTs: per target and aggregate, in AISBench's format plus our extras.

Pure: no I/O, no aiohttp, no pydantic, so the stdlib-only client merges shards' answers with
the same `aggregate` the exporter uses.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from exporter.core.anomaly import AnomalyTally
from exporter.core.counting import Accumulator
from exporter.analysis.advise import result_advice, window_advice
from exporter.core.derive import acceptance_length, acceptance_ratio, has_activity, result_data
from exporter.core.dialects import SGLANG_LENGTH, SGLANG_RATE, dialect_note, is_estimate
from exporter.core.isotime import iso_utc, with_iso_times
from exporter.core.snapshot import Counts, integral, sum_counts
from exporter.core.window import TargetRef, Window

NO_METRICS = "No spec decode metrics found on server"
NO_ACTIVITY = "No spec decode activity detected during benchmark window"
NO_USABLE_SPAN = "No span of the window with every spec decode counter usable"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
PER_POSITION_NOTE = (
    "position i is over the drafts of the targets that draft position i (those with a series "
    "for it): per_position_drafts"
)


class Status(StrEnum):
    """A RESULT's `status`, as AISBench writes it."""

    OK = "ok"
    NA = "na"


class Coverage(StrEnum):
    """Whether the numbers cover the whole window or only a span of it."""

    FULL = "full"
    PARTIAL = "partial"


def result_file_name(label: str, suffix: str = "") -> str:
    """`spec_decode_` + the label with every character outside [A-Za-z0-9._-] made `_`.

    As AISBench names its files: `10.0.0.1:8080` -> `spec_decode_10.0.0.1_8080.json`,
    `[::1]:8080` -> `spec_decode____1__8080.json`. A `suffix` is added after `__`; one over
    64 characters is cut to 55 and `-<crc32 of it>` (a file name has 255 bytes at most).
    """
    safe = _UNSAFE.sub("_", suffix)
    if len(safe) > 64:
        safe = f"{safe[:55]}-{zlib.crc32(suffix.encode()):08x}"
    return f"spec_decode_{_UNSAFE.sub('_', label)}{'__' + safe if safe else ''}.json"


def result_file_names(results: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Each target's file name: AISBench's when unique, else with the target name as suffix.

    Two targets on one host:port (different paths) would write the same file; then each of
    them is `spec_decode_<label>__<target name>.json` (names that still collide once made
    safe also get `-<crc32 of the name>`), so none overwrites another.
    """
    plain = {t: result_file_name(str(r.get("host_port") or t)) for t, r in results.items()}
    counts = Counter(plain.values())
    named = {
        t: result_file_name(str(results[t].get("host_port") or t), t) if counts[n] > 1 else n
        for t, n in plain.items()
    }
    again = Counter(named.values())
    return {
        t: n[: -len(".json")] + f"-{zlib.crc32(t.encode()):08x}.json" if again[n] > 1 else n
        for t, n in named.items()
    }


def fetch_error(url: str, reason: str, when: str) -> str:
    """AISBench's fetch error, saying whether it was the window's start or its stop."""
    return f"Failed to fetch metrics from {url} at window {when}: {reason}"


@dataclass(frozen=True)
class Result:
    """One RESULT (a target's, or the aggregate when `url` is None and `targets` is set).

    `data` is derived from `increase` (or from `gauge_means` for an estimate); `to_json` is
    the file and API form, `from_json` reads it back (a shard's answer, an older file).
    """

    status: Status
    url: str | None
    error: str | None = None
    increase: Counts | None = None
    before: Counts | None = None
    after: Counts | None = None
    per_model: Mapping[str, Counts] = field(default_factory=dict)
    gauge_means: Mapping[str, float] | None = None  # set: an estimate from interval gauges
    coverage: Coverage | None = None
    coverage_note: str | None = None
    reset_note: str | None = None
    anomaly_note: str | None = None
    target: str | None = None
    host_port: str | None = None
    targets: tuple[str, ...] | None = None  # the aggregate's summed targets
    model_names: tuple[str, ...] = ()
    engines: int = 0
    dialect: str | None = None
    dialect_note: str | None = None
    resets: int = 0
    scrapes: int | None = None
    first_scrape_at: float | None = None
    last_scrape_at: float | None = None
    increase_until_removed: Counts | None = None

    @property
    def ok(self) -> bool:
        """Numbers to report."""
        return self.status is Status.OK

    @property
    def summable(self) -> bool:
        """Exact counts an aggregate can add (an estimate's gauge means cannot be)."""
        return self.ok and self.increase is not None and self.gauge_means is None

    def data(self) -> dict[str, Any] | None:
        """AISBench's `data`: full precision, rounded only where displayed."""
        if not self.ok:
            return None
        if self.gauge_means is not None:
            means = self.gauge_means
            return {
                "num_drafts": None, "draft_tokens": None, "accepted_tokens": None,
                "acceptance_rate": 100 * means[SGLANG_RATE] if SGLANG_RATE in means else None,
                "acceptance_length": means.get(SGLANG_LENGTH),
                "per_position_acceptance_rates": {},
            }
        return result_data(self.increase or Counts())

    def to_json(self, *, iso_times: bool = False) -> dict[str, Any]:
        """The RESULT as the API answers it and the file holds it: AISBench's keys first.

        `iso_times`: each `..._at` time with its `..._at_iso` beside it, as in a stop answer.
        """
        # Keys set one by one, in the order of the file format (merging small dicts into it
        # cost a fifth of this, run for each of 1000 targets at a stop).
        counted = self.ok and self.increase is not None
        body: dict[str, Any] = {
            "status": self.status.value,
            "url": self.url,
            "error": self.error,
            "data": self.data(),
            "raw": {"before": _raw(self.before), "after": _raw(self.after)},
        }
        if counted:
            body["increase"] = _raw(self.increase)
        if self.targets is not None:
            body["targets"] = list(self.targets)
        else:
            body["target"] = self.target
            body["host_port"] = self.host_port
        body["model_names"] = list(self.model_names)
        body["engines"] = self.engines
        if self.targets is None:
            body["dialect"] = self.dialect
            body["scrapes"] = self.scrapes
            # With `iso_times`, where `with_iso_times` would put them, without walking the
            # whole answer after it (a fifth of a second over 1000 results).
            body["first_scrape_at"] = self.first_scrape_at
            if iso_times:
                body["first_scrape_at_iso"] = _iso(self.first_scrape_at)
            body["last_scrape_at"] = self.last_scrape_at
            if iso_times:
                body["last_scrape_at_iso"] = _iso(self.last_scrape_at)
        body["resets"] = self.resets
        if self.dialect_note is not None:
            body["dialect_note"] = self.dialect_note
        if self.reset_note is not None:
            body["reset_note"] = self.reset_note
        if self.anomaly_note is not None:
            body["anomaly_note"] = self.anomaly_note
        if self.increase_until_removed is not None:
            body["increase_until_removed"] = self.increase_until_removed.as_raw()
        if self.gauge_means is not None:
            body["estimate"] = True
            body["gauge_means"] = dict(self.gauge_means)
        if self.coverage is not None:
            body["coverage"] = self.coverage.value
            body["coverage_note"] = self.coverage_note
        if counted:
            body["per_model"] = {
                model: self._model_part(counts, body)
                for model, counts in sorted(self.per_model.items()) if has_activity(counts)
            }
            if self.targets is not None:
                increase = self.increase or Counts()
                body["per_position_drafts"] = {
                    str(p): integral(increase.drafts_at(p)) for p in sorted(increase.per_position)
                }
                body["per_position_note"] = PER_POSITION_NOTE
        return body

    def _model_part(self, counts: Counts, body: Mapping[str, Any]) -> dict[str, Any]:
        """One model's `data` and `increase`; the target's own, copied, when it serves one
        model only (the usual case: the same numbers, not computed twice)."""
        if (counts is self.increase or counts == self.increase) and self.gauge_means is None:
            data: dict[str, Any] = body["data"]
            return data | {
                "per_position_acceptance_rates": dict(data["per_position_acceptance_rates"]),
                "increase": _copy_raw(body["increase"]),
            }
        return result_data(counts) | {"increase": counts.as_raw()}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Result:
        """Read a RESULT back (a shard's answer); keys it lacks keep their defaults."""
        raw = body.get("raw") or {}
        per_model = {
            model: Counts.from_raw(entry["increase"])
            for model, entry in (body.get("per_model") or {}).items()
            if isinstance(entry, Mapping) and entry.get("increase")
        }
        coverage = body.get("coverage")
        return cls(
            status=Status(body.get("status", Status.NA)),
            url=body.get("url"),
            error=body.get("error"),
            increase=_counts(body.get("increase")),
            before=_counts(raw.get("before")),
            after=_counts(raw.get("after")),
            per_model=per_model,
            gauge_means=body.get("gauge_means") if body.get("estimate") else None,
            coverage=Coverage(coverage) if coverage else None,
            coverage_note=body.get("coverage_note"),
            reset_note=body.get("reset_note"),
            anomaly_note=body.get("anomaly_note"),
            target=body.get("target"),
            host_port=body.get("host_port"),
            targets=tuple(body["targets"]) if "targets" in body else None,
            model_names=tuple(body.get("model_names") or ()),
            engines=body.get("engines") or 0,
            dialect=body.get("dialect"),
            dialect_note=body.get("dialect_note"),
            resets=body.get("resets") or 0,
            scrapes=body.get("scrapes"),
            first_scrape_at=body.get("first_scrape_at"),
            last_scrape_at=body.get("last_scrape_at"),
            increase_until_removed=_counts(body.get("increase_until_removed")),
        )


def _copy_raw(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}


def _iso(at: float | None) -> str | None:
    return iso_utc(at) if at is not None else None


def _raw(counts: Counts | None) -> dict[str, Any] | None:
    return counts.as_raw() if counts is not None else None


def _counts(raw: object) -> Counts | None:
    return Counts.from_raw(raw) if isinstance(raw, Mapping) else None


_NONE = Counts()  # what a RESULT without counts adds


def aggregate(results: Iterable[tuple[str, Result]]) -> Result:
    """All targets with exact counts summed, then divided (never an average of ratios).

    The one aggregate: the exporter's stop answer and the client's merge of shards' answers
    both use it. Estimates (SGLang's gauge means) cannot be summed with counts: they stay out.
    """
    used = [(name, r) for name, r in results if r.summable]
    total = sum_counts(r.increase or _NONE for _, r in used)
    before = sum_counts(r.before or _NONE for _, r in used)
    after = sum_counts(r.after or _NONE for _, r in used)
    models: dict[str, list[Counts]] = {}
    for _, result in used:
        for model, counts in result.per_model.items():
            models.setdefault(model, []).append(counts)
    per_model = {model: sum_counts(parts) for model, parts in models.items()}
    partial = [name for name, r in used if r.coverage is Coverage.PARTIAL]
    base = Result(
        status=Status.NA, url=None, error=NO_ACTIVITY,
        targets=tuple(name for name, _ in used),
        resets=sum(r.resets for _, r in used),
        engines=sum(r.engines for _, r in used),
        model_names=tuple(sorted({m for _, r in used for m in r.model_names} | set(per_model))),
    )
    if not used or not has_activity(total):
        return base
    return replace(
        base, status=Status.OK, error=None, increase=total, before=before, after=after,
        per_model=per_model,
        coverage=Coverage.PARTIAL if partial else Coverage.FULL,
        coverage_note=(
            f"partial: includes targets whose numbers cover part of the window: "
            f"{', '.join(partial)}" if partial else None
        ),
    )


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
    # Everything known of the target, which each outcome below completes; the Result is made
    # once, with all its fields (a stop over 1000 targets makes 1000 of them).
    base = _described(ref, acc, started=name not in window.start_errors)
    if name in window.removed:
        # The target left the window before its stop: N/A, with what was seen until then.
        until = acc.totals() if acc and acc.scrapes >= 2 and has_activity(acc.totals()) else None
        return Result(Status.NA, **base, error="; ".join([window.removed[name], *notes]),
                      increase_until_removed=until)
    anomalies = _anomaly_texts(acc)
    if acc is None or acc.scrapes == 0:
        if anomalies:
            return Result(Status.NA, **base, error=_no_usable_span(anomalies, notes))
        return Result(Status.NA, **base, error="; ".join(notes) or NO_METRICS)
    if is_estimate(acc.dialect):
        return _estimate_result(window, acc, base, notes)
    if not acc.has_series:
        return Result(Status.NA, **base, error=NO_METRICS)
    if acc.scrapes < 2:
        # One usable scrape is a baseline with nothing to compare it to.
        if anomalies:
            return Result(Status.NA, **base, error=_no_usable_span(anomalies, notes))
        return Result(Status.NA, **base, error="; ".join(notes) or NO_ACTIVITY)
    counts = acc.totals()
    if not has_activity(counts):
        reason = NO_ACTIVITY if not notes else f"{NO_ACTIVITY} ({'; '.join(notes)})"
        return Result(Status.NA, **base, error=reason)
    return Result(
        Status.OK, **base, increase=counts, per_model=acc.by_model(),
        reset_note=_reset_note(window, acc),
        anomaly_note=_anomaly_inside_note(acc.anomalies_inside),
        **_coverage(window, acc, notes + anomalies),
    )


def _described(ref: TargetRef, acc: Accumulator | None, *, started: bool) -> dict[str, Any]:
    """The fields of a target's RESULT known whatever its outcome: what the others build on."""
    if acc is None:
        return {"url": ref.url, "target": ref.name, "host_port": ref.host_port, "scrapes": 0,
                "before": None, "after": None}
    return {
        "url": ref.url, "target": ref.name, "host_port": ref.host_port,
        "model_names": tuple(acc.model_names),
        "engines": len(acc.engines),
        "dialect": acc.dialect or None,
        "dialect_note": dialect_note(acc.dialect),
        "resets": acc.resets,
        "scrapes": acc.scrapes,
        "first_scrape_at": acc.first_at,
        "last_scrape_at": acc.last_at,
        **_raw_pair(acc, started),
    }


def _raw_pair(acc: Accumulator, started: bool) -> dict[str, Any]:
    """AISBench's before/after: the first and last usable scrape; None where there is none."""
    if acc.scrapes == 0 or is_estimate(acc.dialect):
        return {"before": None, "after": None}
    before = acc.before or Counts()
    if acc.scrapes >= 2:
        return {"before": before, "after": acc.current()}
    # One usable scrape: the start's, unless the start failed or was not usable.
    if started and not acc.anomalies_before.count:
        return {"before": before, "after": None}
    return {"before": None, "after": before}


def _estimate_result(
    window: Window, acc: Accumulator, base: dict[str, Any], notes: list[str]
) -> Result:
    """SGLang has no counters: the time-weighted means of its interval gauges, flagged."""
    means = acc.gauge_means()
    if acc.scrapes < 2 or SGLANG_LENGTH not in means:
        reason = NO_ACTIVITY if not notes else f"{NO_ACTIVITY} ({'; '.join(notes)})"
        return Result(Status.NA, **base, error=reason)
    return Result(Status.OK, **base, gauge_means=means, **_coverage(window, acc, notes))


def _coverage(window: Window, acc: Accumulator, notes: list[str]) -> dict[str, Any]:
    if not notes:
        return {"coverage": Coverage.FULL, "coverage_note": None}
    stopped = window.stopped_at or acc.last_at or window.started_at
    note = (
        f"partial: the numbers cover {iso_utc(acc.first_at or 0.0)} to "
        f"{iso_utc(acc.last_at or 0.0)} of the window {iso_utc(window.started_at)} to "
        f"{iso_utc(stopped)}; " + "; ".join(notes)
    )
    return {"coverage": Coverage.PARTIAL, "coverage_note": note}


def _reset_note(window: Window, acc: Accumulator) -> str | None:
    if not acc.resets:
        return None
    note = (
        f"server restart seen {acc.resets} time(s) inside the window; "
        "the increase before and after each restart is counted"
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


def _anomaly_text(tally: AnomalyTally) -> str | None:
    """`<series> was NaN at <time> (scrape not used)`, and how many more scrapes alike."""
    first = tally.first
    if first is None:
        return None
    text = f"{first.series} was {first.value} at {iso_utc(first.at)}"
    if first.others:
        text += f" ({first.others} more unusable value(s) in that scrape)"
    if tally.count > 1 and tally.last is not None:
        text += f" (scrape not used, nor {tally.count - 1} more until {iso_utc(tally.last.at)})"
    else:
        text += " (scrape not used)"
    return text


def _anomaly_texts(acc: Accumulator | None) -> list[str]:
    """Why the span the numbers cover starts late or ends early (unusable scrapes at its ends)."""
    if acc is None:
        return []
    texts = [_anomaly_text(acc.anomalies_before), _anomaly_text(acc.anomalies_after)]
    return [t for t in texts if t]


def _no_usable_span(anomalies: list[str], notes: list[str]) -> str:
    return f"{NO_USABLE_SPAN}: " + "; ".join(notes + anomalies)


def _anomaly_inside_note(tally: AnomalyTally) -> str | None:
    first = tally.first
    if first is None:
        return None
    what = f"{first.series} was {first.value} at {iso_utc(first.at)}"
    scrapes = "1 scrape" if tally.count == 1 else f"{tally.count} scrapes"
    first_of = "" if tally.count == 1 else "first: "
    return (
        f"{scrapes} inside the span not used: {first_of}{what}; "
        "the next usable values bridge it exactly"
    )


def window_answer(window: Window) -> dict[str, Any]:
    """The whole stop answer of a stopped window, as JSON."""
    return AnswerParts(window).answer()


_Made = tuple[tuple[Any, ...], float | None, Result, dict[str, Any], dict[str, Any] | None]


class AnswerParts:
    """A stop answer made target by target: each RESULT (with its advice) as soon as its stop
    scrape is in, the rest once the window is stopped.

    Over 1000 targets the RESULTs are nine tenths of an answer's work: a stop makes them while
    its scrapes still come in (on the other core, `book`), and only the aggregate is left after
    the last one. A RESULT is made again when anything it is made of changed since: its
    accumulator fed again, the target removed, an error noted, or the stop time, which a
    partial RESULT's coverage note names. The answer is the same as made in one go.
    """

    def __init__(self, window: Window):
        self.window = window
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
        advice = result_advice(body)
        self._made[name] = (inputs, self.window.stopped_at, result, body, advice)
        return result, body, advice

    def answer(self) -> dict[str, Any]:
        """The whole stop answer (`window_answer`), from the RESULTs made so far and the rest."""
        window = self.window
        made = {name: self.target(name) for name in window.targets}
        # Unix seconds for scripts, ISO 8601 UTC beside each for people: in the API and the
        # files. Only the head is walked for them; each RESULT adds its own.
        head = with_iso_times(window.summary() | {"stopped_at": window.stopped_at})
        answer: dict[str, Any] = head | {
            "results": {name: m[1] for name, m in made.items()},
            "aggregate": aggregate((name, m[0]) for name, m in made.items()).to_json(
                iso_times=True),
        }
        answer["advice"] = window_advice(answer, made={name: m[2] for name, m in made.items()})
        return answer


def window_series(window: Window) -> dict[str, Any]:
    """Per target, per scrape: cumulative and since-the-previous-scrape ratio and length."""
    targets = {}
    for name, points in window.series.items():
        rows = []
        previous = None
        for at, drafts, draft_tokens, accepted in points:
            row = {"at": at, "drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted,
                   **_ratio_pair("", Counts(drafts, draft_tokens, accepted))}
            if previous is not None:
                step = Counts(drafts - previous[1], draft_tokens - previous[2],
                              accepted - previous[3])
                row |= _ratio_pair("interval_", step)
            rows.append(row)
            previous = (at, drafts, draft_tokens, accepted)
        targets[name] = rows
    return {"id": window.id, "name": window.name, "started_at": window.started_at,
            "stopped_at": window.stopped_at, "targets": targets}


def _ratio_pair(prefix: str, counts: Counts) -> dict[str, Any]:
    return {f"{prefix}acceptance_ratio": acceptance_ratio(counts),
            f"{prefix}acceptance_length": acceptance_length(counts)}
