"""The running exporter: its parts (targets, window book, scheduler) and the reloads that change
them, on one event loop. Readers take `view()`; handlers call the window methods."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import MappingProxyType
from typing import Any

from exporter.config.model import Config, TargetConfig, check_reload, load_config
from exporter.core.errors import RequestError
from exporter.core.snapshot import ScrapeResult
from exporter.core.window import TargetRef, Window
from exporter.scrape.scraper import Scraper
from exporter.server.book import WindowBook
from exporter.server.edges import TrafficEdges
from exporter.server.scheduler import Scheduler
from exporter.server.stateview import StateView
from exporter.server.targets import Targets
from exporter.server.windowstart import StartRequest
from exporter.state.store import StateStore, connect_state

log = logging.getLogger(__name__)


class ExporterService:
    """The exporter's parts wired together: every change goes through a method here or theirs."""

    def __init__(
        self,
        config: Config,
        *,
        config_path: str | Path | None = None,
        overrides: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
        state_connect: Callable[[Path], sqlite3.Connection] = connect_state,
    ):
        self.config_path = config_path
        self.overrides = overrides or {}  # from the environment: every reload keeps them
        self.clock = clock
        self._reload_ok = True
        self._reload_at = clock()
        self._version = 0  # reloads: what the targets and book do not count themselves
        self._targets = Targets(config, clock)
        self.book = WindowBook(StateStore(config.state_path, connect=state_connect), clock,
                               lambda window_id: Path(self.config.output_dir).resolve() / window_id)
        self.scheduler = Scheduler(self._targets, self.book, self.scrape_target,
                                   lambda: self._close_removed_targets("no longer discovered"))
        self.edges = TrafficEdges(self)  # windows bounded by the proxied traffic
        self._scraped: Callable[[], None] | None = None  # `on_scraped`
        self.book.restore(self._targets.states,
                          lambda name: self._targets.gone_reason(name, "not in the config"))
        if config.state_save_interval is not None:
            log.warning("config key state_save_interval is ignored: what changed in open "
                        "windows is saved after every scrape round")

    # -- what readers see ---------------------------------------------------------------

    def view(self) -> StateView:
        """The state now, read-only, with its version."""
        targets, book = self._targets, self.book
        return StateView(
            version=self.version,
            now=self.clock(),
            targets_version=targets.set_version,
            config=targets.config,
            targets=MappingProxyType(dict(targets.states)),
            live=MappingProxyType(dict(targets.live)),
            open_windows=len(book.open_windows()),
            last_window=book.last_window,
            windows=book.recent,
            with_series=book.with_series,
            reload_ok=self._reload_ok,
            reload_at=self._reload_at,
            discovery_up=MappingProxyType(
                {name: not source.error for name, source in targets.discovery.sources.items()}),
            discovery_errors=MappingProxyType(dict(targets.discovery.errors())),
            ready=self.scheduler.ready,
            state_write_errors=book.store.errors_total,
            result_write_errors=book.result_errors,
        )

    @property
    def version(self) -> int:
        """Changes whenever what /metrics, the views or the landing page show may have."""
        return self._version + self._targets.version + self.book.version

    @property
    def config(self) -> Config:
        """The config in force (frozen; a reload replaces it); readers take `view()` instead."""
        return self._targets.config

    def fleet_targets(self) -> dict[str, TargetConfig]:
        """Every target of the fleet by name, before the split into shards."""
        return self._targets.fleet()

    def use_scraper(self, scraper: Scraper) -> None:
        self._targets.scraper = scraper

    # -- config ---------------------------------------------------------------------------

    def reload_refused(self, problems: list[str]) -> None:
        """A reload was refused: the old config keeps serving; the log and /metrics say so."""
        log.error("config reload refused, the old config keeps serving problems=%s",
                  "; ".join(problems))
        self._reload_ok = False
        self._version += 1

    def reload(self, config: Config | None = None) -> Config:
        """Re-read the config file (or take `config`, read off the loop); keep the old one if
        the new one is invalid or changes what needs a restart."""
        if self.config_path is None:
            raise RequestError("no config file to reload", status=409)
        try:
            if config is None:
                config = load_config(self.config_path, self.overrides)
            check_reload(self.config, config, str(self.config_path))
            # The state follows output_dir (or state_db): moved now, for the next restart.
            self.book.move_store(config.state_path)
        except Exception as exc:
            self.reload_refused(getattr(exc, "problems", None) or [str(exc)])
            raise
        self._targets.configure(config)
        self._close_removed_targets("removed from the config")
        self._reload_ok = True
        self._reload_at = self.clock()
        self._version += 1
        log.info("config reloaded targets=%d", len(self._targets.states))
        return config

    def _close_removed_targets(self, why: str) -> None:
        self.book.remove_targets(set(self._targets.states),
                                 lambda name: self._targets.gone_reason(name, why))

    # -- scraping -------------------------------------------------------------------------

    async def scrape_target(
        self, name: str, *, feed: Iterable[Window] | None = None,
        also: Callable[[ScrapeResult], None] | None = None,
    ) -> ScrapeResult:
        """Scrape one target now; its state, live track and windows (`feed`, or every open
        window counting it) take the result, then `also` (a stop's window)."""
        def then(result: ScrapeResult) -> None:
            windows = feed if feed is not None else self.book.open_windows()
            for window in windows:
                if window.takes_scrapes_of(name) and (
                        seen := self.edges.seen(window.id, result)) is not None:
                    self.book.feed([window], seen)
            if also is not None:
                also(result)
            if self._scraped is not None:
                # The listener's work is not the scrape's: its failure must not fail the scrape.
                try:
                    self._scraped()
                except Exception:
                    log.exception("scrape listener failed target=%s", name)

        return await self._targets.scrape(name, then)

    def on_scraped(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after each scrape a target's state takes (a reload's proxy ports
        open then)."""
        self._scraped = listener

    # -- windows ------------------------------------------------------------------------

    def resolve(self, names: list[str] | None, window_id: str) -> list[TargetConfig]:
        """This shard's targets by name or host:port (all when None), or `UnknownTargetError`."""
        return self._targets.resolve(names, window_id)

    async def scrape_for_window(self, names: list[str], others: list[Window],
                                then: Callable[[ScrapeResult], None] | None
                                ) -> list[ScrapeResult]:
        """Scrape the named targets at once for a window's start, stop or late baseline; the
        `others` open windows take them too, then `then`."""
        known = [n for n in names if n in self._targets.states]
        return list(await asyncio.gather(*(self.scrape_target(n, feed=others, also=then)
                                           for n in known)))

    async def start_window(
        self,
        window_id: str | None = None,
        name: str | None = None,
        targets: list[str] | None = None,
        labels: dict[str, str] | None = None,
        *, late: Iterable[str] = (),
    ) -> tuple[bool, Window]:
        """Open a window (scraping its targets at once for the baseline, but the `late` ones,
        whose baseline comes with their traffic: `WindowBook.join`); (created, window)."""
        chosen = self._targets.resolve(targets, window_id)
        request = StartRequest(window_id, name, [TargetRef(t.name, t.url, t.host_port)
                                                 for t in chosen], dict(labels or {}))
        return await self.book.start(request, self.scrape_for_window,
                                     self.config.max_open_windows, late=late)

    async def stop_window(self, window_id: str, *, answer: bool = True) -> Window:
        """Close a window (`WindowBook.stop`)."""
        return await self.book.stop(window_id, self.scrape_for_window, answer=answer)
