"""Counters over time: exact, reset-safe increases from the sequence of scrapes we took.

Prometheus's `increase()` extrapolates between samples; we see every scrape of a window, so we
can be exact: between two scrapes a series grows by `now - before`, unless the server restarted
(the value went down, or its `_created` changed), in which case it grew by `now` from zero.
"""

from __future__ import annotations

import base64
import functools
import json
import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from exporter.core.snapshot import (
    Counts,
    Field,
    PackedCounts,
    SeriesKey,
    Snapshot,
    counts_by_model,
    doubles,
    pack_counts,
    pack_values,
    sum_series,
    unpack_counts,
    unpack_values,
)

# Series gone from the page are remembered (their last value, to count from if they return)
# up to this many per accumulator; a real server's model or engine leaving stays far below it.
MAX_ABSENT_SERIES = 4096
# The model name under which retired series' increases are kept (no real name has brackets).
RETIRED_MODEL = "(series no longer on the page)"

# What restarts as one: model name, engine, extra labels (see `_engine_of`).
Engine = tuple[str, str, tuple[tuple[str, str], ...]]


def counter_increase(
    before: float, before_created: float | None, now: float, now_created: float | None
) -> tuple[float, bool]:
    """Increase of one counter series between two scrapes, and whether it was reset between."""
    # A NaN `_created` never equals itself: it must not read as a restart on every scrape.
    created_changed = (
        _known(before_created) and _known(now_created) and now_created != before_created
    )
    if now < before or created_changed:
        return now, True
    return now - before, False


def _known(created: float | None) -> bool:
    return created is not None and math.isfinite(created)


def value_text(value: float) -> str:
    """A sample value as an exposition writes it: NaN, +Inf, -Inf, or the number."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def series_text(key: SeriesKey) -> str:
    """A series as a person looks it up: AISBench's counter name and the labels that tell it."""
    labels = [("engine", key.engine), ("model_name", key.model_name)]
    if key.position >= 0:
        labels.append(("position", str(key.position)))
    labels += list(key.extra)
    # A note is read by people and kept in the state: a 100k-character label value is cut.
    inner = ",".join(
        f'{name}="{value if len(value) <= 120 else value[:117] + "..."}"'
        for name, value in labels if value
    )
    return f"{key.field.value}{{{inner}}}" if inner else key.field.value


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A counter value no counter can have (NaN, infinite, negative) in one scrape."""

    at: float
    series: str
    value: str
    others: int = 0  # further unusable values in the same scrape


def find_anomaly(snapshot: Snapshot, at: float) -> Anomaly | None:
    """The scrape's first unusable counter value (by series), or None when all are usable."""
    # One chained comparison per value (NaN fails it too): this runs on every scrape.
    bad = [key for key, value in snapshot.values.items() if not 0.0 <= value < math.inf]
    if not bad:
        return None
    first = min(bad)  # a stable choice, whatever the page's order; cheap for many
    return Anomaly(at, series_text(first), value_text(snapshot.values[first]), len(bad) - 1)


@dataclass(frozen=True, slots=True)
class AnomalyTally:
    """Anomalous scrapes of one stretch: the first and the last, and how many (bounded state).

    Immutable: most accumulators never see one, and all of those share `NO_ANOMALIES` (three
    tallies an accumulator, ~0.2 KB at each of 1000 targets of a window and of the live tracks).
    """

    count: int = 0
    first: Anomaly | None = None
    last: Anomaly | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> AnomalyTally:
        return self  # immutable: `NO_ANOMALIES` stays the one shared

    def plus(self, anomaly: Anomaly) -> AnomalyTally:
        """This tally and one more anomalous scrape."""
        return AnomalyTally(self.count + 1, self.first or anomaly, anomaly)

    def joined(self, other: AnomalyTally) -> AnomalyTally:
        """This tally and another's scrapes (a later stretch)."""
        if not other.count:
            return self
        return AnomalyTally(self.count + other.count, self.first or other.first, other.last)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state."""
        return {"count": self.count, "first": _anomaly_list(self.first),
                "last": _anomaly_list(self.last)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> AnomalyTally:
        """Inverse of `to_dict`."""
        if not data or not data["count"]:
            return NO_ANOMALIES
        return cls(data["count"], _anomaly_from(data["first"]), _anomaly_from(data["last"]))


NO_ANOMALIES = AnomalyTally()

K = TypeVar("K")
V = TypeVar("V")


def _writable(mapping: Mapping[K, V]) -> dict[K, V]:
    """`mapping` itself where it is a dict of its own, else a dict of its items (a shared
    empty one is never written to)."""
    return mapping if isinstance(mapping, dict) else dict(mapping)


class _NoItems(Mapping[Any, Any]):
    """The empty mapping accumulators share until they have something to hold (most never
    do): read-only, so that a write not made through a dict of the accumulator's own fails
    loudly; a copy of it is itself."""

    __slots__ = ()

    def __getitem__(self, key: object) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __copy__(self) -> _NoItems:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _NoItems:
        return self

    def __reduce__(self) -> str:
        return "NO_ITEMS"  # pickled by name: unpickled as the shared one


NO_ITEMS: Mapping[Any, Any] = _NoItems()


class _Parked(Mapping[SeriesKey, float]):
    """A page's values packed (`Accumulator.park`): a tuple of keys and their doubles, made
    a dict again when first read."""

    __slots__ = ("_keys", "_numbers", "_read")

    def __init__(self, keys: tuple[SeriesKey, ...], numbers: bytes):
        self._keys, self._numbers = keys, numbers
        self._read: dict[SeriesKey, float] | None = None

    @classmethod
    def of(cls, values: Mapping[SeriesKey, float]) -> _Parked:
        """`values` packed."""
        return cls(tuple(values), pack_values(values))

    def _values(self) -> dict[SeriesKey, float]:
        if self._read is None:
            self._read = unpack_values(self._keys, self._numbers)
        return self._read

    def __getitem__(self, key: SeriesKey) -> float:
        return self._values()[key]

    def __iter__(self) -> Iterator[SeriesKey]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def _anomaly_list(anomaly: Anomaly | None) -> list[Any] | None:
    if anomaly is None:
        return None
    return [anomaly.at, anomaly.series, anomaly.value, anomaly.others]


def _anomaly_from(data: Sequence[Any] | None) -> Anomaly | None:
    return Anomaly(*data) if data else None


# What an accumulator's whole row holds beyond its round part (`Accumulator._shape`).
Shape = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Encoded:
    """An accumulator's row for the store: its whole state, or only its round part."""

    text: str
    whole: bool
    shape: Shape  # of the whole row it is, or is the round part of
    scrapes: int  # the accumulator's scrapes when it was encoded


@dataclass(slots=True)
class Accumulator:
    """Increases of one target's series since a baseline scrape, fed scrape by scrape.

    Owned by one window (or one target's live track), so it is mutated in place; its whole
    state round-trips through `to_dict`/`from_dict` for the durable store.

    The last usable scrape's values and `_created` times are that snapshot's own mappings
    (never mutated, `snapshot.Snapshot`): the target's last scrape, its live track and every
    open window share them, where each kept a copy (a tuple per series, and a dict of when each
    series was read). Only series off that page are kept apart, in `gone`.
    """

    last: Mapping[SeriesKey, float] = field(default_factory=dict)
    created: Mapping[SeriesKey, float] = field(default_factory=dict)
    increase: dict[SeriesKey, float] = field(default_factory=dict)
    resets: int = 0
    scrapes: int = 0
    first_at: float | None = None
    last_at: float | None = None
    engines: frozenset[str] = frozenset()  # one set shared by all alike (`_engines`)
    dialect: str = ""
    # The baseline scrape's totals (AISBench's `before`, read as `before`), packed: ~0.2 KB
    # where a `Counts` is ~0.7 KB, kept by every target of an open window.
    packed_before: PackedCounts | None = None
    # (prev scrape, seen) of each restart; a list once there is one. The containers below that
    # most accumulators leave empty start as shared empty ones (`NO_ITEMS`, `NO_ANOMALIES`):
    # ~0.5 KB an accumulator, at every target of a window and of the live tracks.
    reset_spans: Sequence[tuple[float, float]] = ()
    # Series of earlier scrapes off the last usable one's page: (last value, its `_created`,
    # when it was last read), what a series that comes back counts from. The series in
    # `last` were read at `last_at`.
    gone: Mapping[SeriesKey, tuple[float, float | None, float]] = field(
        default_factory=lambda: NO_ITEMS)
    # Interval gauges (SGLang's acceptance, V0's rates), time-weighted: per gauge name,
    # sum(value * dt) and sum(dt) over the intervals between consecutive scrapes.
    gauge_weighted: Mapping[str, float] = field(default_factory=lambda: NO_ITEMS)
    gauge_seconds: Mapping[str, float] = field(default_factory=lambda: NO_ITEMS)
    # Scrapes with an unusable counter value are not taken (as if they had failed): the counts
    # then cover only spans whose both ends had every series usable. Those before the first
    # usable scrape move the span's start, those after the last usable one its end, and those
    # between are bridged exactly by the counters' next usable values.
    anomalies_before: AnomalyTally = NO_ANOMALIES
    anomalies_inside: AnomalyTally = NO_ANOMALIES
    anomalies_after: AnomalyTally = NO_ANOMALIES
    # `totals()` since the last `feed` (the only place the increases change): a window reads
    # it after every scrape, and its stop answer reads it again, with `by_model`.
    _totals: Counts | None = field(default=None, init=False, repr=False, compare=False)
    # The shape and scrape count of this accumulator's whole row as the store last committed
    # it (`saved`): what a round part is written against.
    _saved: tuple[Shape, int] | None = field(default=None, init=False, repr=False, compare=False)
    # Calls of `feed` (usable scrapes or not): what was made from this accumulator is out of
    # date once it moved (`results.AnswerParts`).
    feeds: int = field(default=0, init=False, repr=False, compare=False)

    def feed(self, snapshot: Snapshot, at: float) -> bool:
        """Take one scrape into account; returns whether it showed a server restart.

        A scrape with a NaN, infinite or negative counter value is an anomaly: it is recorded
        and otherwise ignored, whichever series it hit, so that every figure of the result
        covers the same span.
        """
        self._totals = None
        self.feeds += 1
        anomaly = find_anomaly(snapshot, at)
        if anomaly is not None:
            if self.scrapes:
                self.anomalies_after = self.anomalies_after.plus(anomaly)
            else:
                self.anomalies_before = self.anomalies_before.plus(anomaly)
            return False
        baseline = self.scrapes == 0
        renamed: set[SeriesKey] = set()
        if not baseline:
            renamed = self._carry_relabelled(snapshot)
            if self.anomalies_after.count:  # else nothing to move
                self.anomalies_inside = self.anomalies_inside.joined(self.anomalies_after)
                self.anomalies_after = NO_ANOMALIES
        values, created = snapshot.values, snapshot.created
        last, last_created, gone = self.last, self.created, self.gone
        last_at = self.last_at or 0.0  # when the series in `last` were read
        # A restart zeroes every counter of an engine at once, but one whose old value was small
        # (a late position, say) can be past it again by the next scrape. A series that shows
        # the restart bounds it from below (it happened after that series was last seen), so
        # every series of the engine last seen no later than that counts from zero too; a
        # series seen since (one skipped across the restart shows it a scrape late) keeps its
        # own evidence and is not counted twice.
        bounds: dict[Engine, float] = {}
        in_last = 0  # of this page's series, those on the last usable scrape's page
        if not gone and created == last_created:
            # The usual scrape: every `_created` as at the last one (NaN ones the same
            # objects), so only a value gone down shows a restart (`counter_increase`).
            for key, value in values.items():
                before = last.get(key)
                if before is not None:
                    in_last += 1
                    if value < before:
                        engine = _engine_of(key)
                        bounds[engine] = max(bounds.get(engine, last_at), last_at)
        else:
            for key, value in values.items():
                before = last.get(key)
                if before is not None:
                    in_last += 1
                    before_created, seen = last_created.get(key), last_at
                elif gone and key in gone:
                    before, before_created, seen = gone[key]
                else:
                    continue
                if counter_increase(before, before_created, value, created.get(key))[1]:
                    engine = _engine_of(key)
                    bounds[engine] = max(bounds.get(engine, seen), seen)
        reset = bool(bounds)
        increase = self.increase
        for key, value in values.items():
            before = last.get(key)
            if before is not None:
                if reset:
                    before_created, seen = last_created.get(key), last_at
            elif gone and key in gone:
                before, before_created, seen = self._own_gone().pop(key)  # back on the page
            if before is not None:
                if not reset:  # no series showed a restart: each grew by the difference
                    inc = value - before
                elif (bound := bounds.get(_engine_of(key))) is not None and seen <= bound:
                    inc = value
                else:
                    inc, _ = counter_increase(before, before_created, value, created.get(key))
            elif baseline:
                inc = 0.0
            else:
                # A series first seen after the baseline (a new engine, or one that restarted
                # while absent) grew from zero inside the window.
                inc = value
            # Zero increases are kept too: a position nobody reached shows as 0, not missing.
            # An unchanged series keeps its number, and a new one at zero holds the constant:
            # no float made (~0.26 MB at a 1000-target window's start).
            if key not in increase:
                increase[key] = 0.0 + inc if inc else 0.0
            elif inc:
                increase[key] += inc
            if key.engine not in self.engines:
                self.engines = _engines(self.engines | {key.engine})
        if in_last < len(last):
            # Series of the last usable scrape off this page: kept apart with their values (a
            # page with the series of the last, the usual case, skips this loop).
            own = self._own_gone()
            for key, value in last.items():
                if key not in values and key not in renamed:
                    own[key] = (value, last_created.get(key), last_at)
        self.last, self.created = values, created
        self._retire_absent()
        self._feed_gauges(snapshot, at, baseline)
        if baseline:
            self.before = sum_series(snapshot.values.items())
        if reset:
            self.resets += 1
            self.reset_spans = [*self.reset_spans, (self.last_at or at, at)]
        self.scrapes += 1
        if self.first_at is None:
            self.first_at = at
        self.last_at = at
        if snapshot.has_spec_decode:
            self.dialect = snapshot.dialect
        return reset

    def _feed_gauges(self, snapshot: Snapshot, at: float, baseline: bool) -> None:
        # An interval gauge read at a scrape describes the time before it (SGLang's covers its
        # last logging interval), so it weighs the interval since the previous scrape; the
        # baseline's value describes time before the window and weighs nothing.
        if baseline or self.last_at is None or at <= self.last_at:
            return
        dt = at - self.last_at
        for name, value in snapshot.gauges.items():
            if math.isfinite(value):
                weighted = self.gauge_weighted = _writable(self.gauge_weighted)
                seconds = self.gauge_seconds = _writable(self.gauge_seconds)
                weighted[name] = weighted.get(name, 0.0) + value * dt
                seconds[name] = seconds.get(name, 0.0) + dt

    def gauge_means(self) -> dict[str, float]:
        """Each interval gauge's time-weighted mean over the scrapes since the baseline.

        An estimate: the server's gauge covers its own logging interval, not exactly the time
        between our scrapes, and an idle server keeps showing its last value.
        """
        return {
            name: self.gauge_weighted[name] / seconds
            for name, seconds in sorted(self.gauge_seconds.items())
            if seconds > 0
        }

    def _carry_relabelled(self, snapshot: Snapshot) -> set[SeriesKey]:
        """A series that gains (or loses) its `engine` label is the same series renamed.

        A server that starts labelling `engine="0"` mid-window would otherwise show a new
        series whose whole value (warm-up included) counts as increase. The old series' state
        moves to the new name (into `gone`, which the new name is read from), so the increase
        is counted from it; a changed `_created` still reads as a restart. Returns the old
        names taken from `last` (they are not off the page: they were renamed).
        """
        last, gone, values = self.last, self.gone, snapshot.values
        renamed: set[SeriesKey] = set()
        # Engine-labelled series by their name without it, built once per scrape and only if
        # needed: a page renaming its series every scrape must not cost new x known.
        unlabelled: dict[SeriesKey, list[SeriesKey]] | None = None
        for key in values:
            if key in last or key in gone:
                continue
            if key.engine:
                olds = [key._replace(engine="")]
            else:
                if unlabelled is None:
                    unlabelled = {}
                    for known in (*last, *gone):
                        if known.engine:
                            unlabelled.setdefault(known._replace(engine=""), []).append(known)
                olds = sorted(unlabelled.get(key, ()))
            for old in olds[:1]:
                if old in values:
                    continue
                if old in last and old not in renamed:
                    renamed.add(old)
                    gone = self._own_gone()
                    gone[key] = (last[old], self.created.get(old), self.last_at or 0.0)
                elif old in gone:
                    gone = self._own_gone()
                    gone[key] = gone.pop(old)
                else:
                    continue
                if old in self.increase:
                    self.increase[key] = self.increase.get(key, 0.0) + self.increase.pop(old)
        return renamed

    def _retire_absent(self) -> None:
        """Forget the oldest-seen absent series past MAX_ABSENT_SERIES, keeping their counts.

        Their last value is what a series that comes back would count from; past the bound
        (a page whose label values change every scrape) the oldest go, and their increase moves
        to one retired key per counter and position, so totals stay exact.
        """
        if len(self.gone) <= MAX_ABSENT_SERIES:
            return
        gone = self._own_gone()
        oldest = sorted(gone, key=lambda k: gone[k][2])
        for key in oldest[: len(gone) - MAX_ABSENT_SERIES]:
            del gone[key]
            increase = self.increase.pop(key, 0.0)
            retired = SeriesKey(key.field, RETIRED_MODEL, "", key.position)
            self.increase[retired] = self.increase.get(retired, 0.0) + increase

    def park(self, created_now: Mapping[SeriesKey, float]) -> None:
        """Hold the last page's values packed, until fed again.

        A streamed stop (`book`) marks a target's stop scrape taken and leaves the counting
        to its child: the target's live track has moved on to the stop's page, and only this
        accumulator still holds the page before (~13 objects a target, 13,000 at once at 1000
        targets). It is fed the stop scrape only if the child fails, which reads the values
        back. `created_now`: the stop page's `_created` times, shared where they are the same
        (the usual case).
        """
        if not isinstance(self.last, _Parked):
            self.last = _Parked.of(self.last)
        if self.created == created_now:
            self.created = created_now
        elif not isinstance(self.created, _Parked):
            self.created = _Parked.of(self.created)

    def _own_gone(self) -> dict[SeriesKey, tuple[float, float | None, float]]:
        """`gone` to write in: a dict of this accumulator's own (not the shared empty one)."""
        gone = self.gone = _writable(self.gone)
        return gone

    @property
    def before(self) -> Counts | None:
        """The baseline scrape's totals (AISBench's `before`); None before a baseline."""
        return None if self.packed_before is None else unpack_counts(self.packed_before)

    @before.setter
    def before(self, counts: Counts | None) -> None:
        self.packed_before = None if counts is None else pack_counts(counts)

    @property
    def has_series(self) -> bool:
        """Whether a counter series was read: on the last usable scrape's page or before."""
        return bool(self.last) or bool(self.gone)

    @property
    def seen(self) -> dict[SeriesKey, float]:
        """When each series off the last usable scrape's page was last read (those on it were
        read at `last_at`)."""
        return {key: state[2] for key, state in self.gone.items()}

    def totals(self, *, cached: bool = True) -> Counts:
        """The increase since the baseline, summed over engines and models; kept until the
        next `feed` unless not `cached` (and not kept already)."""
        if self._totals is not None:
            return self._totals
        totals = sum_series(self.increase.items())
        if cached:
            self._totals = totals
        return totals

    def by_model(self) -> dict[str, Counts]:
        """The increase since the baseline, per model name."""
        models = {key.model_name for key in self.increase}
        if len(models) == 1:
            # One model (the usual case): its series are all of them, in the same order, so
            # its sum is `totals()`, already summed.
            return {models.pop(): self.totals()}
        return counts_by_model(self.increase)

    def current(self) -> Counts:
        """The last counter values seen, summed (AISBench's `after`): those off the last
        usable scrape's page too, as they were last read."""
        if not self.gone:
            return sum_series(self.last.items())
        return sum_series([*self.last.items(), *((k, g[0]) for k, g in self.gone.items())])

    @property
    def model_names(self) -> list[str]:
        """Model names whose series this accumulator has seen."""
        return sorted({k.model_name for k in (*self.last, *self.gone)})

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "last": [[_key_list(k), v, c] for k, v, c, _ in self._series()],
            "increase": [[_key_list(k), v] for k, v in self.increase.items()],
            "resets": self.resets,
            "scrapes": self.scrapes,
            "first_at": self.first_at,
            "last_at": self.last_at,
            "engines": sorted(self.engines),
            "dialect": self.dialect,
            "before": before.as_raw() if (before := self.before) is not None else None,
            "reset_spans": [list(span) for span in self.reset_spans],
            "seen": [[_key_list(k), t] for k, _, _, t in self._series()],
            "gauge_weighted": dict(self.gauge_weighted),
            "gauge_seconds": dict(self.gauge_seconds),
            "anomalies": [t.to_dict() for t in self.tallies()],
        }

    def tallies(self) -> tuple[AnomalyTally, AnomalyTally, AnomalyTally]:
        """Anomalous scrapes before, inside and after the span the counts cover."""
        return self.anomalies_before, self.anomalies_inside, self.anomalies_after

    def to_json(self) -> str:
        """The whole state as JSON text (`to_dict`'s content), written directly: each series'
        key and its four numbers (value, created, increase, seen), the keys' text cached per
        key, the numbers as one flat list through the C encoder."""
        return self._whole_json(self._keys())

    def encode(self, *, whole: bool = False) -> Encoded:
        """This accumulator's row for the store: its round part (`_round_json`) when its whole
        row as last committed (`saved`) differs only there, else (or if `whole`) the whole.

        A round changes the series' values, increases and seen times, the scrape count and
        time and the gauges' sums; keys, created times, restarts, the baseline, engines and
        anomalies change rarely, and a whole row is several times the bytes and the work."""
        keys = self._keys()
        # Every series with a value and an increase (so, always but for series retired or from
        # an old state): what a round part holds.
        aligned = len(keys) == len(self.last) + len(self.gone) == len(self.increase)
        last = self.last
        values: Sequence[float | None]
        if not self.gone and aligned:
            values = list(map(last.__getitem__, keys))
            created = tuple(map(self.created.get, keys))
        else:
            rows = list(self._series(keys))
            values = [v for _, v, _, _ in rows]
            created = tuple(c for _, _, c, _ in rows)
        shape = self._shape(keys, created)
        saved = self._saved
        if aligned and not whole and saved is not None and shape == saved[0]:
            return Encoded(self._round_json(keys, values, saved[1]), False, shape, self.scrapes)
        return Encoded(self._whole_json(keys), True, shape, self.scrapes)

    def saved(self, encoded: Encoded) -> None:
        """The store committed `encoded` (from `encode`): later rounds write against it."""
        if encoded.whole:
            keys, *rest = encoded.shape
            # Kept while the window is open: targets alike share one tuple of keys.
            self._saved = ((_shared_keys(keys), *rest), encoded.scrapes)

    def _keys(self) -> list[SeriesKey]:
        # The order of a row's series: the increases' (every series fed has one), then any
        # series with a value but no increase (none, unless a state was edited by hand).
        keys = list(self.increase)
        if len(keys) < len(self.last) + len(self.gone):
            keys += [k for k in (*self.last, *self.gone) if k not in self.increase]
        return keys

    def _series(self, keys: Sequence[SeriesKey] | None = None,
                ) -> Iterator[tuple[SeriesKey, float | None, float | None, float | None]]:
        """(key, last value, `_created`, when last read) of each series (default: those with
        a value), None where a series has none (a retired series has an increase only)."""
        last, created, gone, at = self.last, self.created, self.gone, self.last_at
        if keys is None:
            keys = [*last, *gone]
        for k in keys:
            if k in last:
                yield k, last[k], created.get(k), at
            elif k in gone:
                yield k, *gone[k]
            else:
                yield k, None, None, None

    def _shape(self, keys: list[SeriesKey], created: tuple[float | None, ...]) -> Shape:
        """Everything a whole row holds that its round part does not: equal shapes, equal
        whole rows but for the round part. Engines and restart spans are only ever added, and
        a tally changes with its count: their sizes and counts tell a change. (A NaN created
        time never equals itself: such a series' row is written whole every round, correct
        if slower.)"""
        return (
            tuple(keys), created, self.resets, len(self.reset_spans),
            self.first_at, len(self.engines), self.dialect, self.packed_before,
            self.anomalies_before.count, self.anomalies_inside.count, self.anomalies_after.count,
        )

    def _whole_json(self, keys: list[SeriesKey]) -> str:
        increase = self.increase
        values: list[float | None] = []
        for k, v, c, t in self._series(keys):
            values += (v, c, increase.get(k), t)
        engines = sorted(self.engines)
        return "".join((
            '{"keys":[', ",".join(_key_json(k) for k in keys), '],"values":', json.dumps(values),
            f',"resets":{self.resets},"scrapes":{self.scrapes},',
            f'"first_at":{_num(self.first_at)},"last_at":{_num(self.last_at)},',
            '"engines":', json.dumps(engines), ',"dialect":', json.dumps(self.dialect),
            ',"before":', json.dumps(before.as_raw()) if (before := self.before) else "null",
            ',"reset_spans":', json.dumps([list(span) for span in self.reset_spans]),
            ',"gauge_weighted":', _dict_json(self.gauge_weighted),
            ',"gauge_seconds":', _dict_json(self.gauge_seconds),
            ',"anomalies":[', ",".join(_tally_json(t) for t in self.tallies()), "]}",
        ))

    def _round_json(self, keys: list[SeriesKey], values: Sequence[float | None],
                    base: int) -> str:
        """What a round changes, for the whole row of `base` scrapes and its `keys` (every
        series with a value, in the increases' order): the `values` and increases as
        little-endian doubles in base64 (the C encoder spends a microsecond per float,
        `struct` nanoseconds), and a seen time only where it is not the last scrape's (a
        series on the page is seen at every scrape: one time for all, not a Unix time each)."""
        at, gone = self.last_at, self.gone
        numbers = doubles(len(keys) * 2).pack(*values, *self.increase.values())
        if not gone:
            moved = "[]"
        else:
            moved = json.dumps([(i, g[2]) for i, k in enumerate(keys)
                                if (g := gone.get(k)) is not None and g[2] != at])
        return "".join((
            f'{{"base":{base},"scrapes":{self.scrapes},"last_at":{_num(at)},"values":"',
            base64.b64encode(numbers).decode(), '","seen":', moved,
            ',"gauge_weighted":', _dict_json(self.gauge_weighted),
            ',"gauge_seconds":', _dict_json(self.gauge_seconds), "}",
        ))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Accumulator:
        """Inverse of `to_dict` and of (parsed) `to_json`, with the round part `encode` wrote
        after it as `round` if the store has one; and of the earlier form, a row per series,
        which a state database written before may hold."""
        if "keys" in data:
            values = data["values"]
            rows = [(_key_from(k), *values[4 * i:4 * i + 4]) for i, k in enumerate(data["keys"])]
            part = data.get("round")
            # A round part goes with the whole row it was written against; one left over from
            # another (a version without round parts wrote the whole row since) is stale.
            if part is not None and part["base"] == data["scrapes"]:
                rows = _with_round(rows, part)
                data = dict(data) | {k: part[k] for k in _ROUND_FIELDS}
        elif "series" in data:
            rows = [(_key_from(k), v, c, inc, t) for k, v, c, inc, t in data["series"]]
        else:
            rows = None
        if rows is not None:
            data = dict(data) | {
                "last": [(k, v, c) for k, v, c, _, _ in rows if v is not None],
                "increase": [(k, inc) for k, _, _, inc, _ in rows if inc is not None],
                "seen": [(k, t) for k, _, _, _, t in rows if t is not None],
            }
        at = data["last_at"]
        seen = {_as_key(k): t for k, t in data.get("seen", [])}
        last: dict[SeriesKey, float] = {}
        created: dict[SeriesKey, float] = {}
        gone: dict[SeriesKey, tuple[float, float | None, float]] = {}
        for k, v, c in data["last"]:
            key = _as_key(k)
            t = seen.get(key, at)
            if t is None or t == at:  # read at the last usable scrape: on its page
                last[key] = v
                if c is not None:
                    created[key] = c
            else:
                gone[key] = (v, c, t)
        return cls(
            last=last,
            created=created,
            gone=gone or NO_ITEMS,
            increase={_as_key(k): v for k, v in data["increase"]},
            resets=data["resets"],
            scrapes=data["scrapes"],
            first_at=data["first_at"],
            last_at=data["last_at"],
            engines=_engines(frozenset(data["engines"])),
            dialect=data.get("dialect", ""),
            packed_before=pack_counts(Counts.from_raw(data["before"])) if data.get("before")
            else None,
            reset_spans=[tuple(span) for span in data.get("reset_spans", [])] or (),
            gauge_weighted=dict(data.get("gauge_weighted", {})) or NO_ITEMS,
            gauge_seconds=dict(data.get("gauge_seconds", {})) or NO_ITEMS,
            **dict(zip(
                ("anomalies_before", "anomalies_inside", "anomalies_after"),
                (AnomalyTally.from_dict(t) for t in data.get("anomalies", [None] * 3)),
                strict=True,
            )),
        )


@functools.lru_cache(maxsize=1024)
def _shared_keys(keys: tuple[SeriesKey, ...]) -> tuple[SeriesKey, ...]:
    """One tuple for equal tuples of series keys (an open window's targets serving one model
    have the same series)."""
    return keys


@functools.lru_cache(maxsize=1024)
def _engines(names: frozenset[str]) -> frozenset[str]:
    """One frozenset for equal sets of engine names: every accumulator of a fleet serving one
    engine holds the same one (a set of its own was ~0.2 KB an accumulator)."""
    return names


def _engine_of(key: SeriesKey) -> Engine:
    """The series' engine: what restarts as one (per model and extra labels too)."""
    return key.model_name, key.engine, key.extra


def _key_list(key: SeriesKey) -> list[Any]:
    return [key.field.value, key.model_name, key.engine, key.position, [list(p) for p in key.extra]]


_NO_VALUE: tuple[None, None] = (None, None)  # a series with an increase but no last value
# What a round part holds besides its series' numbers (`Accumulator._round_json`).
_ROUND_FIELDS = ("scrapes", "last_at", "gauge_weighted", "gauge_seconds")

# A series as a whole row holds it: key, value, created, increase, seen.
_Row = tuple[SeriesKey, Any, Any, Any, Any]


def _with_round(rows: list[_Row], part: Mapping[str, Any]) -> list[_Row]:
    """A whole row's series with a later round part's values, increases and seen times."""
    numbers, at, n = base64.b64decode(part["values"], validate=True), part["last_at"], len(rows)
    if len(numbers) != 16 * n:
        raise ValueError(f"round part has {len(numbers) / 8:g} numbers for {n} series (2 each)")
    values = doubles(2 * n).unpack(numbers)
    seen = {i: t for i, t in part["seen"]}
    return [(k, values[i], c, values[n + i], seen.get(i, at))
            for i, (k, _, c, _, _) in enumerate(rows)]


def _dict_json(gauges: Mapping[str, float]) -> str:
    return json.dumps(_writable(gauges)) if gauges else "{}"


def _tally_json(tally: AnomalyTally) -> str:
    if not tally.count:
        return '{"count":0,"first":null,"last":null}'
    return json.dumps(tally.to_dict())


@functools.lru_cache(maxsize=65536)
def _key_json(key: SeriesKey) -> str:
    return json.dumps(_key_list(key))


def _num(value: float | None) -> str:
    # repr is JSON for finite floats; json.dumps spells None, NaN and infinities as it reads them.
    return repr(value) if value is not None and math.isfinite(value) else json.dumps(value)


def _as_key(data: Sequence[Any] | SeriesKey) -> SeriesKey:
    return data if isinstance(data, SeriesKey) else _key_from(data)


def _key_from(data: Sequence[Any]) -> SeriesKey:
    fld, model, engine, position, extra = data
    return SeriesKey(Field(fld), model, engine, position, tuple(tuple(p) for p in extra))


# A live track's point as kept: its time, then the totals packed (`snapshot.pack_counts`; the
# positions' tuple shared by consecutive points).
Packed = tuple[float, bytes, tuple[int, ...], Mapping[int, float] | None]
Point = tuple[float, Counts]


def _pack(at: float, counts: Counts, positions: tuple[int, ...]) -> Packed:
    return at, *pack_counts(counts, positions)


def _unpack(packed: Packed) -> Point:
    return packed[0], unpack_counts(packed[1:])


@dataclass
class LiveTrack:
    """A target's cumulative increase at its scrapes, kept for `span` seconds: live gauges.

    Scrapes less than `spacing` apart are thinned (targets.py sets half the scrape interval):
    window markers scrape every target between the regular rounds, and back-to-back windows
    kept several times the regular rhythm's points, so memory grew with the marker rate. Of
    two kept points but the newest two, the later is at least `spacing` after the earlier, so
    a track holds fewer than `span / spacing` + 4 points. The newest two are always kept: the
    span's end is the last scrape, and the gap between them is the target's last gap between
    scrapes (exposition.py reads it). A thinned scrape lay less than `spacing` after a kept
    one, so the span's start (the last kept point at or before `now - span`) is less than
    `spacing` earlier than the last scrape there; with `spacing` half the scrape interval,
    finer than the regular rhythm resolves it anyway.

    `points` are kept packed (`Packed`, ~0.24 KB, where a `Counts` with its two dicts is
    ~0.9 KB and a dozen objects): a point's time is its first item. `span_ends` hands out
    (time, `Counts`) pairs, made from a packed point when it becomes the span's start.
    """

    span: float
    spacing: float = 0.0
    accumulator: Accumulator = field(default_factory=Accumulator)
    points: deque[Packed] = field(default_factory=deque)
    # The newest point unpacked (its totals are the accumulator's), and the last start point
    # `span_ends` unpacked, with the packed point it came from: the same pairs while the
    # span's ends stay, so readers can cache by their identity.
    _newest: Point | None = field(default=None, init=False, repr=False, compare=False)
    _start: tuple[Packed, Point] | None = field(
        default=None, init=False, repr=False, compare=False)

    def feed(self, snapshot: Snapshot, at: float) -> None:
        """Take one scrape; forget points older than `span` needs; thin close ones (see above)."""
        self.accumulator.feed(snapshot, at)
        totals = self.accumulator.totals()
        points = self.points
        # The point about to be third from the end is judged once, now: kept only if at least
        # `spacing` after the one before it (itself kept by then).
        if len(points) > 2 and points[-2][0] - points[-3][0] < self.spacing:
            newest = points.pop()
            points[-1] = newest
        positions = tuple(totals.per_position)
        if points and points[-1][2] == positions:
            positions = points[-1][2]  # one tuple for the track's points while they agree
        points.append(_pack(at, totals, positions))
        self._newest = (at, totals)
        # Keep one point at or before the window's start so the span is fully covered.
        while len(points) > 2 and points[1][0] <= at - self.span:
            points.popleft()

    def over_span(self, now: float) -> Counts | None:
        """Increase over the last `span` seconds, or None with fewer than two scrapes in it."""
        ends = self.span_ends(now)
        return None if ends is None else ends[1][1] - ends[0][1]

    def span_ends(self, now: float) -> tuple[Point, Point] | None:
        """The (time, totals) points `over_span` subtracts; the same objects until one of them
        changes, so a reader can cache what it derives from them."""
        points = self.points
        if len(points) < 2 or self._newest is None:
            return None
        start = points[0]
        for point in points:
            if point[0] <= now - self.span:
                start = point
            else:
                break
        if points[-1][0] <= start[0]:
            return None
        made = self._start
        if made is None or made[0] is not start:
            made = self._start = (start, _unpack(start))
        return made[1], self._newest
