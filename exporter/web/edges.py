"""Windows bounded by the traffic (`"edges": "traffic"`): started before request
`skip_requests + 1` is forwarded; a target idle again is scraped and held from later scrapes
(until its next request), and a stop takes those: counts after the last response stay out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.core.errors import RequestError
from exporter.core.isotime import iso_utc
from exporter.core.snapshot import ScrapeResult
from exporter.core.window import Window, new_window_id
from exporter.server.service import ExporterService
from exporter.web.bodies import resolve_targets

log = logging.getLogger(__name__)
KEEP_FINISHED = 100  # stopped traffic windows whose `edges` block a GET still shows


@dataclass
class TrafficWindow:
    """One window with traffic edges: waiting for its first measured request, then open."""

    id: str
    name: str | None
    targets: list[str]
    labels: dict[str, str]
    skip: int
    arrived: int = 0  # requests that reached the proxy for one of its targets
    skipping: int = 0  # skipped requests still in flight
    started: asyncio.Task[None] | None = None
    failed: str | None = None  # why the book refused the start
    first_request_at: float | None = None
    last_response_at: float | None = None
    in_flight: dict[str, int] = field(default_factory=dict)  # measured, per target
    generation: dict[str, int] = field(default_factory=dict)  # measured arrivals, per target
    held: set[str] = field(default_factory=set)  # all done: later scrapes are not the window's
    ends: dict[str, ScrapeResult] = field(default_factory=dict)  # scraped as each was held
    ending: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    skipped_done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def open(self) -> bool:
        return self.started is not None and self.started.done() and self.failed is None

    def block(self, ended_by: str) -> dict[str, Any]:
        """What the answer says of the edges."""
        first, last = self.first_request_at, self.last_response_at
        return {"edges": "traffic", "skip_requests": self.skip,
                "skipped": min(self.arrived, self.skip),
                "measured_requests": max(0, self.arrived - self.skip),
                "first_request_at": first, "last_response_at": last,
                "first_request_at_iso": iso_utc(first) if first is not None else None,
                "last_response_at_iso": iso_utc(last) if last is not None else None,
                "ended_by": ended_by}


Ticket = tuple[TrafficWindow, str, bool]  # window, target, skipped


class TrafficEdges:
    """The traffic-edged windows of this exporter, their starts and their stops."""

    def __init__(self, service: ExporterService) -> None:
        self.service = service
        self._windows: dict[str, TrafficWindow] = {}
        self._finished: dict[str, dict[str, Any]] = {}

    def expect(self, window_id: str | None, name: str | None, targets: list[str] | None,
               labels: dict[str, str], skip: int) -> tuple[bool, dict[str, Any]]:
        """Register a window that opens with the traffic; (created, start answer)."""
        window_id = window_id or new_window_id(self.service.clock())
        states = self.service.view().targets
        chosen = sorted(states) if targets is None else resolve_targets(
            targets, {n: s.config.host_port for n, s in states.items()}, window_id)
        known = self._windows.get(window_id)
        if known is not None:
            if (known.name, known.targets, known.labels, known.skip) != (
                    name, chosen, labels, skip):
                raise RequestError(f'window "{window_id}" is waiting for traffic with another '
                                   "name, targets, labels or skip_requests", status=409)
            return False, self._answer(known)
        if window_id in self._finished or self._in_book(window_id):
            raise RequestError(f'window "{window_id}" exists; start a new id', status=409)
        limit = self.service.config.max_open_windows
        if len(self._windows) + len(self.service.book.open_windows()) >= limit:
            raise RequestError(f"too many open windows (max_open_windows={limit})", status=429)
        self._windows[window_id] = TrafficWindow(window_id, name, chosen, dict(labels), skip)
        if skip == 0:
            self._windows[window_id].skipped_done.set()
        log.info("window waits for traffic id=%s skip_requests=%d", window_id, skip)
        return True, self._answer(self._windows[window_id])

    def _answer(self, w: TrafficWindow) -> dict[str, Any]:
        return {"id": w.id, "name": w.name or w.id, "targets": list(w.targets),
                "labels": w.labels, "started_at": None, "start_errors": {},
                "edges": "traffic", "skip_requests": w.skip,
                "waiting": "for the first measured request through the proxy"}

    def _in_book(self, window_id: str) -> bool:
        try:
            self.service.book.get(window_id)
        except RequestError:
            return False
        return True

    @property
    def registered(self) -> bool:
        """Whether any traffic-edged window is registered (else `arrive` has nothing to do)."""
        return bool(self._windows)

    async def arrive(self, target: str) -> list[Ticket]:
        """Before a request for `target` goes: returns once every window it opens has started."""
        if not self.registered:
            return []
        tickets: list[Ticket] = []
        for w in list(self._windows.values()):
            if target not in w.targets or w.failed is not None:
                continue
            w.arrived += 1
            if w.arrived <= w.skip:
                w.skipping += 1
                tickets.append((w, target, True))
                continue
            if w.started is None:
                w.started = asyncio.get_running_loop().create_task(self._start(w))
            await asyncio.shield(w.started)
            if w.failed is None:
                w.in_flight[target] = w.in_flight.get(target, 0) + 1
                w.generation[target] = w.generation.get(target, 0) + 1
                w.held.discard(target)
                w.ends.pop(target, None)
                tickets.append((w, target, False))
        return tickets

    async def _start(self, w: TrafficWindow) -> None:
        await w.skipped_done.wait()  # the N-th response has completed
        try:
            await self.service.start_window(w.id, w.name, w.targets, w.labels)
        except Exception as exc:  # the request is forwarded all the same; the stop says why
            w.failed = str(exc)
            log.error("traffic window not started id=%s error=%s", w.id, exc)
            return
        w.first_request_at = self.service.clock()

    def done(self, tickets: list[Ticket]) -> None:
        """The request's answer has completed (or failed): the window may be idle now."""
        for w, target, skipped in tickets:
            if skipped:
                w.skipping -= 1
                if w.skipping == 0 and w.arrived >= w.skip:
                    w.skipped_done.set()
                continue
            w.in_flight[target] -= 1
            w.last_response_at = self.service.clock()
            if w.in_flight[target] == 0 and self._windows.get(w.id) is w:
                w.held.add(target)
                generation = w.generation[target]
                w.ending[target] = asyncio.get_running_loop().create_task(
                    self._end_scrape(w, target, generation))

    async def _end_scrape(self, w: TrafficWindow, target: str, generation: int) -> None:
        # No window takes it: it is this window's stop scrape, if no request comes after.
        result = await self.service.scrape_target(target, feed=[])
        if w.generation.get(target) == generation and target in w.held:
            w.ends[target] = result

    def holds(self, window_id: str, target: str) -> bool:
        """Whether a scrape of `target` must not feed that window (it is idle there)."""
        w = self._windows.get(window_id)
        return w is not None and target in w.held

    def knows(self, window_id: str) -> bool:
        """A traffic-edged window not stopped yet."""
        return window_id in self._windows

    async def stop(self, window_id: str) -> Window:
        """Stop on the scrapes after the last responses when every target is idle, else now."""
        w = self._windows[window_id]
        ended_by = ""
        if w.started is None:  # no measured request came: an empty window, from now
            w.skipped_done.set()
            w.started = asyncio.get_running_loop().create_task(self._start(w))
            ended_by = "the stop: no measured request reached the proxy"
        await asyncio.shield(w.started)
        if w.failed is not None:
            del self._windows[window_id]
            raise RequestError(f'window "{window_id}" did not start at its first request: '
                               f"{w.failed}", status=409)
        for task in list(w.ending.values()):
            await asyncio.shield(task)
        idle = bool(w.held) and not any(w.in_flight.values())
        ends = dict(w.ends) if idle else {}
        if not ended_by:
            ended_by = ("the last response" if idle and len(ends) == len(w.held)
                        else "the stop: requests were in flight")
        # Held until the stop has taken its scrapes (a failed stop leaves it open, held).
        window = await self.service.book.stop(window_id, self._stop_scrape(ends), answer=False)
        self._windows.pop(window_id, None)
        self._finished[window_id] = w.block(ended_by)
        while len(self._finished) > KEEP_FINISHED:
            del self._finished[next(iter(self._finished))]
        return window

    def _stop_scrape(self, ends: dict[str, ScrapeResult]) -> Callable[..., Any]:
        service = self.service

        async def scrape(names: list[str], others: list[Window],
                         then: Callable[[ScrapeResult], None] | None) -> list[ScrapeResult]:
            results = []
            for name in names:
                if name in ends:  # the scrape right after the target's last response
                    if then is not None:
                        then(ends[name])
                    results.append(ends[name])
            fresh = [n for n in names if n not in ends and n in service.view().targets]
            results += await asyncio.gather(*(service.scrape_target(n, feed=others, also=then)
                                              for n in fresh))
            return results

        return scrape

    def waiting(self, window_id: str) -> dict[str, Any] | None:
        """A window still waiting for its first measured request, as a GET answers it."""
        w = self._windows.get(window_id)
        if w is None or w.open:
            return None
        return self._answer(w) | {"status": "waiting", "stopped_at": None,
                                  "edges": w.block("not yet: waiting")}

    def block(self, window_id: str) -> dict[str, Any] | None:
        """The `edges` block of a window's answer or state, if it has traffic edges."""
        if window_id in self._finished:
            return self._finished[window_id]
        w = self._windows.get(window_id)
        return w.block("not yet: open") if w is not None else None
