"""Windows bounded by the traffic (`"edges": "traffic"`), driven through the window book: each
target's first `skip_requests` generation requests (its warm-up) stay out; the window starts
before the first measured request is forwarded, and each other target takes its baseline
before its own first measured one; a target idle again is scraped, the window ends there (a
stop takes it: counts after the last response stay out) and still takes the later scrapes that
show no count since, until its next request."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from exporter.config.model import Config, TargetConfig
from exporter.core.errors import RequestError, UnknownWindowError
from exporter.core.isotime import iso_utc
from exporter.core.snapshot import ScrapeResult
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
    arrived: dict[str, int] = field(default_factory=dict)  # generation requests, per target
    skipping: dict[str, int] = field(default_factory=dict)  # skipped ones still in flight
    warmed: dict[str, asyncio.Event] = field(default_factory=dict)  # its skipped ones done
    started: asyncio.Task[None] | None = None
    failed: str | None = None  # why the book refused the start
    joined: dict[str, asyncio.Future[None]] = field(default_factory=dict)  # baselines taken
    first_request_at: float | None = None
    last_response_at: float | None = None
    in_flight: dict[str, int] = field(default_factory=dict)  # measured, per target
    generation: dict[str, int] = field(default_factory=dict)  # measured arrivals, per target
    held: set[str] = field(default_factory=set)  # all done: later scrapes are not the window's
    ends: dict[str, ScrapeResult] = field(default_factory=dict)  # scraped as each was held
    ending: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return self.started is not None and self.started.done() and self.failed is None

    def warmed_up(self, target: str) -> asyncio.Event:
        """Set once the target's skipped requests have all completed."""
        event = self.warmed.setdefault(target, asyncio.Event())
        if self.arrived.get(target, 0) >= self.skip and not self.skipping.get(target):
            event.set()
        return event

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
        if self._in_book(window_id):
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

    def _in_book(self, window_id: str) -> bool:
        try:
            self.host.book.get(window_id)
        except UnknownWindowError:
            return False
        return True

    @property
    def registered(self) -> bool:
        """Whether any traffic-edged window is registered (else `arrive` has nothing to do);
        safe to read from another thread."""
        with self._lock:
            return bool(self._windows)

    def _forget(self, window_id: str) -> None:
        with self._lock:
            self._windows.pop(window_id, None)

    async def arrive(self, target: str) -> list[Ticket]:
        """Before a generation request for `target` goes: returns once every window it opens
        has started and the target has its baseline there."""
        if not self.registered:
            return []
        tickets: list[Ticket] = []
        for w in list(self._windows.values()):
            if target not in w.targets or w.failed is not None:
                continue
            w.arrived[target] = w.arrived.get(target, 0) + 1
            if w.arrived[target] <= w.skip:
                w.skipping[target] = w.skipping.get(target, 0) + 1
                tickets.append((w, target, True))
                continue
            if w.started is None:
                w.started = asyncio.get_running_loop().create_task(self._start(w, target))
            await asyncio.shield(w.started)
            if w.failed is None and target not in w.joined:
                w.joined[target] = asyncio.get_running_loop().create_task(self._join(w, target))
            if w.failed is None:
                await asyncio.shield(w.joined[target])
                w.in_flight[target] = w.in_flight.get(target, 0) + 1
                w.generation[target] = w.generation.get(target, 0) + 1
                w.held.discard(target)
                w.ends.pop(target, None)
                tickets.append((w, target, False))
        return tickets

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
                self.host.book.feed([window], result)

        await self.host.scrape_target(target, feed=[], also=ended)

    def seen(self, window_id: str, result: ScrapeResult) -> ScrapeResult | None:
        """The scrape as that window takes it, or None. Where its target is idle, only one that
        shows no count since the scrape after its last response: sampled all the same, a
        restart of the server while idle loses the window nothing (nor our own, once saved)."""
        w = self._windows.get(window_id)
        if w is None or result.target not in w.held:
            return result
        end = w.ends.get(result.target)
        if end is None or result.at < end.at or not _unchanged(end, result):
            return None
        w.ends[result.target] = result  # the same counts, later: where the window ends now
        return result

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
        for task in [*w.joined.values(), *w.ending.values()]:
            await asyncio.shield(task)
        idle = bool(w.held) and not any(w.in_flight.values())
        ends = dict(w.ends) if idle else {}
        if not ended_by:
            ended_by = ("the last response" if idle and len(ends) == len(w.held)
                        else "the stop: requests were in flight")
        # Held until the stop has taken its scrapes (a failed stop leaves it open, held).
        window = await self.host.book.stop(window_id, self._stop_scrape(ends), answer=False,
                                           edges=w.block(ended_by))
        self._forget(window_id)
        return window

    def _stop_scrape(self, ends: dict[str, ScrapeResult]) -> Callable[..., Any]:
        host = self.host

        async def scrape(names: list[str], others: list[Window],
                         then: Callable[[ScrapeResult], None] | None) -> list[ScrapeResult]:
            results = []
            for name in names:
                if name in ends:  # the scrape right after the target's last response
                    if then is not None:
                        then(ends[name])
                    results.append(ends[name])
            fresh = [n for n in names if n not in ends]
            results += await host.scrape_for_window(fresh, others, then)
            return results

        return scrape

    def waiting(self, window_id: str) -> dict[str, Any] | None:
        """A window still waiting for its first measured request, as a GET answers it."""
        w = self._windows.get(window_id)
        if w is None or w.open:
            return None
        return self._answer(w) | {"status": "waiting", "stopped_at": None,
                                  "edges": w.block("not yet: waiting")}
