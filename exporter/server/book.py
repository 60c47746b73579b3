"""The window book: start, stop, restore, persist and forget windows (`serve` and `measure`).
A window is durable once its start is acknowledged; what it counted is saved every round, and
at once when a scrape shows a server restart (the increase before it exists nowhere else)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Iterable, Iterator
from pathlib import Path
from typing import Any

from exporter.core.errors import RequestError, StoreError, UnknownWindowError
from exporter.core.isotime import iso_utc
from exporter.core.kept import LastWindow, StoppedWindow
from exporter.core.perrequest import RequestStats
from exporter.core.snapshot import ScrapeResult
from exporter.core.window import AccumulatorRows, Window
from exporter.server.isolate import Child, ChildError, in_thread
from exporter.server.memory import give_back_free_memory
from exporter.server.stop import (
    END,
    FEED,
    RECORD,
    ResultCodec,
    StopScrapes,
    forks_early,
    read_stop,
    stop_work,
)
from exporter.server.windowstart import StartRequest, retried
from exporter.state.recovery import RECENT_WINDOWS, doc_from_files, window_from, write_lost_results
from exporter.state.store import StateStore

log = logging.getLogger(__name__)


# Scrapes the named targets now, handing each result to the given other windows and callback.
ScrapeFn = Callable[[list[str], list[Window], Callable[[ScrapeResult], None] | None],
                    Awaitable[list[ScrapeResult]]]


def _stop_error(window_id: str, exc: BaseException) -> BaseException:
    """What a failed stop raises: `StoreError` (its files or its row not written; it stays
    open), the work's own failure as a `RuntimeError`, or `exc` as it is."""
    if isinstance(exc, ChildError):
        if exc.kind != StoreError.__name__:
            return RuntimeError(f"window stop failed: {exc.kind}: {exc}")
        exc = StoreError(str(exc))
    if isinstance(exc, StoreError):
        return StoreError(f'window "{window_id}" stays open: {exc}; stop it again once fixed')
    return exc


class WindowBook:
    """Open windows and the recent stopped ones, backed by a `StateStore`. Of stopped windows
    (answers too big for memory) only what lists and gauges read, and the last read whole, stay."""

    def __init__(self, store: StateStore, clock: Callable[[], float],
                 results_dir: Callable[[str], Path]):
        self.store = store
        self.clock = clock
        self.results_dir = results_dir  # window id -> where its result files go
        self.version = 0  # bumped whenever what readers see of the windows changes
        self.last_window: LastWindow | None = None
        self._windows: dict[str, Window] = {}  # acknowledged open ones
        self._stopped: dict[str, StoppedWindow] = {}  # the recent stopped ones
        self._pending: dict[str, asyncio.Future[None]] = {}  # id -> its start or stop in flight
        self._closed_loaded = False
        self._read: tuple[Window, bool] | None = None  # the last read whole; with its series?
        self.result_errors = 0  # stops whose result files could not be written
        # The last stop's answer text, until its HTTP answer takes it (not kept after).
        self._answer_text: tuple[str, bytes] | None = None
        # Windows being stopped -> the child making the answer, and its codec (`stop`).
        self._stopping: dict[str, tuple[Child, ResultCodec]] = {}

    # -- reading ------------------------------------------------------------------------

    def open_windows(self) -> list[Window]:
        return [w for w in self._windows.values() if w.is_open]

    def get(self, window_id: str) -> Window:
        """An open window, or a stopped one with its answer (read from the store)."""
        return self._windows.get(window_id) or self._read_whole(window_id, series=False)

    def with_series(self, window_id: str) -> Window:
        """Like `get`, with a stopped window's per-scrape series (kept in the store only)."""
        return self._windows.get(window_id) or self._read_whole(window_id, series=True)

    def _read_whole(self, window_id: str, *, series: bool) -> Window:
        # The last one read is kept: pages read the newest window on every refresh.
        if self._read is None or self._read[0].id != window_id or (series and not self._read[1]):
            window = self._load(window_id, series=series)
            if window is None:
                raise UnknownWindowError(window_id)
            if window.is_open:
                return window  # open in the store, not in the book (not restored): as stored
            self._read = (window, series)
        return self._read[0] if series else self._read[0].as_answer_only()

    def take_answer_text(self, window_id: str) -> bytes | None:
        """The compact text of a window's answer, once, right after the stop that made it."""
        if self._answer_text is not None and self._answer_text[0] == window_id:
            text, self._answer_text = self._answer_text[1], None
            return text
        return None

    def known(self, window_id: str) -> bool:
        """Whether a window of that id is open, or in the store."""
        return window_id in self._windows or self._load(window_id, series=False) is not None

    def in_flight(self, window_id: str) -> bool:
        return window_id in self._pending

    def recent(self) -> list[Window | StoppedWindow]:
        """Open windows and the recent stopped ones, newest first."""
        if not self._closed_loaded:
            for fields in self.store.recent_stopped_fields(RECENT_WINDOWS):
                self._stopped.setdefault(fields["id"], StoppedWindow.of(fields))
            self._closed_loaded = True
            self._forget_old()
        listed: list[Window | StoppedWindow] = [*self._windows.values(), *self._stopped.values()]
        return sorted(listed, key=lambda w: w.started_at, reverse=True)

    def _load(self, window_id: str, *, series: bool) -> Window | None:
        doc = self.store.load(window_id, series=series)
        return window_from(doc) if doc is not None else None

    def _newest_stopped(self) -> LastWindow | None:
        for doc in self.store.recent_closed(1):  # unreadable ones logged there
            try:
                return LastWindow.of(doc["answer"]) if doc["answer"] is not None else None
            except (KeyError, TypeError, AttributeError) as exc:
                log.error("last window gauges not restored id=%s error=answer unreadable: %r",
                          doc["id"], exc)
        return None

    # -- restore, feed, save ------------------------------------------------------------

    def restore(self, known_targets: Iterable[str], gone: Callable[[str], str]) -> None:
        """Open windows from the store; the time we were away is a downtime of each. `gone(name)`
        says why a target is not ours any more."""
        known = set(known_targets)
        for doc in self.store.load_open():
            try:
                window = window_from(doc)
            except StoreError as exc:
                log.error("window not restored id=%s error=%s", doc.get("id"), exc)
                continue
            window.downtimes.append((window.last_seen(), self.clock()))
            for name in window.targets:
                if name not in known and name not in window.removed:
                    window.removed[name] = f"target {gone(name)} when the exporter restarted"
            window.baseline_at_restore()
            self._windows[window.id] = window
            log.info("window restored id=%s targets=%d", window.id, len(window.targets))
        self.last_window = self._newest_stopped()
        self._save_all_open()
        write_lost_results(self.store, self.results_dir)

    def feed(self, windows: Iterable[Window], result: ScrapeResult) -> None:
        """Hand one scrape to windows; a restart it shows is saved, whole, before anything else."""
        for window in windows:
            if (stopping := self._stopping.get(window.id)) is not None:
                stopping[0].send((FEED, stopping[1].pack(result)))
            if window.feed(result) and window.id in self._windows:
                rows = AccumulatorRows().add(window, [result.target], whole=True)
                try:
                    self._save_rows(rows)
                except StoreError as exc:
                    log.error("restart not saved id=%s target=%s error=%s",
                              window.id, result.target, exc)

    def record(self, target: str, stats: RequestStats, *, skip: Container[str] = ()) -> None:
        """One proxied request of `target`, its answer complete now, into every open window
        that counts it but those in `skip` (a stop's child too); saved with the next round."""
        at = self.clock()
        for window in self.open_windows():
            if window.takes_scrapes_of(target) and window.id not in skip:
                window.record(target, stats, at)
                if (stopping := self._stopping.get(window.id)) is not None:
                    stopping[0].send((RECORD, target, stats, at))

    def save_round(self) -> None:
        """One transaction: every accumulator that changed since it was last saved (only its
        round part where that is all that changed), and windows with requests recorded."""
        if self.store.reopened():
            # The database went away under us: memory and the stopped windows' files write it back.
            self._save_all_open()
            self.store.save([doc for w in self._stopped.values()
                             if (doc := doc_from_files(self.results_dir(w.id), w)) is not None])
            return
        rows = AccumulatorRows()
        recorded = []
        for window in self.open_windows():
            if window.dirty:
                rows.add(window, window.dirty)
            if window.records_dirty:
                recorded.append(window)
        self._save_rows(rows, [w.to_dict() for w in recorded])
        for window in recorded:
            window.records_dirty = False

    def _save_rows(self, rows: AccumulatorRows, docs: Iterable[dict[str, Any]] = (), *,
                   sync: bool = False) -> None:
        self.store.save(docs, rows.whole, rounds=rows.rounds, sync=sync)
        rows.committed()

    def _save_all_open(self) -> None:
        # Whole rows: at restore and shutdown, and into a fresh database.
        windows = self.open_windows()
        rows = AccumulatorRows()
        for window in windows:
            rows.add(window, whole=True)
        self._save_rows(rows, [w.to_dict() for w in windows])

    def remove_targets(self, present: set[str], why: Callable[[str], str]) -> None:
        """Targets no longer present leave every open window, which says when and why
        (`why(name)`: removed, or moved to another shard)."""
        now = self.clock()
        changed = []
        for window in self.open_windows():
            for name in window.targets:
                if name not in present and name not in window.removed:
                    window.removed[name] = f"target {why(name)} at {iso_utc(now)}"
                    changed.append(window)
        if changed:
            self.store.save([w.to_dict() for w in changed])
            self.version += 1

    def move_store(self, path: Path) -> None:
        """The state database moves (a reload): rows copied before the old file goes;
        `StoreError` (the reload is refused) if the new file cannot take them."""
        old = self.store
        with contextlib.suppress(OSError):
            if path.exists() and os.path.samefile(path, old.path):
                return
        new = StateStore(path, connect=old.connect)
        try:
            new.copy_from(old)
        except StoreError:
            new.close()
            raise
        self.store = new
        old.remove_files()
        log.warning("state database moved from=%s to=%s", old.path, path)

    # -- start and stop -----------------------------------------------------------------

    async def start(self, request: StartRequest, scrape: ScrapeFn, max_open: int, *,
                    late: Iterable[str] = ()) -> tuple[bool, Window]:
        """Open a window, its targets scraped at once for the baseline but the `late` ones
        (each takes its own with `join`); (created, window)."""
        window = request.window(self.clock())
        await self._settled(window.id)
        existing = self._windows.get(window.id) or self._load(window.id, series=False)
        if existing is not None:
            return False, retried(existing, window)
        # Starts still scraping their baseline count too: 50 at once must not all pass.
        starting = sum(1 for wid in self._pending if wid not in self._windows)
        if len(self.open_windows()) + starting >= max_open:
            raise RequestError(f"too many open windows (max_open_windows={max_open})", status=429)
        async with self._in_flight(window.id):
            # The other open windows take these scrapes too: a server restart right after
            # must not hide what they counted since their last scrape.
            left_out = set(late)
            now = [t for t in window.targets if t not in left_out]
            window.take_baseline(await scrape(now, self.open_windows(), None))
            self._commit_start(window)
        log.info("window started id=%s targets=%d", window.id, len(window.targets))
        return True, window

    async def stop(self, window_id: str, scrape: ScrapeFn, *, answer: bool = True,
                   edges: dict[str, Any] | None = None) -> Window:
        """Close a window (its targets scraped at once); a second stop gives the same answer.
        `answer=False`: without its answer (`take_answer_text` has its text). `edges`: the
        answer's `edges` block (a window bounded by the traffic)."""
        await self._settled(window_id)
        window = self.get(window_id)
        if not window.is_open:
            return window
        async with self._in_flight(window_id):
            stop_errors, open_edges = dict(window.stop_errors), window.edges
            if edges is not None:
                window.edges = edges
            # A forked child makes the answer: forked now with a core to spare, fed the scrapes
            # as they come; else after them (it would compete with them).
            work = stop_work(window, self.results_dir(window.id))
            child, codec, early = Child(work), ResultCodec(), forks_early()
            scrapes = StopScrapes(window, child, codec)
            try:
                if early and child.start():
                    scrapes.forked = True
                    self._stopping[window.id] = (child, codec)
                others = [w for w in self.open_windows() if w is not window]
                await scrape(window.live_targets(), others, scrapes.take)
                window.stopped_at = self.clock()
                self._stopping.pop(window.id, None)
                child.start()  # after the scrapes, when not forked early
                end = (END, window.stopped_at, window.removed)
                child.send(end)
                data = await child.result()
                if data is None:  # no child, or a dead one: this window takes them, a thread works
                    scrapes.take_held()
                    data = await in_thread(lambda: work(iter([end])))
                self._commit_stop(window, *read_stop(data))
            except BaseException as exc:
                # Open again as it was, with the stop's scrapes in (taken like any other): a
                # later stop retries and answers in full.
                self._stopping.pop(window.id, None)
                scrapes.take_held()
                window.reopen(stop_errors)
                window.edges = open_edges
                if isinstance(exc, ChildError) and exc.kind == StoreError.__name__:
                    self.result_errors += 1  # the work's files
                error = _stop_error(window.id, exc)
                if error is exc:
                    raise
                raise error from exc
            finally:
                await child.close()
        # The state row made from the answer's text (megabytes, freed by now) goes back.
        give_back_free_memory()
        log.info("window stopped id=%s", window_id)
        return self.get(window_id) if answer else window.as_answer_only()

    async def join(self, window_id: str, target: str, scrape: ScrapeFn) -> None:
        """A target of an open window left out of its start takes its baseline now (scraped;
        the other open windows take the scrape too)."""
        window = self._windows[window_id]
        others = [w for w in self.open_windows() if w is not window]
        window.take_baseline(await scrape([target], others, None))

    def _commit_start(self, window: Window) -> None:
        try:
            # Durable (to the disk, not only past our death) before it is acknowledged.
            self._save_rows(AccumulatorRows().add(window, whole=True),
                            [window.to_dict()], sync=True)
        except StoreError as exc:
            # Not durable, so not started: a retry with the same id starts it afresh.
            raise StoreError(f'window "{window.id}" not started: {exc}') from exc
        self._windows[window.id] = window
        self.version += 1

    def _commit_stop(self, window: Window, kept: dict[str, Any], row: bytes,
                     answer_text: bytes) -> None:
        """The stop's answer saved; else `StoreError` (the window is reopened by `stop`)."""
        self.store.save(stopped=[(window.id, window.started_at, row)], sync=True)
        self._windows.pop(window.id, None)
        self._stopped[window.id] = StoppedWindow.of(kept)
        self.last_window = LastWindow.of_kept(kept)
        self._answer_text = (window.id, answer_text)
        self._forget_old()
        self.version += 1

    async def _settled(self, window_id: str) -> None:
        if window_id in self._pending:
            await asyncio.shield(self._pending[window_id])

    @contextlib.asynccontextmanager
    async def _in_flight(self, window_id: str) -> AsyncIterator[None]:
        # One start or stop per id at a time; the next caller waits, then sees its outcome.
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[window_id] = done
        try:
            yield
        finally:
            del self._pending[window_id]
            done.set_result(None)

    # -- recorded elsewhere -------------------------------------------------------------

    async def made(self, window: Window, work: Callable[[Iterator[Any]], bytes], *,
                   timeout: float) -> None:
        """A window stopped elsewhere (a store's history) whose answer `work` makes off the
        loop as a stop's (`stop_work`), committed as a stop is; 409 when its id is taken."""
        await self._settled(window.id)
        if self.known(window.id):
            raise RequestError(f'window "{window.id}" exists already: give another id',
                               status=409)
        async with self._in_flight(window.id):
            child = Child(work)
            try:
                forked = child.start()
                data = await child.result(timeout=timeout)
                if data is None and forked:
                    raise RuntimeError(f'window "{window.id}": its work ended without an answer '
                                       f"(killed, or over {timeout:.0f} s)")
                if data is None:
                    data = await in_thread(lambda: work(iter(())))
                self._commit_stop(window, *read_stop(data))
            except ChildError as exc:
                if exc.kind != StoreError.__name__:
                    raise
                self.result_errors += 1
                raise StoreError(f'window "{window.id}" not recorded: {exc}') from exc
            finally:
                await child.close()
        # No heap trim here (a stop has one): the parent made only the row, the child the rest.
        log.info("window recorded id=%s targets=%d", window.id,
                 len(self._stopped[window.id].targets))

    # -- forgetting ---------------------------------------------------------------------

    def delete(self, window_id: str) -> None:
        """Forget a stopped window (its result files stay); 409 while open or in flight."""
        if window_id in self._pending:
            raise RequestError(f'window "{window_id}" is being started or stopped', status=409)
        window = self.get(window_id)
        if window.is_open:
            raise RequestError(f'window "{window_id}" is open: stop it first', status=409)
        self._forget([window_id])
        log.info("window deleted id=%s", window_id)

    def expire(self, retention: float) -> None:
        """Stopped windows started more than `retention` seconds ago leave the store."""
        if old := self.store.stopped_before(self.clock() - retention):
            self._forget(old)
            log.info("stopped windows past retention forgotten count=%d", len(old))

    def _forget(self, window_ids: list[str]) -> None:
        self.store.delete(window_ids)
        self._read = None
        if self._answer_text is not None and self._answer_text[0] in window_ids:
            self._answer_text = None
        for window_id in window_ids:
            self._stopped.pop(window_id, None)
        if self.last_window is not None and self.last_window.id in window_ids:
            self.last_window = self._newest_stopped()
        self.version += 1

    def _forget_old(self) -> None:
        closed = sorted(self._stopped.values(), key=lambda w: w.started_at)
        for window in closed[:-RECENT_WINDOWS]:
            del self._stopped[window.id]

    def close(self) -> None:
        """Save open windows whole and close the store (SIGTERM, app shutdown)."""
        try:
            self._save_all_open()
        except StoreError as exc:
            # Lost: the last round's progress, which the next start makes up from the counters.
            log.error("open windows not saved at shutdown error=%s", exc)
        finally:
            self.store.close()
