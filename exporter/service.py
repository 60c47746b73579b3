"""The running exporter: target states, the scrape loop, windows and reloads, on one event loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from exporter.accounting import LiveTrack
from exporter.book import StartRequest, WindowBook
from exporter.config import Config, TargetConfig, check_reload, load_config
from exporter.discovery import Discovery
from exporter.errors import RequestError, StoreError, UnknownTargetError
from exporter.scrape import Scraper
from exporter.shards import owner
from exporter.snapshot import ScrapeResult
from exporter.store import StateStore
from exporter.window import TargetRef, Window

log = logging.getLogger(__name__)

EXPIRY_EVERY = 3600.0  # seconds between retention passes: retention is counted in days
# A round's targets start in this many groups spread over the interval, not one by one: a
# scrape that wakes an idle loop (and nginx) costs about twice the CPU of one among a group
# (0.38-0.47 ms against 0.25 with 8 groups, 0.18 in one burst; 500 targets, same run), and
# 1000/8 answers per group (64 at a time) still hold the loop for short turns only.
SPREAD_SLOTS = 8


@dataclass(frozen=True, slots=True)
class TargetState:
    """What we know of one target now; replaced whole after every scrape."""

    config: TargetConfig
    last: ScrapeResult | None = None
    errors_total: int = 0
    last_error: str | None = None
    last_error_at: float | None = None

    @property
    def up(self) -> bool:
        """The last scrape succeeded."""
        return self.last is not None and self.last.ok


def _usable_only(result: ScrapeResult) -> ScrapeResult:
    """Drop NaN, infinite and negative counter values: no counter has them, none is exposed."""
    snapshot = result.snapshot
    if snapshot is None or all(math.isfinite(v) and v >= 0 for v in snapshot.values.values()):
        return result
    values = {k: v for k, v in snapshot.values.items() if math.isfinite(v) and v >= 0}
    return replace(result, snapshot=replace(snapshot, values=values))


def _log_state_change(name: str, state: TargetState, result: ScrapeResult) -> None:
    """Say once when a target goes down (with why) or comes back, not at every failed scrape."""
    if not result.ok and (state.last is None or state.up):
        log.warning("target down target=%s url=%s error=%s", name, state.config.display_url,
                    result.error)
    elif result.ok and state.last is not None and not state.up:
        log.info("target up target=%s url=%s after=%s", name, state.config.display_url,
                 state.last_error)


def owns(target: TargetConfig, shards: int, index: int) -> bool:
    """Whether this replica scrapes the target: rendezvous hashing on its name (shards.py)."""
    return shards <= 1 or owner(target.name, shards) == index


class ExporterService:
    """Everything the HTTP handlers and the collector read and change, behind plain methods."""

    def __init__(
        self,
        config: Config,
        *,
        config_path: str | Path | None = None,
        overrides: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.config = config
        self.config_path = config_path
        self.overrides = overrides or {}  # from the environment: every reload keeps them
        self.clock = clock
        self.scraper: Scraper | None = None
        self.targets: dict[str, TargetState] = {}
        self.live: dict[str, LiveTrack] = {}
        self.ready = False
        self._generation = 0  # bumped when targets or config change what readers see
        self._next_expiry = 0.0  # retention is applied at the first round, then hourly
        self.reload_ok = True
        self.reload_at = clock()
        self.book = WindowBook(StateStore(config.state_path), clock,
                               lambda w: Path(self.config.output_dir) / w.id)
        self._locks: dict[str, asyncio.Lock] = {}
        self.discovery = Discovery(config)
        self._set_targets(config)
        self.book.restore(self.targets, lambda name: self._gone(name, "not in the config"))
        if config.state_save_interval is not None:
            log.warning("config key state_save_interval is ignored: what changed in open "
                        "windows is saved after every scrape round")

    # -- targets and config ------------------------------------------------------------

    def _set_targets(self, config: Config) -> None:
        # Static targets first: a discovered one with the same name does not replace it.
        merged = {t.name: t for t in config.targets}
        for target in self.discovery.targets():
            merged.setdefault(target.name, target)
        owned = [t for t in merged.values() if owns(t, config.shards, config.shard_index)]
        old = self.targets
        self.targets = {
            t.name: replace(old[t.name], config=t) if t.name in old else TargetState(t)
            for t in owned
        }
        self.live = {
            t.name: self.live.get(t.name) or LiveTrack(config.live_window) for t in owned
        }
        for track in self.live.values():
            track.span = config.live_window

    def reload_refused(self, problems: list[str]) -> None:
        """A reload was refused: the old config keeps serving; the log and /metrics say so."""
        log.error("config reload refused, the old config keeps serving problems=%s",
                  "; ".join(problems))
        self.reload_ok = False
        self._generation += 1

    def reload(self, config: Config | None = None) -> Config:
        """Re-read the config file (or take `config`, read off the loop); keep the old one if
        the new one is invalid or changes what needs a restart."""
        if self.config_path is None:
            raise RequestError("no config file to reload", status=409)
        try:
            if config is None:
                config = load_config(self.config_path, self.overrides)
            check_reload(self.config, config, str(self.config_path))
            # Where the window state lives follows output_dir (or state_db): moved now, so a
            # restart on the new config finds every open and recent window.
            self.book.move_store(config.state_path)
        except Exception as exc:
            self.reload_refused(getattr(exc, "problems", None) or [str(exc)])
            raise
        self.config = config
        self.discovery.config = config
        if self.scraper is not None:
            self.scraper.reconfigure(
                max_bytes=config.max_response_bytes, concurrency=config.scrape_concurrency
            )
        self._set_targets(config)
        self._close_removed_targets()
        self.reload_ok = True
        self.reload_at = self.clock()
        self._generation += 1
        log.info("config reloaded targets=%d", len(self.targets))
        return config

    def _gone(self, name: str, why: str) -> str:
        # Still in the fleet, only scraped by another shard now (shards changed): say where.
        config = self.config
        fleet = {t.name for t in config.targets} | {t.name for t in self.discovery.targets()}
        if config.shards > 1 and name in fleet:
            return f"moved to shard {owner(name, config.shards)} of {config.shards}"
        return why

    def _close_removed_targets(self, why: str = "removed from the config") -> None:
        gone = {name for w in self.open_windows() for name in w.targets} - set(self.targets)
        moved: dict[str, set[str]] = {}
        for name in gone:
            moved.setdefault(self._gone(name, why), set()).add(name)
        # One pass per reason: the book marks every target missing from `present`.
        for reason, names in moved.items():
            self.book.remove_targets(set(self.targets) | (gone - names), reason)

    # -- scraping ----------------------------------------------------------------------

    def _lock(self, name: str) -> asyncio.Lock:
        # One scrape of a target at a time, so its snapshots reach windows in order.
        return self._locks.setdefault(name, asyncio.Lock())

    async def scrape_target(
        self, name: str, *, feed: Iterable[Window] | None = None
    ) -> ScrapeResult:
        """Scrape one target now and hand the result to its state, live track and windows."""
        assert self.scraper is not None, "scraper starts with the app"
        state = self.targets.get(name)
        if state is None:  # a reload dropped it between the caller's look and this scrape
            return ScrapeResult(name, self.clock(), 0.0, None, "target removed from the config")
        async with self._lock(name):
            timeout = state.config.timeout or self.config.scrape_timeout
            result = await self.scraper.scrape(state.config, timeout, self.clock)
            self._record(name, result, feed)
        return result

    def _record(self, name: str, result: ScrapeResult, feed: Iterable[Window] | None) -> None:
        state = self.targets.get(name)
        if state is None:  # removed by a reload while the scrape was in flight
            return
        _log_state_change(name, state, result)
        if result.snapshot is not None:  # `ok`, spelled out so the type checker narrows
            # Our counters never show a NaN or negative value; windows and the live track see
            # the page as it was, and treat such a scrape as an anomaly (accounting).
            self.targets[name] = replace(state, last=_usable_only(result))
            self.live[name].feed(result.snapshot, result.at)
        else:
            log.debug("scrape failed target=%s error=%s", name, result.error)
            self.targets[name] = replace(
                state, last=result, errors_total=state.errors_total + 1,
                last_error=result.error, last_error_at=result.at,
            )
        if feed is not None:  # a window's own scrape; a round bumps once at its end
            self._generation += 1
        windows = feed if feed is not None else self.open_windows()
        self.book.feed((w for w in windows if w.takes_scrapes_of(name)), result)

    async def refresh_discovery(self) -> None:
        """Re-read discovery sources; targets that came or went change the target set."""
        session = self.scraper.session if self.scraper else None
        if await self.discovery.refresh(session, self.clock()):
            self._set_targets(self.config)
            self._close_removed_targets("no longer discovered")
            self._generation += 1
            log.info("discovery changed targets=%d", len(self.targets))

    async def scrape_round(self, spread: float = 0.0) -> None:
        """Scrape every target once, concurrently (bounded by the scraper).

        With `spread`, each target waits a fixed share of it (by a hash of its name, as
        Prometheus offsets its scrapes) before its scrape: answers then arrive over the
        spread instead of all in one burst that holds the event loop.
        """
        if self.config.file_sd or self.config.http_sd or self.config.prometheus_sd:
            await self.refresh_discovery()

        async def scrape(name: str) -> None:
            if spread > 0:
                slot = zlib.crc32(name.encode()) % SPREAD_SLOTS
                await asyncio.sleep(spread * slot / SPREAD_SLOTS)
            await self.scrape_target(name)

        await asyncio.gather(*(scrape(n) for n in list(self.targets)))
        self.ready = True
        self._generation += 1
        # Every round: only what changed, one transaction (see docs/performance.md). A failure
        # is logged and counted; what changed stays marked, so the next round retries it.
        try:
            self.book.save_round()
            if self.clock() >= self._next_expiry:
                self.book.expire(self.config.window_retention)
                self._next_expiry = self.clock() + EXPIRY_EVERY
        except StoreError as exc:
            log.error("window state not saved error=%s", exc)

    async def run(self) -> None:
        """Scrape rounds every `scrape_interval` until cancelled; a slow round skips no beat."""
        first = True
        while True:
            started = time.monotonic()
            # Spread over what the interval leaves after the slowest allowed scrape.
            spread = 0.9 * max(0.0, self.config.scrape_interval - self.config.scrape_timeout)
            try:
                await self.scrape_round(spread)
            except StoreError as exc:
                log.error("state not saved error=%s", exc)
            if first:
                # What exists after the first round (config, caches, state of every target)
                # lives as long as we do: moved out of the collector's sight, a full
                # collection stays short (measured at 1000 targets: 143 ms -> 58 ms pauses).
                gc.freeze()
                first = False
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.config.scrape_interval - elapsed))

    @property
    def generation(self) -> int:
        """Changes whenever what /metrics, the views or the landing page show may have."""
        return self._generation + self.book.version

    # -- windows -----------------------------------------------------------------------

    def open_windows(self) -> list[Window]:
        """Windows not stopped yet."""
        return self.book.open_windows()

    @property
    def last_window(self) -> Window | None:
        """The most recently stopped window (its answer)."""
        return self.book.last_window

    def window_with_series(self, window_id: str) -> Window:
        """A window with its per-scrape series (a stopped one's is read from the store)."""
        return self.book.with_series(window_id)

    def delete_window(self, window_id: str) -> None:
        """Forget a stopped window (its files stay); 409 while open, 404 if unknown."""
        self.book.delete(window_id)

    def get_window(self, window_id: str) -> Window:
        """An open or closed window by id, from memory or the store."""
        return self.book.get(window_id)

    def list_windows(self) -> list[Window]:
        """Open windows and the recent closed ones, newest first."""
        return self.book.recent()

    def _resolve_targets(self, names: list[str] | None, window_id: str) -> list[TargetConfig]:
        if names is None:
            return [s.config for s in self.targets.values()]
        by_host_port = {s.config.host_port: s.config for s in self.targets.values()}
        chosen: dict[str, TargetConfig] = {}
        for name in names:
            state = self.targets.get(name)
            target = state.config if state else by_host_port.get(name)
            if target is None:
                raise UnknownTargetError(name, window_id, sorted(self.targets))
            chosen[target.name] = target
        return list(chosen.values())

    async def _scrape_for_window(self, names: list[str], others: list[Window]
                                 ) -> list[ScrapeResult]:
        known = [n for n in names if n in self.targets]
        return list(await asyncio.gather(*(self.scrape_target(n, feed=others) for n in known)))

    async def start_window(
        self,
        window_id: str | None = None,
        name: str | None = None,
        targets: list[str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> tuple[bool, Window]:
        """Open a window (scraping its targets at once for the baseline); (created, window)."""
        chosen = self._resolve_targets(targets, window_id or "(new)")
        request = StartRequest(window_id, name, [TargetRef(t.name, t.url, t.host_port)
                                                 for t in chosen], dict(labels or {}))
        return await self.book.start(request, self._scrape_for_window,
                                     self.config.max_open_windows)

    async def stop_window(self, window_id: str) -> Window:
        """Close a window (scraping its targets at once); a second stop gives the same answer."""
        return await self.book.stop(window_id, self._scrape_for_window)

    def close(self) -> None:
        """Save open windows and close the store (SIGTERM, app shutdown)."""
        self.book.close()
