"""The RESULT (a target's window, or the aggregate) in AISBench's format plus our extras, its
JSON both ways (a peer's checked against the schema), and the result files' names.
Stdlib-only: the client's merge uses `aggregate`."""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeGuard

from exporter.core.derive import has_activity, result_data
from exporter.core.dialects import SGLANG_LENGTH, SGLANG_RATE
from exporter.core.isotime import is_number, iso_utc
from exporter.core.loadbands import Bands, bands_from_json, bands_json, reported, summed
from exporter.core.snapshot import DRAFTS_PER_POS, Counts, Field, integral, sum_counts

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
    """AISBench's file name for `label` (`_` for characters outside [A-Za-z0-9._-]), `__suffix`
    after it: one over 64 characters cut to 55 and `-<crc32>` (names have 255 bytes at most)."""
    safe = _UNSAFE.sub("_", suffix)
    if len(safe) > 64:
        safe = f"{safe[:55]}-{zlib.crc32(suffix.encode()):08x}"
    return f"spec_decode_{_UNSAFE.sub('_', label)}{'__' + safe if safe else ''}.json"


def result_file_names(results: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Each target's file name: AISBench's when unique, else with the target name as suffix
    (and `-<crc32 of the name>` where that still collides), so none overwrites another."""
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


def unobserved_span(prev: float, seen: float, restart_at: float | None,
                    downtimes: Iterable[tuple[float, float]] = ()) -> dict[str, Any]:
    """The span of one restart no scrape saw: from our last scrape before it (`prev`) to the
    restart (`restart_at`, from `_created`) or else the scrape that showed it; the last of
    `downtimes` (the exporter down) inside it is named."""
    known = restart_at is not None and prev <= restart_at <= seen
    end = restart_at if known and restart_at is not None else seen
    if known:
        restart = f"at {iso_utc(end)} (its counters' _created)"
    else:
        restart = f"between the scrapes at {iso_utc(prev)} and {iso_utc(seen)}"
    span: dict[str, Any] = {
        "from": prev, "from_iso": iso_utc(prev), "to": end, "to_iso": iso_utc(end),
        "seconds": end - prev,
        "restart_at": end if known else None, "restart_at_iso": iso_utc(end) if known else None,
        "next_scrape_at": seen, "next_scrape_at_iso": iso_utc(seen),
        "restart": restart,
    }
    down = [(d, u) for d, u in downtimes if prev <= d <= u <= seen]
    if down:
        span["exporter_down"] = list(down[-1])
        span["restart"] += (f", while the exporter was down ({iso_utc(down[-1][0])} to "
                            f"{iso_utc(down[-1][1])})")
    return span


def restart_time(created: Iterable[float], prev: float, at: float) -> float | None:
    """The earliest of the restarted engines' `_created` times between `prev` and `at` (one
    outside is a skewed clock), or None."""
    return min((c for c in created if prev <= c <= at), default=None)


def restart_times(spans: Sequence[tuple[float, float]],
                  times: Sequence[float | None]) -> list[float | None]:
    """An accumulator's restart times, one per span (None where an old state kept none)."""
    return [*times[: len(spans)], *[None] * (len(spans) - len(times))]


def unobserved_spans(spans: Sequence[tuple[float, float]], times: Sequence[float | None],
                     downtimes: Iterable[tuple[float, float]] = ()) -> list[dict[str, Any]]:
    """`unobserved_span` of each restart (an accumulator's `reset_spans`, `restart_times`)."""
    downs = list(downtimes)
    return [unobserved_span(prev, seen, at, downs)
            for (prev, seen), at in zip(spans, restart_times(spans, times), strict=True)]


def unobserved_text(spans: Iterable[Mapping[str, Any]]) -> str:
    """The unobserved spans in one clause: what the numbers miss at the restarts."""
    parts = [
        (f"{span['target']}: " if span.get("target") else "")
        + f"{span['from_iso']} to {span['to_iso']} ({span['seconds']:.3f} s; restart "
        f"{span['restart']})"
        for span in spans
    ]
    return ("not counted: what the server counted from our last scrape before each restart "
            "to the restart: " + "; ".join(parts))


def _read_spans(raw: object) -> tuple[dict[str, Any], ...]:
    """`unobserved` made again from its times (no peer's text reaches a note), bad entries out."""
    if not isinstance(raw, list):
        return ()
    spans = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            continue
        prev, seen, at = entry.get("from"), entry.get("next_scrape_at"), entry.get("restart_at")
        if not (is_number(prev) and is_number(seen)):
            continue
        down = entry.get("exporter_down")
        downtimes = [(down[0], down[1])] if (
            isinstance(down, list) and len(down) == 2 and all(map(is_number, down))) else []
        span = unobserved_span(prev, seen, at if is_number(at) else None, downtimes)
        if isinstance(entry.get("target"), str):
            span["target"] = entry["target"]
        spans.append(span)
    return tuple(spans)


def fetch_error(url: str, reason: str, when: str) -> str:
    """AISBench's fetch error, saying whether it was the window's start or its stop."""
    return f"Failed to fetch metrics from {url} at window {when}: {reason}"


@dataclass(frozen=True)
class Result:
    """One RESULT (the aggregate when `targets` is set)."""

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
    read: str | None = None  # "filtered" or "full": how the target's last usable page was asked
    resets: int = 0
    scrapes: int | None = None
    first_scrape_at: float | None = None
    last_scrape_at: float | None = None
    increase_until_removed: Counts | None = None
    # `unobserved_span` per restart; in an aggregate, every target's, with its `target`.
    unobserved: tuple[Mapping[str, Any], ...] = ()
    by_load: Bands = field(default_factory=dict)  # the increase by running-requests band

    @property
    def ok(self) -> bool:
        """Numbers to report."""
        return self.status is Status.OK

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
        """The RESULT's JSON, AISBench's keys first; `iso_times` adds `..._at_iso` keys."""
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
            body["read"] = self.read
            body["scrapes"] = self.scrapes
            for key, at in (("first_scrape_at", self.first_scrape_at),
                            ("last_scrape_at", self.last_scrape_at)):
                body[key] = at
                if iso_times:
                    body[f"{key}_iso"] = iso_utc(at) if at is not None else None
        body["resets"] = self.resets
        for key, note in (("dialect_note", self.dialect_note), ("reset_note", self.reset_note),
                          ("anomaly_note", self.anomaly_note)):
            if note is not None:
                body[key] = note
        if self.increase_until_removed is not None:
            body["increase_until_removed"] = self.increase_until_removed.as_raw()
        if self.gauge_means is not None:
            body["estimate"] = True
            body["gauge_means"] = dict(self.gauge_means)
        if self.coverage is not None:
            body["coverage"] = self.coverage.value
            body["coverage_note"] = self.coverage_note
        if self.unobserved:
            body["unobserved"] = [dict(span) for span in self.unobserved]
        if counted:
            body["per_model"] = {
                model: self._model_part(counts, body)
                for model, counts in sorted(self.per_model.items()) if has_activity(counts)
            }
            if reported(self.by_load):
                body["by_load"] = bands_json(self.by_load)
            if self.targets is not None:
                increase = self.increase or Counts()
                body["per_position_drafts"] = {
                    str(p): integral(increase.drafts_at(p)) for p in sorted(increase.per_position)
                }
                body["per_position_note"] = PER_POSITION_NOTE
        return body

    def _model_part(self, counts: Counts, body: Mapping[str, Any]) -> dict[str, Any]:
        """One model's `data` and `increase`; the target's own, copied, when they are equal."""
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
            **{key: body.get(key) for key in _AS_READ},
            increase=_counts(body.get("increase")),
            before=_counts(raw.get("before")),
            after=_counts(raw.get("after")),
            per_model=per_model,
            gauge_means=body.get("gauge_means") if body.get("estimate") else None,
            coverage=Coverage(coverage) if coverage else None,
            targets=tuple(body["targets"]) if "targets" in body else None,
            model_names=tuple(body.get("model_names") or ()),
            engines=body.get("engines") or 0,
            resets=body.get("resets") or 0,
            increase_until_removed=_counts(body.get("increase_until_removed")),
            unobserved=_read_spans(body.get("unobserved")),
            by_load=bands_from_json(body.get("by_load")),
        )


# The fields `from_json` takes as the body has them (None where it lacks them).
_AS_READ = ("url", "error", "coverage_note", "reset_note", "anomaly_note", "target", "host_port",
            "dialect", "dialect_note", "read", "scrapes", "first_scrape_at", "last_scrape_at")


def _copy_raw(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}


def _raw(counts: Counts | None) -> dict[str, Any] | None:
    return counts.as_raw() if counts is not None else None


def _counts(raw: object) -> Counts | None:
    return Counts.from_raw(raw) if isinstance(raw, Mapping) else None


_NONE = Counts()  # what a RESULT without counts adds


def aggregate(results: Iterable[tuple[str, Result]]) -> Result:
    """Exact counts summed, then divided (never an average of ratios); estimates stay out."""
    used = [(name, r) for name, r in results
            if r.ok and r.increase is not None and r.gauge_means is None]
    total = sum_counts(r.increase or _NONE for _, r in used)
    before = sum_counts(r.before or _NONE for _, r in used)
    after = sum_counts(r.after or _NONE for _, r in used)
    models: dict[str, list[Counts]] = {}
    for _, result in used:
        for model, counts in result.per_model.items():
            models.setdefault(model, []).append(counts)
    per_model = {model: sum_counts(parts) for model, parts in models.items()}
    partial = [name for name, r in used if r.coverage is Coverage.PARTIAL]
    spans = tuple(dict(span) | {"target": name} for name, r in used for span in r.unobserved)
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
        per_model=per_model, by_load=summed(r.by_load for _, r in used),
        coverage=Coverage.PARTIAL if partial else Coverage.FULL,
        coverage_note=(
            f"partial: includes targets whose numbers cover part of the window: "
            f"{', '.join(partial)}" + (f"; {unobserved_text(spans)}" if spans else "")
            if partial else None
        ),
        unobserved=spans,
    )


# Past 2**53 a float counter is no longer exact; a sum of such values over a fleet stays finite.
MAX_COUNT = float(2**53)
_COUNT_KEYS = (Field.DRAFTS.value, Field.DRAFT_TOKENS.value, Field.ACCEPTED.value)
_PER_POSITION_KEYS = (Field.PER_POS.value, DRAFTS_PER_POS)
_TEXT_KEYS = ("url", "error", "target", "host_port", "coverage_note", "reset_note",
              "anomaly_note", "dialect", "dialect_note", "read", "results_dir")
_STATUSES = frozenset(s.value for s in Status)
_COVERAGES = frozenset(c.value for c in Coverage)


def is_count(value: object) -> TypeGuard[float]:
    """A number a counter can hold: finite, 0 to MAX_COUNT."""
    return is_number(value) and 0 <= value <= MAX_COUNT


def _counts_problem(raw: object, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        return f"{where} is not an object"
    for key in _COUNT_KEYS:
        if key in raw and not is_count(raw[key]):
            return f"{where}.{key} is not a count: {raw[key]!r:.40}"
    for key in _PER_POSITION_KEYS:
        per = raw.get(key)
        if per is None:
            continue
        if not isinstance(per, Mapping):
            return f"{where}.{key} is not an object"
        for pos, value in per.items():
            if not (isinstance(pos, str) and pos.isascii() and pos.isdigit() and len(pos) < 5):
                return f"{where}.{key} has a position that is not a number: {pos!r:.40}"
            if not is_count(value):
                return f"{where}.{key}.{pos} is not a count: {value!r:.40}"
    return None


def _fields_problem(value: Mapping[str, Any]) -> str | None:
    if value.get("status") not in _STATUSES:
        return f"status {value.get('status')!r:.40} is neither ok nor na"
    for key in _TEXT_KEYS:
        if value.get(key) is not None and not isinstance(value[key], str):
            return f"{key} is not text"
    if value.get("coverage") is not None and value["coverage"] not in _COVERAGES:
        return f"coverage {value['coverage']!r:.40} is neither full nor partial"
    for keys, valid, what in ((("engines", "resets", "scrapes"), is_count, "a count"),
                              (("first_scrape_at", "last_scrape_at"), is_number, "a time")):
        for key in keys:
            if value.get(key) is not None and not valid(value[key]):
                return f"{key} is not {what}"
    names = value.get("model_names")
    if names is not None and not (isinstance(names, list)
                                  and all(isinstance(n, str) for n in names)):
        return "model_names is not a list of names"
    means = value.get("gauge_means")
    if value.get("estimate") and not (isinstance(means, Mapping)
                                      and all(is_number(m) for m in means.values())):
        return "gauge_means is not an object of numbers"
    return None


def _nested_counts_problem(value: Mapping[str, Any]) -> str | None:
    raw = value.get("raw")
    if raw is not None and not isinstance(raw, Mapping):
        return "raw is not an object"
    raw = raw or {}
    for where, counts in (("increase", value.get("increase")),
                          ("increase_until_removed", value.get("increase_until_removed")),
                          ("raw.before", raw.get("before")), ("raw.after", raw.get("after"))):
        if (problem := _counts_problem(counts, where)) is not None:
            return problem
    if (problem := _by_load_problem(value.get("by_load"))) is not None:
        return problem
    per_model = value.get("per_model")
    if per_model is None:
        return None
    if not isinstance(per_model, Mapping):
        return "per_model is not an object"
    for model, entry in per_model.items():
        if not isinstance(entry, Mapping):
            return f"per_model.{model} is not an object"
        if (problem := _counts_problem(entry.get("increase"), f"per_model.{model}.increase")):
            return problem
    return None


def _by_load_problem(by_load: object) -> str | None:
    if by_load is None:
        return None
    if not isinstance(by_load, Mapping):
        return "by_load is not an object"
    for band, entry in by_load.items():
        if not isinstance(entry, Mapping) or not is_count(entry.get("intervals")):
            return f"by_load.{band} has no count of intervals"
        if entry.get("increase") is None:
            return f"by_load.{band} has no increase"
        if (problem := _counts_problem(entry["increase"], f"by_load.{band}.increase")):
            return problem
    return None


def result_problem(value: object) -> str | None:
    """Why a shard's RESULT cannot be merged (its schema: status, texts, counts), or None."""
    if not isinstance(value, Mapping):
        return "is not an object"
    problem = _fields_problem(value) or _nested_counts_problem(value)
    if problem is None:
        try:
            Result.from_json(value)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
            problem = f"cannot be read: {exc}"
    return problem
