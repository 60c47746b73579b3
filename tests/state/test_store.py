"""exporter/state/store.py's accumulator rows: a whole row per window x target and the round part
written after it (`Accumulator.encode`), saved, loaded, moved and forgotten together."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import sqlite3

import pytest
from faults.servers import Counters, RawTarget

from exporter.core.counting import Accumulator
from exporter.core.snapshot import Field, SeriesKey, Snapshot
from exporter.core.window import AccumulatorRows, Window
from exporter.state.store import STATE_CACHE_KIB, STATE_PAGE_SIZE, StateStore, connect_state


def page(drafts: float, created: float = 1.0) -> Snapshot:
    values = {SeriesKey(Field.DRAFTS, "m", "0", -1): drafts,
              SeriesKey(Field.DRAFT_TOKENS, "m", "0", -1): 3 * drafts,
              SeriesKey(Field.ACCEPTED, "m", "0", -1): drafts,
              SeriesKey(Field.PER_POS, "m", "0", 0): drafts}
    return Snapshot(values=values, created=dict.fromkeys(values, created))


def open_window(targets: tuple[str, ...] = ("a", "b")) -> Window:
    window = Window(id="w", name="w", targets={}, labels={}, started_at=100.0)
    for name in targets:
        window.accumulators[name] = Accumulator()
        window.accumulators[name].feed(page(10), 100.0)
    return window


def save(store: StateStore, window: Window, *, whole: bool = False, **rows_of) -> tuple[int, int]:
    """Save the window's accumulators as the book does; (whole rows, round parts) written."""
    rows = AccumulatorRows().add(window, whole=whole, **rows_of)
    store.save([window.to_dict()], rows.whole, rounds=rows.rounds)
    rows.committed()
    return len(rows.whole), len(rows.rounds)


def count(path, table: str) -> int:
    with sqlite3.connect(path) as db:
        return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def feed(window: Window, drafts: float, at: float, created: float = 1.0) -> None:
    for acc in window.accumulators.values():
        acc.feed(page(drafts, created), at)


def loaded(path) -> Window:
    store = StateStore(path)
    try:
        (doc,) = store.load_open()
        return Window.from_dict(doc)
    finally:
        store.close()


class TestRoundParts:
    def test_whole_then_rounds_load_the_same(self, tmp_path):
        path = tmp_path / "state.sqlite"
        store, window = StateStore(path), open_window()
        assert save(store, window) == (2, 0)
        for i in range(3):
            feed(window, 12 + i, 101.0 + i)
            assert save(store, window) == (0, 2)
        assert count(path, "accumulator_rounds") == 2
        store.close()
        back = loaded(path)
        assert back.accumulators == window.accumulators
        assert back.accumulators["a"].totals().drafts == 4

    def test_a_whole_row_replaces_its_round_part(self, tmp_path):
        path = tmp_path / "state.sqlite"
        store, window = StateStore(path), open_window()
        save(store, window)
        feed(window, 12, 101.0)
        save(store, window)
        feed(window, 3, 102.0)  # a restart: the whole row
        assert save(store, window, targets=["a"]) == (1, 0)
        assert count(path, "accumulator_rounds") == 1  # b's
        store.close()
        back = loaded(path)
        assert back.accumulators["a"] == window.accumulators["a"]
        assert back.accumulators["a"].resets == 1

    def test_moved_and_forgotten_with_their_window(self, tmp_path):
        store, window = StateStore(tmp_path / "old.sqlite"), open_window()
        save(store, window)
        feed(window, 12, 101.0)
        save(store, window)
        moved = StateStore(tmp_path / "new.sqlite")
        moved.copy_from(store)
        assert count(tmp_path / "new.sqlite", "accumulator_rounds") == 2
        moved.close()
        assert loaded(tmp_path / "new.sqlite").accumulators == window.accumulators
        store.delete(["w"])
        assert count(tmp_path / "old.sqlite", "accumulator_rounds") == 0
        store.close()

    def test_a_stopped_window_leaves_none(self, tmp_path):
        path = tmp_path / "state.sqlite"
        store, window = StateStore(path), open_window()
        save(store, window)
        feed(window, 12, 101.0)
        save(store, window)
        window.stopped_at, window.answer = 102.0, {"results": {}}
        store.save([window.to_dict()])
        assert count(path, "accumulators") == count(path, "accumulator_rounds") == 0
        store.close()

    def test_an_unreadable_round_part_is_logged_and_its_whole_row_kept(self, tmp_path, caplog):
        path = tmp_path / "state.sqlite"
        store, window = StateStore(path), open_window(("a",))
        save(store, window)
        whole = json.loads(window.accumulators["a"].to_json())
        feed(window, 12, 101.0)
        save(store, window)
        store.close()
        with sqlite3.connect(path) as db:
            db.execute("UPDATE accumulator_rounds SET doc='{not json'")
        back = loaded(path)
        assert back.accumulators["a"] == Accumulator.from_dict(whole)
        assert "accumulator state unreadable id=w target=a" in caplog.text


class TestThroughTheBook:
    async def test_rounds_write_parts_and_a_restart_seen_goes_whole_at_once(
            self, exporter, tmp_path):
        target = await RawTarget(Counters(k=2)).start()
        try:
            target.counters.add(10, 20, [9, 8])
            exp = await exporter({"targets": [{"name": "a", "url": target.url}]})
            path = tmp_path / "out" / "state.sqlite"
            await exp.start(id="w")
            target.counters.add(5, 10, [4, 3])
            await exp.round()
            assert count(path, "accumulator_rounds") == 1
            target.counters.restart()
            target.counters.add(2, 4, [2, 1])
            # One scrape, no round's save after it: the restart is in the database already.
            await exp.service.scrape_target("a")
            assert count(path, "accumulator_rounds") == 0
            with sqlite3.connect(path) as db:
                (doc,) = db.execute("SELECT doc FROM accumulators").fetchone()
            assert json.loads(doc)["resets"] == 1
            answer = await exp.stop("w")
            assert answer["results"]["a"]["increase"]["num_drafts"] == 7
        finally:
            await target.stop()


class TestWhatSQLiteKeeps:
    def test_a_saved_answer_is_not_held_by_a_prepared_statement(self, tmp_path):
        # SQLite keeps a statement's last bound values until it runs again: a cached window
        # upsert held the last stop's answer (~5 MB at 1000 targets) until the next save.
        connections = []

        def connect(path):
            connections.append(connect_state(path))
            return connections[-1]

        store, window = StateStore(tmp_path / "state.sqlite", connect=connect), open_window()
        save(store, window)
        window.stopped_at, window.answer = 102.0, {"results": {}, "note": "x" * 2_000_000}
        store.save([window.to_dict()], sync=True)
        (held,) = connections[-1].execute(
            "SELECT coalesce(sum(mem), 0) FROM sqlite_stmt").fetchone()
        assert held < 100_000
        assert store.load("w")["answer"]["note"] == "x" * 2_000_000
        store.close()

    def test_the_page_cache_is_small(self, tmp_path):
        db = connect_state(tmp_path / "state.sqlite")
        assert db.execute("PRAGMA cache_size").fetchone()[0] == -STATE_CACHE_KIB
        db.close()

    def test_a_new_database_has_bigger_pages_and_an_old_one_keeps_its_own(self, tmp_path):
        # A stop's ~5 MB answer is a chain of overflow pages: fewer, bigger ones write faster.
        def page_size(path):
            db = sqlite3.connect(path)
            try:
                return db.execute("PRAGMA page_size").fetchone()[0]
            finally:
                db.close()

        old = sqlite3.connect(tmp_path / "old.sqlite")
        old.execute("PRAGMA journal_mode=WAL")
        old.execute("CREATE TABLE mine (x)")
        old.close()
        for name, size in (("new.sqlite", STATE_PAGE_SIZE), ("old.sqlite", 4096)):
            store, window = StateStore(tmp_path / name), open_window()
            save(store, window)
            window.stopped_at, window.answer = 102.0, {"results": {}, "note": "x" * 100_000}
            store.save([window.to_dict()], sync=True)
            assert store.load("w")["answer"]["note"] == "x" * 100_000
            store.close()
            assert page_size(tmp_path / name) == size

    @pytest.mark.may_skip_in_ci("asks the shared SQLite library, which the sqlite3 module "
                                "may not be linked to")
    def test_a_big_answer_does_not_fill_a_big_page_cache(self, tmp_path):
        # The default page cache (2 MiB) filled with the first big answer's pages and stayed
        # full: 2 MiB of the server's growth over its first window (bench markers).
        sqlite_memory = _sqlite_memory_used()
        store, window = StateStore(tmp_path / "state.sqlite"), open_window()
        save(store, window)
        before = sqlite_memory()
        window.stopped_at, window.answer = 102.0, {"results": {}, "note": "x" * 5_000_000}
        store.save([window.to_dict()], sync=True)
        assert store.load("w")["answer"]["note"] == "x" * 5_000_000
        grown = sqlite_memory() - before
        assert grown < (STATE_CACHE_KIB + 256) * 1024, grown
        store.close()


def _sqlite_memory_used():
    """SQLite's own count of the memory it holds (the whole process), from the library the
    sqlite3 module uses; the test is skipped where that library is not the system's."""
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        pytest.skip("no shared SQLite library to ask")
    lib = ctypes.CDLL(name)
    lib.sqlite3_libversion.restype = ctypes.c_char_p
    if lib.sqlite3_libversion().decode() != sqlite3.sqlite_version:
        pytest.skip("the sqlite3 module links another SQLite than the shared library")
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return lib.sqlite3_memory_used
