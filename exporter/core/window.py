"""Benchmark windows: their ids, per-target accumulators, and the state that must survive us."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.core.accrows import Encoded
from exporter.core.counting import Accumulator
from exporter.core.errors import RequestError
from exporter.core.perrequest import PerRequest, RequestStats
from exporter.core.redact import redact_url
from exporter.core.requestblock import per_request_block
from exporter.core.snapshot import ScrapeResult

# Ids name directories of results: letters, digits and . _ - only, so no path can escape.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_NAME = 256
# A window's results go to output_dir/<id>: an id must not name what else lives there.
RESERVED_IDS = frozenset({"state.sqlite", "state.sqlite-wal", "state.sqlite-shm",
                          "state.sqlite-journal", "exporter.lock"})
# A target's note when a series counting before its baseline was off the baseline's page.
UNSEEN_AT_BASELINE = ("a counter series already counting at the first usable scrape was not on "
                      "its page: counted from when it first showed")
MAX_SERIES_POINTS = 720  # per target; past it every other point goes (resolution halves)


def check_window_id(value: object) -> str:
    """A client-given id, or `RequestError` saying which rule it breaks."""
    # fullmatch: `$` would let a trailing newline through into a directory name.
    if not isinstance(value, str) or not _ID.fullmatch(value) or ".." in value:
        raise RequestError(
            "id must be 1-128 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '..'"
        )
    if value.lower() in RESERVED_IDS:  # lower: a case-insensitive filesystem
        raise RequestError(f"id {value!r} names a file of the exporter's own in output_dir")
    return value


def new_window_id(now: float) -> str:
    """A fresh id that sorts by start time: `w-20261202-134501-3fa2c1`."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    return f"w-{stamp}-{secrets.token_hex(3)}"


@dataclass
class TargetRef:
    """What a window remembers of a target, even if the config later drops it."""

    name: str
    url: str  # for display only, so without credentials: the scrape uses the target's config
    host_port: str

    def __post_init__(self) -> None:
        self.url = redact_url(self.url)


Row = tuple[str, str, str]  # (window id, target, JSON)


@dataclass
class AccumulatorRows:
    """Accumulator rows for one transaction: whole rows and round parts (`Accumulator.encode`)."""

    whole: list[Row] = field(default_factory=list)
    rounds: list[Row] = field(default_factory=list)
    _encoded: list[tuple[Window, str, Accumulator, Encoded]] = field(default_factory=list)

    def add(self, window: Window, targets: Iterable[str] | None = None, *,
            whole: bool = False) -> AccumulatorRows:
        """The given targets' accumulators of `window` (default: all), each its round part if it
        can, or `whole`; these rows, so a window's alone are `AccumulatorRows().add(window)`."""
        for target in window.accumulators if targets is None else targets:
            if (acc := window.accumulators.get(target)) is not None:
                encoded = acc.encode(whole=whole)
                rows = self.whole if encoded.whole else self.rounds
                rows.append((window.id, target, encoded.text))
                self._encoded.append((window, target, acc, encoded))
        return self

    def committed(self) -> None:
        """The store holds these rows now."""
        for window, target, acc, encoded in self._encoded:
            acc.saved(encoded)
            window.dirty.discard(target)


@dataclass
class Window:
    """One benchmark window: open until stopped; then `answer` holds the stop answer."""

    id: str
    name: str
    targets: dict[str, TargetRef]
    labels: dict[str, str]
    started_at: float
    stopped_at: float | None = None
    accumulators: dict[str, Accumulator] = field(default_factory=dict)
    start_errors: dict[str, str] = field(default_factory=dict)
    stop_errors: dict[str, str] = field(default_factory=dict)
    last_errors: dict[str, str] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)  # target -> why it left the window
    downtimes: list[tuple[float, float]] = field(default_factory=list)  # exporter not running
    # Per target and scrape, (at, drafts, draft tokens, accepted) since the baseline; saved
    # with the closed window only.
    series: dict[str, list[tuple[float, float, float, float]]] = field(default_factory=dict)
    answer: dict[str, Any] | None = None
    # Targets whose baseline came after the start (a restore found none) or missed a series
    # (`UNSEEN_AT_BASELINE`): partial, saying why.
    late_baselines: dict[str, str] = field(default_factory=dict)
    # What the recording proxy saw of each target's requests (only targets it saw).
    per_request: dict[str, PerRequest] = field(default_factory=dict)
    # The `edges` block of a window bounded by the traffic (None: by its start and stop).
    edges: dict[str, Any] | None = None
    # Targets whose accumulator changed since it was last saved (not saved itself).
    dirty: set[str] = field(default_factory=set, compare=False, repr=False)
    # Requests recorded since the window's state was last saved.
    records_dirty: bool = field(default=False, compare=False, repr=False)
    # Targets whose stop scrape is in, while a stop is under way: a later scrape is not the
    # window's (an older count fed after it would look like a restart).
    finals: set[str] = field(default_factory=set, compare=False, repr=False)

    @property
    def is_open(self) -> bool:
        """Not stopped yet."""
        return self.stopped_at is None

    def takes_scrapes_of(self, target: str) -> bool:
        """Periodic scrapes (and proxied requests) count only once the target's baseline is
        taken, until its stop scrape or removal."""
        return (
            self.is_open
            and target in self.targets
            and target not in self.removed
            and target not in self.finals
            and (target in self.accumulators or target in self.start_errors
                 or target in self.late_baselines)
        )

    def feed(self, result: ScrapeResult) -> bool:
        """Take one scrape of one of the window's targets; whether it showed a server restart."""
        if result.snapshot is None:
            self.last_errors[result.target] = result.error or "scrape failed"
            return False
        self.last_errors.pop(result.target, None)
        acc = self.accumulators.setdefault(result.target, Accumulator())
        unseen = acc.unseen_at_baseline
        reset = acc.feed(result.snapshot, result.at)
        if acc.unseen_at_baseline > unseen and result.target not in self.late_baselines:
            self.late_baselines[result.target] = UNSEEN_AT_BASELINE
            self.records_dirty = True  # the note is in the window's row, saved with the round
        self.dirty.add(result.target)
        if (tally := self.per_request.get(result.target)) is not None:
            tally.scraped(result.at, reset)
        # Not kept: a `Counts` a target held while the window is open.
        totals = acc.totals(cached=False)
        points = self.series.setdefault(result.target, [])
        points.append((result.at, totals.drafts, totals.draft_tokens, totals.accepted))
        if len(points) > MAX_SERIES_POINTS:
            points[:] = points[:-1:2] + points[-1:]
        return reset

    def record(self, target: str, stats: RequestStats, at: float) -> None:
        """One proxied request of `target`, finished at `at`."""
        self.per_request.setdefault(target, PerRequest()).record(stats, at)
        self.records_dirty = True

    def take_baseline(self, results: list[ScrapeResult]) -> None:
        """The start scrapes: a baseline per target, or the reason there is none."""
        for result in results:
            if result.ok:
                self.feed(result)
            else:
                self.start_errors[result.target] = result.error or "scrape failed"

    def take_stop_scrape(self, result: ScrapeResult, takes: bool | None = None) -> None:
        """One target's stop scrape; the window takes no other scrape of it after. `takes`:
        whether it counts, as `takes_scrapes_of` said as it came (one held meanwhile)."""
        if takes is None:
            takes = self.takes_scrapes_of(result.target)
        self.finals.add(result.target)
        if result.snapshot is None:  # not `ok`: spelled out so the type checker narrows
            self.stop_errors[result.target] = result.error or "scrape failed"
        elif takes:
            self.feed(result)
            acc = self.accumulators.get(result.target)
            if not result.snapshot.has_spec_decode and acc is not None and acc.has_series:
                self.stop_errors[result.target] = "no spec decode series on the page"

    def hold_stop_scrape(self, target: str) -> bool:
        """A stop scrape another copy of the window takes (a stop's child): the window takes no
        other scrape of `target` after; whether it counts, for `take_stop_scrape` if it is
        taken here after all."""
        takes = self.takes_scrapes_of(target)
        self.finals.add(target)
        return takes

    def reopen(self, stop_errors: Mapping[str, str]) -> None:
        """Open again after a failed stop, its stop errors as before it (its scrapes stay)."""
        self.stopped_at = None
        self.stop_errors = dict(stop_errors)
        self.finals.clear()

    def baseline_at_restore(self) -> None:
        """Targets a restored window has no baseline for take it from their next scrape."""
        for name in self.targets:
            if (name not in self.accumulators and name not in self.start_errors
                    and name not in self.removed):
                self.late_baselines[name] = (
                    "no baseline was saved before the exporter stopped; "
                    "counted from the first scrape after its restart"
                )

    def live_targets(self) -> list[str]:
        """Targets still in the window (not removed)."""
        return [n for n in self.targets if n not in self.removed]

    def as_answer_only(self) -> Window:
        """The stopped window without its per-series state: what memory keeps of it."""
        return Window(
            id=self.id, name=self.name, targets=self.targets, labels=self.labels,
            started_at=self.started_at, stopped_at=self.stopped_at, answer=self.answer,
        )

    def last_seen(self) -> float:
        """The newest scrape any target fed, or the start: what a restored window last knew."""
        times = [a.last_at for a in self.accumulators.values() if a.last_at is not None]
        return max(times, default=self.started_at)

    def summary(self) -> dict[str, Any]:
        """The start answer: id, name, targets, started_at (and labels)."""
        return {
            "id": self.id,
            "name": self.name,
            "targets": list(self.targets),
            "labels": self.labels,
            "started_at": self.started_at,
        }

    def state(self) -> dict[str, Any]:
        """The GET answer: the stop answer once stopped, else the open state."""
        if self.answer is not None:
            return self.answer
        state = self.summary() | {
            "stopped_at": None,
            "status": "open",
            "scrapes": {t: a.scrapes for t, a in self.accumulators.items()},
            "errors": dict(self.last_errors),
        }
        if self.edges is not None:
            state["edges"] = self.edges
        if (per_request := per_request_block(self.per_request)) is not None:
            state["per_request"] = per_request
        return state

    def to_dict(self) -> dict[str, Any]:
        """JSON-able durable state (without the accumulators: the store keeps them in rows)."""
        return {
            "id": self.id,
            "name": self.name,
            "targets": {n: [r.url, r.host_port] for n, r in self.targets.items()},
            "labels": self.labels,
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
            "accumulators": {},
            "start_errors": self.start_errors,
            "stop_errors": self.stop_errors,
            "last_errors": self.last_errors,
            "removed": self.removed,
            "downtimes": [list(d) for d in self.downtimes],
            "series": {t: [list(p) for p in ps] for t, ps in self.series.items()}
            if not self.is_open else {},
            "answer": self.answer,
            "late_baselines": self.late_baselines,
            # An open window's: a stopped one's answer holds its block.
            "per_request": {t: acc.to_dict() for t, acc in self.per_request.items()}
            if self.is_open else {},
            "edges": self.edges if self.is_open else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Window:
        """Inverse of `to_dict`."""
        return cls(
            id=data["id"],
            name=data["name"],
            targets={n: TargetRef(n, u, hp) for n, (u, hp) in data["targets"].items()},
            labels=dict(data["labels"]),
            started_at=data["started_at"],
            stopped_at=data["stopped_at"],
            accumulators={t: Accumulator.from_dict(a) for t, a in data["accumulators"].items()},
            start_errors=dict(data["start_errors"]),
            stop_errors=dict(data["stop_errors"]),
            last_errors=dict(data["last_errors"]),
            removed=dict(data["removed"]),
            downtimes=[tuple(d) for d in data["downtimes"]],
            # Left out where the store read a stopped window without its series.
            series={t: [tuple(p) for p in ps] for t, ps in data.get("series", {}).items()},
            answer=data["answer"],
            late_baselines=dict(data["late_baselines"]),
            per_request={t: PerRequest.from_dict(a) for t, a in data["per_request"].items()},
            edges=data["edges"],
        )
