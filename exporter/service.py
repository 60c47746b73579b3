"""The running exporter: target states, the scrape loop, windows and reloads, on one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from exporter.accounting import LiveTrack
from exporter.config import Config, TargetConfig, check_reload, load_config
from exporter.discovery import Discovery
from exporter.errors import RequestError, StoreError, UnknownTargetError, UnknownWindowError
from exporter.results import window_answer
from exporter.scrape import Scraper, ScrapeResult
from exporter.store import StateStore, write_results
from exporter.window import MAX_NAME, TargetRef, Window, check_window_id, new_window_id

log = logging.getLogger(__name__)

RECENT_WINDOWS = 50


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


def _window_from(doc: dict) -> Window:
    """A stored window, or `StoreError` when its state does not have a window's shape."""
    try:
        return Window.from_dict(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoreError(f'window "{doc.get("id")}" state is unreadable: {exc!r}') from exc


def _usable_only(result: ScrapeResult) -> ScrapeResult:
    """Drop NaN, infinite and negative counter values: no counter has them, none is exposed."""
    snapshot = result.snapshot
    if snapshot is None or all(math.isfinite(v) and v >= 0 for v in snapshot.values.values()):
        return result
    values = {k: v for k, v in snapshot.values.items() if math.isfinite(v) and v >= 0}
    return replace(result, snapshot=replace(snapshot, values=values))


def owns(target: TargetConfig, shards: int, index: int) -> bool:
    """Stable split of targets among exporter replicas, by a hash of the target name."""
    return shards <= 1 or zlib.crc32(target.name.encode()) % shards == index


class ExporterService:
    """Everything the HTTP handlers and the collector read and change, behind plain methods."""

    def __init__(
        self,
        config: Config,
        *,
        config_path: str | Path | None = None,
        overrides: dict | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.config = config
        self.config_path = config_path
        self.overrides = overrides or {}  # from the environment: every reload keeps them
        self.clock = clock
        self.scraper: Scraper | None = None
        self.targets: dict[str, TargetState] = {}
        self.live: dict[str, LiveTrack] = {}
        self.windows: dict[str, Window] = {}  # open ones, and recently closed ones
        self.last_window: Window | None = None
        self.ready = False
        self.generation = 0  # bumped when what /metrics shows may have changed
        self.reload_ok = True
        self.reload_at = clock()
        self.store = StateStore(config.state_path)
        self._locks: dict[str, asyncio.Lock] = {}
        self._pending: dict[str, asyncio.Future] = {}  # window id -> start or stop in flight
        self._closed_loaded = False  # recent closed windows read from the store into memory
        self._saved_at = time.monotonic()
        self.discovery = Discovery(config)
        self._set_targets(config)
        self._restore()

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

    def reload(self, config: Config | None = None) -> Config:
        """Re-read the config file (or take `config`, read off the loop); keep the old one if
        the new one is invalid or changes what needs a restart."""
        if self.config_path is None:
            raise RequestError("no config file to reload", status=409)
        try:
            if config is None:
                config = load_config(self.config_path, self.overrides)
            check_reload(self.config, config, str(self.config_path))
        except Exception:
            self.reload_ok = False
            self.generation += 1
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
        self.generation += 1
        log.info("config reloaded targets=%d", len(self.targets))
        return config

    def _close_removed_targets(self, why: str = "removed from the config") -> None:
        now = self.clock()
        for window in self.open_windows():
            for name in window.targets:
                if name not in self.targets and name not in window.removed:
                    window.removed[name] = f"target {why} at {now:.3f}"
        self._save_open()

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
        if result.ok:
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
            self.generation += 1
        windows = feed if feed is not None else self.open_windows()
        for window in windows:
            if window.takes_scrapes_of(name):
                window.feed(result)

    async def refresh_discovery(self) -> None:
        """Re-read discovery sources; targets that came or went change the target set."""
        session = self.scraper.session if self.scraper else None
        if await self.discovery.refresh(session, self.clock()):
            self._set_targets(self.config)
            self._close_removed_targets("no longer discovered")
            self.generation += 1
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
                await asyncio.sleep(spread * (zlib.crc32(name.encode()) % 1024) / 1024)
            await self.scrape_target(name)

        await asyncio.gather(*(scrape(n) for n in list(self.targets)))
        self.ready = True
        self.generation += 1
        if time.monotonic() - self._saved_at >= self.config.state_save_interval:
            self._save_open()

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

    # -- windows -----------------------------------------------------------------------

    def open_windows(self) -> list[Window]:
        """Windows not stopped yet."""
        return [w for w in self.windows.values() if w.is_open]

    def _persist(self, windows: list[Window]) -> None:
        self.store.save([w.to_dict() for w in windows])

    def _save_open(self) -> None:
        self._persist(self.open_windows())
        self._saved_at = time.monotonic()

    def _restore(self) -> None:
        for doc in self.store.load_open():
            try:
                window = _window_from(doc)
            except StoreError as exc:
                log.error("window not restored id=%s error=%s", doc.get("id"), exc)
                continue
            window.downtimes.append((window.last_seen(), self.clock()))
            self.windows[window.id] = window
            for name in window.targets:
                if name not in self.targets and name not in window.removed:
                    window.removed[name] = "target not in the config when the exporter restarted"
            log.info("window restored id=%s targets=%d", window.id, len(window.targets))
        recent = self._closed(1)
        if recent:
            self.last_window = recent[0]

    def _closed(self, limit: int) -> list[Window]:
        windows = []
        for doc in self.store.recent_closed(limit):
            with contextlib.suppress(StoreError):  # logged by the store or skipped here
                windows.append(_window_from(doc))
        return windows

    def get_window(self, window_id: str) -> Window:
        """An open or closed window by id, from memory or the store."""
        window = self.windows.get(window_id)
        if window is None:
            doc = self.store.load(window_id)
            if doc is None:
                raise UnknownWindowError(window_id)
            window = _window_from(doc)
        return window

    def list_windows(self) -> list[Window]:
        """Open windows and the recent closed ones, newest first."""
        if not self._closed_loaded:
            # Once from the store (windows closed before a restart); then from memory, where
            # stops keep the most recent ones.
            for window in self._closed(RECENT_WINDOWS):
                self.windows.setdefault(window.id, window)
            self._closed_loaded = True
            self._forget_old_windows()
        known = dict(self.windows)
        return sorted(known.values(), key=lambda w: w.started_at, reverse=True)

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

    async def start_window(
        self,
        window_id: str | None = None,
        name: str | None = None,
        targets: list[str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> tuple[bool, Window]:
        """Open a window (scraping its targets at once for the baseline); (created, window)."""
        now = self.clock()
        window_id = check_window_id(window_id) if window_id is not None else new_window_id(now)
        if window_id in self._pending:
            await asyncio.shield(self._pending[window_id])
        existing = self.windows.get(window_id) or (
            _window_from(d) if (d := self.store.load(window_id)) else None
        )
        if existing is not None:
            return False, existing
        name = name or window_id
        if len(name) > MAX_NAME:
            raise RequestError(f"name must be at most {MAX_NAME} characters")
        chosen = self._resolve_targets(targets, window_id)
        if len(self.open_windows()) >= self.config.max_open_windows:
            raise RequestError(
                f"too many open windows (max_open_windows={self.config.max_open_windows})",
                status=429,
            )
        window = Window(
            id=window_id, name=name, labels=dict(labels or {}), started_at=now,
            targets={t.name: TargetRef(t.name, t.url, t.host_port) for t in chosen},
        )
        done = asyncio.get_running_loop().create_future()
        self._pending[window_id] = done
        try:
            self.windows[window_id] = window
            # The other open windows take these scrapes too: a server restart right after must
            # not hide what they counted since their last scrape.
            others = [w for w in self.open_windows() if w is not window]
            results = await asyncio.gather(
                *(self.scrape_target(t.name, feed=others) for t in chosen)
            )
            for result in results:
                if result.ok:
                    window.feed(result)
                else:
                    window.start_errors[result.target] = result.error or "scrape failed"
            try:
                self._persist([window])
            except StoreError as exc:
                # Not durable, so not started: a retry with the same id starts it afresh.
                del self.windows[window_id]
                raise StoreError(f'window "{window_id}" not started: {exc}') from exc
        finally:
            del self._pending[window_id]
            done.set_result(None)
        self.generation += 1
        log.info("window started id=%s targets=%d", window_id, len(chosen))
        return True, window

    async def stop_window(self, window_id: str) -> Window:
        """Close a window (scraping its targets at once); a second stop gives the same answer."""
        if window_id in self._pending:
            await asyncio.shield(self._pending[window_id])
        window = self.get_window(window_id)
        if not window.is_open:
            return window
        done = asyncio.get_running_loop().create_future()
        self._pending[window_id] = done
        try:
            live = [n for n in window.targets if n in self.targets and n not in window.removed]
            others = [w for w in self.open_windows() if w is not window]
            results = await asyncio.gather(*(self.scrape_target(n, feed=others) for n in live))
            stop_errors = dict(window.stop_errors)
            for result in results:
                if not result.ok:
                    window.stop_errors[result.target] = result.error or "scrape failed"
                elif window.takes_scrapes_of(result.target):
                    window.feed(result)
                    acc = window.accumulators.get(result.target)
                    if not result.snapshot.has_spec_decode and acc is not None and acc.last:
                        window.stop_errors[result.target] = "no spec decode series on the page"
            window.stopped_at = self.clock()
            answer = window_answer(window)
            try:
                # fsync of every file: off the loop, so scrapes and requests go on meanwhile.
                await asyncio.to_thread(
                    write_results, Path(self.config.output_dir) / window.id, answer
                )
                window.answer = answer
                self._persist([window])
            except StoreError as exc:
                # Stays open, its scrapes kept: a later stop retries and answers in full.
                window.stopped_at = None
                window.answer = None
                window.stop_errors = stop_errors
                with contextlib.suppress(StoreError):
                    self._persist([window])
                raise StoreError(
                    f'window "{window_id}" stays open: {exc}; stop it again once fixed'
                ) from exc
            self.last_window = window
            self._forget_old_windows()
        finally:
            del self._pending[window_id]
            done.set_result(None)
        self.generation += 1
        log.info("window stopped id=%s", window_id)
        return window

    def _forget_old_windows(self) -> None:
        closed = sorted(
            (w for w in self.windows.values() if not w.is_open), key=lambda w: w.started_at
        )
        for window in closed[:-RECENT_WINDOWS]:
            del self.windows[window.id]

    def close(self) -> None:
        """Save open windows and close the store (SIGTERM, app shutdown)."""
        try:
            self._save_open()
        except StoreError as exc:
            # Saved at every start and stop and every state_save_interval: what is lost is the
            # progress since then, which the next start's scrapes make up unless a server
            # restarted meanwhile (then the result notes the restart).
            log.error("open windows not saved at shutdown error=%s", exc)
        finally:
            self.store.close()
