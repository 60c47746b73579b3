"""Counters over time: exact, reset-safe increases from the sequence of scrapes we took.

Prometheus's `increase()` extrapolates between samples; we see every scrape of a window, so we
can be exact: between two scrapes a series grows by `now - before`, unless the server restarted
(the value went down, or its `_created` changed), in which case it grew by `now` from zero.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.core.accrows import Packed, Point, RowCodec, Shape, fields_of
from exporter.core.aisbench import restart_time, restart_times
from exporter.core.anomaly import NO_ANOMALIES, AnomalyTally, find_anomaly
from exporter.core.empties import NO_ITEMS, shared_engines, writable
from exporter.core.loadbands import Bands, interval_band, with_interval
from exporter.core.snapshot import (
    Counts,
    Engine,
    PackedCounts,
    SeriesKey,
    Snapshot,
    counts_by_model,
    pack_counts,
    sum_series,
    unpack_counts,
)

# Series gone from the page are remembered (their last value, to count from if they return)
# up to this many per accumulator; a real server's model or engine leaving stays far below it.
MAX_ABSENT_SERIES = 4096
# The model name under which retired series' increases are kept (no real name has brackets).
RETIRED_MODEL = "(series no longer on the page)"


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


@dataclass(slots=True)
class Accumulator(RowCodec):
    """Increases of one target's series since a baseline scrape, fed scrape by scrape; `last`
    and `created` are the last usable snapshot's own mappings (shared: never mutated)."""

    last: Mapping[SeriesKey, float] = field(default_factory=dict)
    created: Mapping[SeriesKey, float] = field(default_factory=dict)
    increase: dict[SeriesKey, float] = field(default_factory=dict)
    resets: int = 0
    scrapes: int = 0
    first_at: float | None = None
    last_at: float | None = None
    engines: frozenset[str] = frozenset()  # one set shared by all alike (`shared_engines`)
    dialect: str = ""
    read: str = ""  # how the last usable page was asked for (`Snapshot.read`)
    packed_before: PackedCounts | None = None  # the baseline's totals (read as `before`)
    # (prev scrape, seen) of each restart. Containers most leave empty start as shared empty
    # ones (`NO_ITEMS`, `NO_ANOMALIES`): replaced, never written.
    reset_spans: Sequence[tuple[float, float]] = ()
    # When each restart of `reset_spans` happened by its series' `_created` (or None).
    restart_times: Sequence[float | None] = ()
    # Series off the last usable page: (last value, `_created`, when read), to count on from.
    gone: Mapping[SeriesKey, tuple[float, float | None, float]] = field(
        default_factory=lambda: NO_ITEMS)
    # Interval gauges (SGLang's acceptance, V0's rates), time-weighted: per gauge name,
    # sum(value * dt) and sum(dt) over the intervals between consecutive scrapes.
    gauge_weighted: Mapping[str, float] = field(default_factory=lambda: NO_ITEMS)
    gauge_seconds: Mapping[str, float] = field(default_factory=lambda: NO_ITEMS)
    # Scrapes with an unusable counter value, not taken: before the first usable one, bridged
    # inside, and after the last.
    anomalies_before: AnomalyTally = NO_ANOMALIES
    anomalies_inside: AnomalyTally = NO_ANOMALIES
    anomalies_after: AnomalyTally = NO_ANOMALIES
    # Each interval's increase by its running-requests band (`loadbands`), and the gauge's
    # reading at the last usable scrape (None: the page had none).
    by_load: Bands = field(default_factory=lambda: NO_ITEMS)
    running: float | None = None
    # The band and increase of the last interval fed (None: a baseline or an unusable scrape);
    # not saved.
    last_interval: tuple[int, Counts] | None = field(
        default=None, init=False, repr=False, compare=False)
    # Whether `by_load` is kept: a live track keeps its span's intervals itself; not saved.
    keeps_bands: bool = field(default=True, repr=False, compare=False)
    # `totals()` since the last `feed` (the only place the increases change).
    _totals: Counts | None = field(default=None, init=False, repr=False, compare=False)
    # The whole row's shape and scrapes as the store last committed it (`saved`).
    _saved: tuple[Shape, int] | None = field(default=None, init=False, repr=False, compare=False)
    # Calls of `feed`: what was made from this accumulator is out of date once it moved.
    feeds: int = field(default=0, init=False, repr=False, compare=False)
    # Series first seen after the baseline though created before it (not kept: the window
    # keeps the note it makes).
    unseen_at_baseline: int = field(default=0, init=False, repr=False, compare=False)

    def feed(self, snapshot: Snapshot, at: float) -> bool:
        """Take one scrape; whether it showed a server restart. One with a NaN, infinite or
        negative counter is only tallied, so every figure covers the same span."""
        prior, self._totals = self._totals, None
        self.feeds += 1
        self.last_interval = None
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
            if prior is None:
                prior = self.totals(cached=False)
            renamed = self._carry_relabelled(snapshot)
            if self.anomalies_after.count:  # else nothing to move
                self.anomalies_inside = self.anomalies_inside.joined(self.anomalies_after)
                self.anomalies_after = NO_ANOMALIES
        bounds, in_last = self._restart_bounds(snapshot)
        self._apply(snapshot, bounds, baseline, in_last, renamed)
        reset = bool(bounds)
        self._retire_absent()
        self._feed_gauges(snapshot, at, baseline)
        if prior is not None and not baseline:
            # The interval since the last usable scrape (whose totals were `prior`) into its
            # running-requests band: its increase as the totals count it, restarts included.
            interval = self.last_interval = (interval_band(self.running, snapshot.running),
                                             self.totals() - prior)
            if self.keeps_bands:
                self.by_load = with_interval(self.by_load, *interval)
        self.running = snapshot.running
        if baseline:
            self.packed_before = pack_counts(sum_series(snapshot.values.items()))
        if reset:
            prev = self.last_at or at
            self.resets += 1
            created = [c for k, c in snapshot.created.items() if _engine_of(k) in bounds]
            self.restart_times = [*restart_times(self.reset_spans, self.restart_times),
                                  restart_time(created, prev, at)]
            self.reset_spans = [*self.reset_spans, (prev, at)]
        self.scrapes += 1
        if self.first_at is None:
            self.first_at = at
        self.last_at = at
        if snapshot.has_spec_decode:
            self.dialect = snapshot.dialect
        if snapshot.read:
            self.read = snapshot.read
        return reset

    def _restart_bounds(self, snapshot: Snapshot) -> tuple[dict[Engine, float], int]:
        """Per restarted engine, the latest time a series of it was seen before the restart;
        and how many of the page's series are on the last usable scrape's page."""
        values, created = snapshot.values, snapshot.created
        last, last_created, gone = self.last, self.created, self.gone
        last_at = self.last_at or 0.0  # when the series in `last` were read
        # A restart zeroes an engine's counters at once, but a small one can be past its old
        # value by the next scrape: every series of a restarted engine last seen no later than
        # the one that shows it counts from zero too.
        bounds: dict[Engine, float] = {}
        in_last = 0  # of this page's series, those on the last usable scrape's page
        if not gone and created == last_created:
            # Every `_created` as at the last scrape (NaN ones the same objects, so equal): only
            # a value gone down shows a restart.
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
        return bounds, in_last

    def _apply(self, snapshot: Snapshot, bounds: Mapping[Engine, float], baseline: bool,
               in_last: int, renamed: set[SeriesKey]) -> None:
        """Add each series' increase since the last usable scrape (from zero in an engine of
        `bounds`), and keep apart the series of that scrape off this page."""
        values, created = snapshot.values, snapshot.created
        last, last_created, gone = self.last, self.created, self.gone
        last_at = self.last_at or 0.0  # when the series in `last` were read
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
            elif created.get(key, math.nan) < (self.first_at or 0.0):  # NaN: not known
                # Created before the baseline but off its page: what it had then is unknown,
                # so it counts from here (`unseen_at_baseline` makes the answer partial).
                inc = 0.0
                self.unseen_at_baseline += 1
            else:
                # A series first seen after the baseline (a new engine, or one that restarted
                # while absent) grew from zero inside the window.
                inc = value
            # Zero increases are kept too: a position nobody reached shows as 0, not missing.
            if key not in increase:
                increase[key] = 0.0 + inc if inc else 0.0
            elif inc:
                increase[key] += inc
            if key.engine not in self.engines:
                self.engines = shared_engines(self.engines | {key.engine})
        if in_last < len(last):
            own = self._own_gone()  # series of the last usable page off this one
            for key, value in last.items():
                if key not in values and key not in renamed:
                    own[key] = (value, last_created.get(key), last_at)
        self.last, self.created = values, created

    def _feed_gauges(self, snapshot: Snapshot, at: float, baseline: bool) -> None:
        # An interval gauge read at a scrape describes the time before it (SGLang's covers its
        # last logging interval), so it weighs the interval since the previous scrape; the
        # baseline's value describes time before the window and weighs nothing.
        if baseline or self.last_at is None or at <= self.last_at:
            return
        dt = at - self.last_at
        for name, value in snapshot.gauges.items():
            if math.isfinite(value):
                weighted = self.gauge_weighted = writable(self.gauge_weighted)
                seconds = self.gauge_seconds = writable(self.gauge_seconds)
                weighted[name] = weighted.get(name, 0.0) + value * dt
                seconds[name] = seconds.get(name, 0.0) + dt

    def gauge_means(self) -> dict[str, float]:
        """Each interval gauge's time-weighted mean over the scrapes since the baseline."""
        return {
            name: self.gauge_weighted[name] / seconds
            for name, seconds in sorted(self.gauge_seconds.items())
            if seconds > 0
        }

    def _carry_relabelled(self, snapshot: Snapshot) -> set[SeriesKey]:
        """A series that gains (or loses) its `engine` label is the same series renamed: its
        state moves to the new name (in `gone`); returns the old names taken from `last`."""
        last, gone, values = self.last, self.gone, snapshot.values
        renamed: set[SeriesKey] = set()
        # Built once per scrape and only if needed: renaming must not cost new x known.
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
        """Forget the oldest absent series past MAX_ABSENT_SERIES; their increase moves to one
        retired key per counter and position."""
        if len(self.gone) <= MAX_ABSENT_SERIES:
            return
        gone = self._own_gone()
        oldest = sorted(gone, key=lambda k: gone[k][2])
        for key in oldest[: len(gone) - MAX_ABSENT_SERIES]:
            del gone[key]
            increase = self.increase.pop(key, 0.0)
            retired = SeriesKey(key.field, RETIRED_MODEL, "", key.position)
            self.increase[retired] = self.increase.get(retired, 0.0) + increase

    def _own_gone(self) -> dict[SeriesKey, tuple[float, float | None, float]]:
        """`gone` to write in: a dict of this accumulator's own (not the shared empty one)."""
        gone = self.gone = writable(self.gone)
        return gone

    @property
    def before(self) -> Counts | None:
        """The baseline scrape's totals (AISBench's `before`); None before a baseline."""
        return None if self.packed_before is None else unpack_counts(self.packed_before)

    @property
    def has_series(self) -> bool:
        """Whether a counter series was read: on the last usable scrape's page or before."""
        return bool(self.last) or bool(self.gone)

    def totals(self, *, cached: bool = True) -> Counts:
        """The increase since the baseline, summed; kept until the next `feed` if `cached`."""
        if self._totals is not None:
            return self._totals
        totals = sum_series(self.increase.items())
        if cached:
            self._totals = totals
        return totals

    def by_model(self) -> dict[str, Counts]:
        """The increase since the baseline, per model name."""
        models = {key.model_name for key in self.increase}
        if len(models) == 1:  # its sum is `totals()`, already summed
            return {models.pop(): self.totals()}
        return counts_by_model(self.increase)

    def current(self) -> Counts:
        """The last counter values seen (off the last page too), summed: AISBench's `after`."""
        return sum_series([*self.last.items(), *((k, g[0]) for k, g in self.gone.items())])

    @property
    def model_names(self) -> list[str]:
        """Model names whose series this accumulator has seen."""
        return sorted({k.model_name for k in (*self.last, *self.gone)})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Accumulator:
        """Inverse of (parsed) `to_json` (`accrows.fields_of`)."""
        return cls(**fields_of(data))


def _engine_of(key: SeriesKey) -> Engine:
    """The series' engine: what restarts as one (per model and extra labels too)."""
    return key.model_name, key.engine, key.extra


@dataclass
class LiveTrack:
    """A target's cumulative increase at its scrapes over `span` seconds (live gauges), packed.

    Points less than `spacing` apart are thinned (fewer than `span / spacing` + 4 kept), but
    the newest two stay: exposition reads their gap as the target's last scrape interval.
    """

    span: float
    spacing: float = 0.0
    accumulator: Accumulator = field(default_factory=lambda: Accumulator(keeps_bands=False))
    points: deque[Packed] = field(default_factory=deque)
    # (time, band, increase) of each interval after the oldest point: the span's by band.
    loads: deque[tuple[float, int, Counts]] = field(default_factory=deque)
    # The newest point and the last start point unpacked: the same pairs while the span's
    # ends stay, so readers can cache by their identity.
    _newest: Point | None = field(default=None, init=False, repr=False, compare=False)
    _start: tuple[Packed, Point] | None = field(
        default=None, init=False, repr=False, compare=False)

    def feed(self, snapshot: Snapshot, at: float) -> None:
        """Take one scrape; forget points older than `span` needs; thin close ones."""
        before = self._newest
        self.accumulator.feed(snapshot, at)
        totals = self.accumulator.totals()
        if before is not None and (interval := self.accumulator.last_interval) is not None:
            self.loads.append((at, *interval))
        points = self.points
        # The point about to be third from the end is kept only if `spacing` after the one before.
        if len(points) > 2 and points[-2][0] - points[-3][0] < self.spacing:
            newest = points.pop()
            points[-1] = newest
        positions = tuple(totals.per_position)
        if points and points[-1][2] == positions:
            positions = points[-1][2]  # one tuple for the track's points while they agree
        points.append((at, *pack_counts(totals, positions)))
        self._newest = (at, totals)
        # Keep one point at or before the window's start so the span is fully covered.
        while len(points) > 2 and points[1][0] <= at - self.span:
            points.popleft()
        while self.loads and self.loads[0][0] <= points[0][0]:
            self.loads.popleft()

    def over_span(self, now: float) -> Counts | None:
        """Increase over the last `span` seconds, or None with fewer than two scrapes in it."""
        ends = self.span_ends(now)
        return None if ends is None else ends[1][1] - ends[0][1]

    def span_bands(self, now: float) -> dict[int, Counts]:
        """The increase over the span `span_ends` covers, by running-requests band."""
        ends = self.span_ends(now)
        bands: dict[int, Counts] = {}
        if ends is not None:
            for at, band, increase in self.loads:
                if ends[0][0] < at <= ends[1][0]:
                    bands[band] = bands[band] + increase if band in bands else increase
        return bands

    def span_ends(self, now: float) -> tuple[Point, Point] | None:
        """The (time, totals) points `over_span` subtracts: the same objects until one changes,
        so readers can cache by them."""
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
            made = self._start = (start, (start[0], unpack_counts(start[1:])))
        return made[1], self._newest
