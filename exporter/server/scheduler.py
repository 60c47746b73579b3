"""The scrape loop: a round of every target each interval, spread over it, then the book's save."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import zlib
from collections.abc import Awaitable, Callable

from exporter.core.errors import StoreError
from exporter.server.book import WindowBook
from exporter.server.targets import Targets

log = logging.getLogger(__name__)

EXPIRY_EVERY = 3600.0  # seconds between retention passes: retention is counted in days
# A round's targets start in this many groups spread over the interval, not one by one: a
# scrape that wakes an idle loop costs more CPU than one among a group.
SPREAD_SLOTS = 8


class Scheduler:
    """Runs scrape rounds over `targets`, feeding the book's open windows, saving after each."""

    def __init__(self, targets: Targets, book: WindowBook,
                 scrape: Callable[[str], Awaitable[object]],
                 on_discovery_change: Callable[[], None]):
        self.targets = targets
        self.book = book
        self._scrape = scrape
        self._on_discovery_change = on_discovery_change
        self.ready = False  # the first round is done
        self._next_expiry = 0.0  # retention is applied at the first round, then hourly

    async def round(self, spread: float = 0.0) -> None:
        """Scrape every target once, concurrently, each after its share of `spread`: answers
        then arrive over it, not in one burst that holds the event loop."""
        config = self.targets.config
        if (config.file_sd or config.http_sd or config.prometheus_sd) and (
            await self.targets.refresh_discovery()
        ):
            self._on_discovery_change()

        await asyncio.gather(*(self._scrape_in_turn(n, spread) for n in list(self.targets.states)))
        self.ready = True
        # A failure is logged and counted; what changed stays marked: the next round retries.
        try:
            self.book.save_round()
            now = self.targets.clock()
            if now >= self._next_expiry:
                self.book.expire(config.window_retention)
                self._next_expiry = now + EXPIRY_EVERY
        except StoreError as exc:
            log.error("window state not saved error=%s", exc)

    async def _scrape_in_turn(self, name: str, span: float) -> None:
        """Scrape the target after its fixed share of `span` (by a hash of its name, as
        Prometheus offsets)."""
        if span > 0:
            await asyncio.sleep(span * (zlib.crc32(name.encode()) % SPREAD_SLOTS) / SPREAD_SLOTS)
        await self._scrape(name)

    def window_due(self, interval: float) -> list[str]:
        """Targets an open window takes scrapes of, not scraped within half of `interval` and
        with no scrape in flight (a slow one is not stacked on)."""
        names = {n for w in self.book.open_windows() for n in w.live_targets()
                 if w.takes_scrapes_of(n)}
        now, states = self.targets.clock(), self.targets.states
        due = []
        for name in sorted(names):
            state = states.get(name)
            if state is None or self.targets.busy(name):
                continue
            if state.last is None or now - state.last.at >= interval / 2:
                due.append(name)
        return due

    async def window_rounds(self) -> None:
        """Between rounds, the targets of open windows every `window_interval`: a server restart
        loses the window at most what it counted since then (the counters cannot say)."""
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                config = self.targets.config
                interval = config.window_interval
                if interval < config.scrape_interval:
                    for name in self.window_due(interval):
                        if any(t.get_name() == name for t in running):
                            continue
                        task = asyncio.create_task(self._scrape_in_turn(name, interval / 2),
                                                   name=name)
                        running.add(task)
                        task.add_done_callback(running.discard)
                await asyncio.sleep(interval)
        finally:
            for task in list(running):
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def run(self) -> None:
        """Rounds every `scrape_interval` until cancelled; a slow round skips no beat; the
        targets of open windows also every `window_interval` between them."""
        windows = asyncio.create_task(self.window_rounds())
        # What exists as the loop starts (modules, config, the app) lives as long as we do:
        # frozen out of the collector's sight, full collections do not walk it.
        gc.freeze()
        first = True
        try:
            while True:
                started = time.monotonic()
                config = self.targets.config
                # Spread over what the interval leaves after the slowest allowed scrape.
                spread = 0.9 * max(0.0, config.scrape_interval - config.scrape_timeout)
                await self.round(spread)
                if first:
                    # So does what the first round made (caches, every target's state).
                    gc.freeze()
                    first = False
                elapsed = time.monotonic() - started
                await asyncio.sleep(max(0.0, config.scrape_interval - elapsed))
        finally:
            windows.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await windows
