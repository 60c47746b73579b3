"""When /metrics lines not built yet are built: a chunk per loop turn, and ahead of the next
expected scrape of us, so neither a render nor the building holds the event loop for long.

While /metrics is read, a target's lines are built as its scrape lands (`scraped`: in the
next loop turns, a few targets a turn), so a render finds them built. What is left to build
when a render comes: every target's lines when /metrics has gone unread for a while (the first
render, or one after a reload that changed every target's labels: ~40 ms of CPU at 1000
targets), a scrape's that left its block to a later scrape that came late, and live gauges
whose span moved with the clock alone.
Built `CHUNK` targets at a time with the loop let in between, then rendered from the built
lines (a few ms). A Prometheus scrapes us at a steady interval: after two renders we know it,
and build shortly before the next one is due. Two Prometheus replicas (an HA pair) at different
offsets are followed too: the next gap is expected to be the one before last.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from exporter.core.counting import LiveTrack
from exporter.web.exposition import MetricsWriter
from exporter.server.targets import TargetState

log = logging.getLogger(__name__)

CHUNK = 100  # targets built per loop turn: ~4 ms
BUILD_CHUNK = 25  # blocks of scraped targets built per loop turn: ~1-1.5 ms
LEAD = 0.5  # seconds before the expected render that its lines are built
MAX_PERIOD = 600.0  # a longer gap between renders is no rhythm to plan for


class Prerender:
    """Builds `writer`'s stale lines on the loop in chunks; ahead of renders that keep a rhythm."""

    def __init__(self, writer: MetricsWriter, *, clock: Callable[[], float] = time.monotonic,
                 chunk: int = CHUNK, lead: float = LEAD, build_chunk: int = BUILD_CHUNK):
        self.writer = writer
        self.clock = clock
        self.chunk = chunk
        self.lead = lead
        self.build_chunk = build_chunk
        # Scraped targets whose blocks are to be built: the latest state of each.
        self._scraped: dict[str, tuple[TargetState, LiveTrack, float]] = {}
        self._builder: asyncio.Handle | None = None
        self._renders: deque[float] = deque(maxlen=3)  # times of the last renders
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self.ahead = 0  # preparations started ahead of an expected render (the bench counts)

    @property
    def planned(self) -> float | None:
        """Loop time of the next preparation ahead of a render, if one is planned."""
        return None if self._timer is None else self._timer.when()

    @property
    def pending(self) -> int:
        """Scraped targets whose blocks are still to be built."""
        return len(self._scraped)

    def scraped(self, name: str, state: TargetState, track: LiveTrack, now: float) -> None:
        """A target's scrape was recorded (the service calls this): its block is built while
        /metrics is read (`MetricsWriter.wants`), in a loop turn after the one handling the
        scrape, `build_chunk` blocks a turn. Scrape answers come in groups (~125 a turn at
        1000 targets, 20-30 ms); their blocks in that turn would add ~6 ms to it."""
        if not self.writer.wants(track, now):
            return
        self._scraped[name] = (state, track, now)  # a later scrape replaces an earlier one's
        if self._builder is None:
            self._builder = asyncio.get_running_loop().call_soon(self._build_scraped)

    def _build_scraped(self) -> None:
        self._builder = None
        pending = self._scraped
        # Nobody awaits this: a failure is said here (the render will meet it again).
        try:
            for _ in range(min(self.build_chunk, len(pending))):
                name = next(iter(pending))
                self.writer.scraped(name, *pending.pop(name))
        except Exception:
            log.exception("building /metrics lines of scraped targets failed")
        if pending:
            self._builder = asyncio.get_running_loop().call_soon(self._build_scraped)

    async def prepare(self) -> None:
        """Build every stale target's lines, letting the loop run between chunks."""
        for _ in self.writer.prepare(self.chunk):
            await asyncio.sleep(0)

    def rendered(self) -> None:
        """Note a render; plan the next preparation if renders come at a steady interval."""
        renders = self._renders
        renders.append(self.clock())
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if len(renders) < 2:
            return
        # The gap to expect next is the one two renders back: one Prometheus scrapes us at a
        # fixed interval (every gap alike); an HA pair of replicas at two offsets in it, whose
        # gaps alternate. With two renders only, the one gap there is.
        gap = renders[-2] - renders[-3] if len(renders) == 3 else renders[-1] - renders[-2]
        # With renders closer together than twice the lead, few targets change between two:
        # the render's own building is short, and preparing ahead would build most twice.
        if 2 * self.lead < gap <= MAX_PERIOD:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(gap - self.lead, self._start)

    def _start(self) -> None:
        self._timer = None
        if self._task is None or self._task.done():
            self.ahead += 1
            self._task = asyncio.get_running_loop().create_task(self._prepare_ahead())

    async def _prepare_ahead(self) -> None:
        # Nobody awaits this task: a failure is said here (the render will meet it again).
        try:
            await self.prepare()
        except Exception:
            log.exception("building /metrics lines ahead failed")

    async def close(self) -> None:
        """Cancel what is planned or running (the app is stopping)."""
        if self._builder is not None:
            self._builder.cancel()
            self._builder = None
        self._scraped.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
