"""Windows bounded by the traffic (`"edges": "traffic"`), driven through the window book: each
model's first `skip_requests` generation requests on a target (its warm-up) stay out; the window
starts before the first measured request is forwarded, and each other target takes its baseline
before its own first measured one; a warm-up on a target the window counts goes between its
measured requests, the counts it adds taken off; a target idle again is scraped, the window
ends there (a stop takes it: counts after the last response stay out) and still takes the later
scrapes that show no count since, until its next request."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from exporter.config.model import Config, TargetConfig
from exporter.core.errors import RequestError
from exporter.core.isotime import iso_utc
from exporter.core.perrequest import RequestStats
from exporter.core.snapshot import ScrapeResult, SeriesKey, Snapshot
from exporter.core.window import Window, new_window_id
from exporter.server.book import WindowBook

log = logging.getLogger(__name__)


class Host(Protocol):
    """What the edges ask of the running exporter (`ExporterService`)."""

    book: WindowBook
    clock: Callable[[], float]

    @property
    def config(self) -> Config: ...

    def resolve(self, names: list[str] | None, window_id: str) -> list[TargetConfig]: ...

    def start_window(self, window_id: str | None, name: str | None, targets: list[str] | None,
                     labels: dict[str, str] | None, *, late: Iterable[str] = ()
                     ) -> Awaitable[tuple[bool, Window]]: ...

    def scrape_target(self, name: str, *, feed: Iterable[Window] | None = None,
                      also: Callable[[ScrapeResult], None] | None = None
                      ) -> Awaitable[ScrapeResult]: ...

    def scrape_for_window(self, names: list[str], others: list[Window],
                          then: Callable[[ScrapeResult], None] | None
                          ) -> Awaitable[list[ScrapeResult]]: ...


@dataclass
class TrafficWindow:
    """One window with traffic edges: waiting for its first measured request, then open."""

    id: str
    name: str | None
    targets: list[str]
    labels: dict[str, str]
    skip: int
    # Generation requests per (target, model): each model's first `skip` are its warm-up.
    arrived: dict[tuple[str, str], int] = field(default_factory=dict)
    skipping: dict[str, int] = field(default_factory=dict)  # skipped ones not done, per target
    warmed: dict[str, asyncio.Event] = field(default_factory=dict)  # no skipped one left
    quiet: dict[str, asyncio.Event] = field(default_factory=dict)  # no measured one in flight
    started: asyncio.Task[None] | None = None
    failed: str | None = None  # why the book refused the start
    joined: dict[str, asyncio.Future[None]] = field(default_factory=dict)  # baselines taken
    first_request_at: float | None = None
    last_response_at: float | None = None
    in_flight: dict[str, int] = field(default_factory=dict)  # measured, per target
    generation: dict[str, int] = field(default_factory=dict)  # measured arrivals, per target
    held: set[str] = field(default_factory=set)  # all done: it ends at `ends` (see `seen`)
    ends: dict[str, ScrapeResult] = field(default_factory=dict)  # raw, as each was held
    ending: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # A warm-up on a target the open window counts: the scrape before it (`pausing` takes it),
    # the one after (`rebasing`, at the next measured request), what they differ by (`shifts`).
    before: dict[str, ScrapeResult] = field(default_factory=dict)
    pausing: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    rebasing: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    shifts: dict[str, Shift] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return self.started is not None and self.started.done() and self.failed is None

    def warmed_up(self, target: str) -> asyncio.Event:
        """Set while none of the target's skipped requests is waiting or in flight."""
        return _flag(self.warmed, target, not self.skipping.get(target))

    def idle(self, target: str) -> asyncio.Event:
        """Set while none of the target's measured requests is in flight."""
        return _flag(self.quiet, target, not self.in_flight.get(target))

    def counting(self, target: str) -> bool:
        """Whether the open window has the target's baseline (its later warm-ups are paused)."""
        return self.open and target in self.joined and self.joined[target].done()

    def shifted(self, result: ScrapeResult) -> ScrapeResult:
        """The scrape with the warm-ups inside the window taken off (until a server restart)."""
        shift = self.shifts.get(result.target)
        if shift is None:
            return result
        seen = shift.applied(result)
        if seen is None:
            del self.shifts[result.target]  # the restart erased them with the rest
            return result
        return seen

    def block(self, ended_by: str) -> dict[str, Any]:
        """What the answer says of the edges."""
        first, last = self.first_request_at, self.last_response_at
        return {"edges": "traffic", "skip_requests": self.skip,
                "skipped": sum(min(n, self.skip) for n in self.arrived.values()),
                "measured_requests": sum(max(0, n - self.skip) for n in self.arrived.values()),
                "first_request_at": first, "last_response_at": last,
                "first_request_at_iso": iso_utc(first) if first is not None else None,
                "last_response_at_iso": iso_utc(last) if last is not None else None,
                "ended_by": ended_by}


Ticket = tuple[TrafficWindow, str, bool]  # window, target, skipped


async def _once(tasks: dict[str, asyncio.Task[None]], target: str,
                work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """`work` run once for every caller while it runs (it removes itself from `tasks`)."""
    if target not in tasks:
        tasks[target] = asyncio.get_running_loop().create_task(work())
    await asyncio.shield(tasks[target])


def _flag(events: dict[str, asyncio.Event], target: str, on: bool) -> asyncio.Event:
    event = events.setdefault(target, asyncio.Event())
    if on:
        event.set()
    else:
        event.clear()
    return event


@dataclass(frozen=True)
class Shift:
    """What warm-ups inside an open window added to a target's counters, per series; `after`
    the scrape after the last of them: a later one below it, or with another `_created`, shows a
    server restart, which erased them (and the shift with them)."""

    offsets: Mapping[SeriesKey, float]
    after: Snapshot

    @classmethod
    def of(cls, earlier: Shift | None, before: Snapshot, after: Snapshot) -> Shift:
        """`earlier`'s offsets and the warm-ups between `before` and `after`."""
        offsets = dict(earlier.offsets) if earlier is not None else {}
        for key, value in after.values.items():
            offsets[key] = offsets.get(key, 0.0) + max(0.0, value - before.values.get(key, 0.0))
        return cls(offsets, after)

    def applied(self, result: ScrapeResult) -> ScrapeResult | None:
        """`result` less the offsets; None when it shows a restart since `after`."""
        snapshot = result.snapshot
        if snapshot is None:
            return result
        values, created = snapshot.values, snapshot.created
        if any(values.get(k, -1.0) < v or created.get(k) != self.after.created.get(k)
               for k, v in self.after.values.items()):
            return None
        less = {k: v - self.offsets.get(k, 0.0) for k, v in values.items()}
        return replace(result, snapshot=replace(snapshot, values=less))


def _unchanged(before: ScrapeResult, after: ScrapeResult) -> bool:
    """Both read, with the same counters (values and `_created`) and gauges."""
    old, new = before.snapshot, after.snapshot
    return old is not None and new is not None and (old.values, old.created, old.gauges) == (
        new.values, new.created, new.gauges)


class TrafficEdges:
    """The traffic-edged windows of this exporter, their starts and their stops."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._windows: dict[str, TrafficWindow] = {}
        # `registered` is read by the relays' thread: it sees each change made here whole.
        self._lock = threading.Lock()

    def expect(self, window_id: str | None, name: str | None, targets: list[str] | None,
               labels: dict[str, str], skip: int) -> tuple[bool, dict[str, Any]]:
        """Register a window that opens with the traffic; (created, start answer)."""
        window_id = window_id or new_window_id(self.host.clock())
        chosen = sorted(t.name for t in self.host.resolve(targets, window_id))
        known = self._windows.get(window_id)
        if known is not None:
            if (known.name, known.targets, known.labels, known.skip) != (
                    name, chosen, labels, skip):
                raise RequestError(f'window "{window_id}" is waiting for traffic with another '
                                   "name, targets, labels or skip_requests", status=409)
            return False, self._answer(known)
        if self.host.book.known(window_id):
            raise RequestError(f'window "{window_id}" exists; start a new id', status=409)
        limit = self.host.config.max_open_windows
        if len(self._windows) + len(self.host.book.open_windows()) >= limit:
            raise RequestError(f"too many open windows (max_open_windows={limit})", status=429)
        w = TrafficWindow(window_id, name, chosen, dict(labels), skip)
        with self._lock:
            self._windows[window_id] = w
        log.info("window waits for traffic id=%s skip_requests=%d", window_id, skip)
        return True, self._answer(w)

    def _answer(self, w: TrafficWindow) -> dict[str, Any]:
        return {"id": w.id, "name": w.name or w.id, "targets": list(w.targets),
                "labels": w.labels, "started_at": None, "start_errors": {},
                "edges": "traffic", "skip_requests": w.skip,
                "waiting": "for the first measured request through the proxy"}

    @property
    def registered(self) -> bool:
        """Whether any traffic-edged window is registered (else `arrive` has nothing to do);
        safe to read from another thread."""
        with self._lock:
            return bool(self._windows)

    def _forget(self, window_id: str) -> None:
        with self._lock:
            self._windows.pop(window_id, None)

    async def arrive(self, target: str, model: str = "") -> list[Ticket]:
        """Before a generation request of `model` for `target` goes: returns once every window
        it opens has started and the target has its baseline there; a warm-up on a target a
        window counts already goes after the measured ones there, the window paused for it."""
        if not self.registered:
            return []
        tickets: list[Ticket] = []
        for w in list(self._windows.values()):
            if target not in w.targets or w.failed is not None:
                continue
            key = (target, model)
            w.arrived[key] = w.arrived.get(key, 0) + 1
            if w.arrived[key] <= w.skip:
                await self._skipped(w, target)
                tickets.append((w, target, True))
            elif await self._measured(w, target):
                tickets.append((w, target, False))
        return tickets

    async def _skipped(self, w: TrafficWindow, target: str) -> None:
        if target in w.joined and w.started is not None:  # its baseline is under way: after it
            await asyncio.shield(w.started)
            await asyncio.shield(w.joined[target])
        w.skipping[target] = w.skipping.get(target, 0) + 1  # no await since: a baseline waits
        w.warmed_up(target)
        if not w.counting(target):
            return  # before the target's baseline: left out by it
        while w.in_flight.get(target):
            await w.idle(target).wait()
        if target not in w.before:
            await _once(w.pausing, target, lambda: self._pause(w, target))

    async def _pause(self, w: TrafficWindow, target: str) -> None:
        """The scrape after the target's measured requests, before its warm-up goes."""
        if (ending := w.ending.get(target)) is not None:
            await asyncio.shield(ending)
        w.held.add(target)
        result = await self.host.scrape_target(target, feed=[])
        w.before[target] = result
        w.ends.setdefault(target, result)  # a stop now ends before the warm-up
        del w.pausing[target]

    async def _measured(self, w: TrafficWindow, target: str) -> bool:
        if w.started is None:
            w.started = asyncio.get_running_loop().create_task(self._start(w, target))
        await asyncio.shield(w.started)
        if w.failed is None and target not in w.joined:
            w.joined[target] = asyncio.get_running_loop().create_task(self._join(w, target))
        if w.failed is not None:
            return False
        await asyncio.shield(w.joined[target])
        while w.skipping.get(target):  # no await from here to in_flight: a warm-up waits
            await w.warmed_up(target).wait()
        w.in_flight[target] = w.in_flight.get(target, 0) + 1
        w.idle(target)
        w.generation[target] = w.generation.get(target, 0) + 1
        if target in w.before:
            await _once(w.rebasing, target, lambda: self._rebase(w, target))
        w.held.discard(target)
        w.ends.pop(target, None)
        return True

    async def _rebase(self, w: TrafficWindow, target: str) -> None:
        """The scrape after the target's warm-ups: the window counts on from it."""
        after = await self.host.scrape_target(target, feed=[])
        before = w.before.pop(target)
        if before.snapshot is not None and after.snapshot is not None:
            w.shifts[target] = Shift.of(w.shifts.get(target), before.snapshot, after.snapshot)
        else:
            log.warning("warm-up counted in traffic window id=%s target=%s error=%s", w.id,
                        target, before.error or after.error)
        del w.rebasing[target]

    async def _start(self, w: TrafficWindow, target: str | None) -> None:
        """The window opens; `target`'s warm-up done, the others' baselines wait for theirs."""
        if target is not None:
            await w.warmed_up(target).wait()
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            w.joined[target] = done  # its baseline is the window's start
        late = [t for t in w.targets if t != target] if target is not None else []
        try:
            await self.host.start_window(w.id, w.name, w.targets, w.labels, late=late)
        except Exception as exc:  # the request is forwarded all the same; the stop says why
            w.failed = str(exc)
            log.error("traffic window not started id=%s error=%s", w.id, exc)
            return
        w.first_request_at = self.host.clock()

    async def _join(self, w: TrafficWindow, target: str) -> None:
        """Another target's first measured request: its warm-up done, its baseline now."""
        await w.warmed_up(target).wait()
        await self.host.book.join(w.id, target, self.host.scrape_for_window)

    def done(self, tickets: list[Ticket]) -> None:
        """The request's answer has completed (or failed): the window may be idle now."""
        for w, target, skipped in tickets:
            if skipped:
                w.skipping[target] -= 1
                w.warmed_up(target)
                continue
            w.in_flight[target] -= 1
            w.idle(target)
            w.last_response_at = self.host.clock()
            if w.in_flight[target] == 0 and self._windows.get(w.id) is w:
                w.held.add(target)
                generation = w.generation[target]
                w.ending[target] = asyncio.get_running_loop().create_task(
                    self._end_scrape(w, target, generation))

    async def _end_scrape(self, w: TrafficWindow, target: str, generation: int) -> None:
        # The first scrape begun after the last response (a target's scrapes are handed on in
        # turn): the window's count ends here, and takes it now, saved with the next round.
        def ended(result: ScrapeResult) -> None:
            if w.generation.get(target) != generation or target not in w.held:
                return
            w.ends[target] = result
            window = self.host.book.get(w.id)
            if result.ok and window.takes_scrapes_of(target):
                self.host.book.feed([window], w.shifted(result))

        await self.host.scrape_target(target, feed=[], also=ended)

    def seen(self, window_id: str, result: ScrapeResult) -> ScrapeResult | None:
        """The scrape as that window takes it, or None. Where its target is idle, only one that
        shows no count since the scrape after its last response: sampled all the same, a
        restart of the server while idle loses the window nothing (nor our own, once saved)."""
        w = self._windows.get(window_id)
        if w is None:
            return result
        if result.target in w.held:
            end = w.ends.get(result.target)
            if end is None or result.at < end.at or not _unchanged(end, result):
                return None
            w.ends[result.target] = result  # the same counts, later: where it ends now
        return w.shifted(result)

    def record(self, target: str, stats: RequestStats) -> None:
        """One proxied answer into the book, but not into a window it is a warm-up of (a
        warm-up on a target there goes only while no measured request is in flight)."""
        skip = {w.id for w in list(self._windows.values())
                if w.skipping.get(target) and not w.in_flight.get(target)}
        self.host.book.record(target, stats, skip=skip)

    def knows(self, window_id: str) -> bool:
        """A traffic-edged window not stopped yet."""
        return window_id in self._windows

    async def stop(self, window_id: str) -> Window:
        """Stop on the scrapes after the last responses when every target is idle, else now."""
        w = self._windows[window_id]
        ended_by = ""
        if w.started is None:  # no measured request came: an empty window, from now
            w.started = asyncio.get_running_loop().create_task(self._start(w, None))
            ended_by = "the stop: no measured request reached the proxy"
        await asyncio.shield(w.started)
        if w.failed is not None:
            self._forget(window_id)
            raise RequestError(f'window "{window_id}" did not start at its first request: '
                               f"{w.failed}", status=409)
        for task in [*w.joined.values(), *w.ending.values(), *w.pausing.values(),
                     *w.rebasing.values()]:
            await asyncio.shield(task)
        idle = bool(w.held) and not any(w.in_flight.values())
        ends = dict(w.ends) if idle else {}
        if not ended_by:
            ended_by = ("the last response" if idle and len(ends) == len(w.held)
                        else "the stop: requests were in flight")
        # Held until the stop has taken its scrapes (a failed stop leaves it open, held).
        window = await self.host.book.stop(window_id, self._stop_scrape(w, ends),
                                           answer=False, edges=w.block(ended_by))
        self._forget(window_id)
        return window

    def _stop_scrape(self, w: TrafficWindow, ends: dict[str, ScrapeResult]
                     ) -> Callable[..., Any]:
        host = self.host

        async def scrape(names: list[str], others: list[Window],
                         then: Callable[[ScrapeResult], None] | None) -> list[ScrapeResult]:
            take = (lambda result: then(w.shifted(result))) if then is not None else None
            results = []
            for name in names:
                if name in ends:  # the scrape right after the target's last response
                    if take is not None:
                        take(ends[name])
                    results.append(ends[name])
            fresh = [n for n in names if n not in ends]
            results += await host.scrape_for_window(fresh, others, take)
            return results

        return scrape

    def waiting(self, window_id: str) -> dict[str, Any] | None:
        """A window still waiting for its first measured request, as a GET answers it."""
        w = self._windows.get(window_id)
        if w is None or w.open:
            return None
        return self._answer(w) | {"status": "waiting", "stopped_at": None,
                                  "edges": w.block("not yet: waiting")}
