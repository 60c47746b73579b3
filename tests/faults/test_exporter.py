"""The exporter itself fails: full or unwritable disks, corrupt state, reloads, signals."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import shutil
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from clitools import CLI, fake_add, fake_vllm, free_port, http, process, wait_http, write_config

from exporter.state import resultfiles, store
from faults.checks import assert_increase, increase, still_serving, value
from faults.servers import Counters, RawTarget, hanging_listener


@pytest.fixture
async def pair():
    """Two healthy raw targets with some warm-up traffic."""
    a = await RawTarget(Counters(k=2)).start()
    b = await RawTarget(Counters(k=2)).start()
    a.counters.add(10, 20, [9, 8])
    b.counters.add(30, 60, [20, 10])
    yield a, b
    await a.stop()
    await b.stop()


async def _exp(exporter, pair, *, state_connect=None, **extra):
    a, b = pair
    return await exporter({"targets": [{"name": "a", "url": a.url}, {"name": "b", "url": b.url}]}
                          | extra, state_connect=state_connect)


class TestResultsNotWritable:
    async def _stop_fails_then_succeeds(self, exp, pair, make_fault, clear_fault):
        a, b = pair
        a0, b0 = a.counters.totals(), b.counters.totals()
        assert (await exp.client.post("/api/v1/windows", json={"id": "w1"})).status == 201
        a.counters.add(5, 10, [4, 3])
        await exp.round()
        make_fault()
        failed = await exp.client.post("/api/v1/windows/w1/stop")
        assert failed.status == 503
        assert failed.headers["Retry-After"]
        error = (await failed.json())["error"]
        assert 'window "w1" stays open' in error and "stop it again" in error
        state = await (await exp.client.get("/api/v1/windows/w1")).json()
        assert state["status"] == "open"
        # Open in the state database too (its files are written before it is saved stopped):
        # a restart now finds it open.
        saved = store.StateStore(exp.service.config.state_path)
        try:
            (doc,) = saved.load_open()
            assert doc["id"] == "w1" and sorted(doc["accumulators"]) == ["a", "b"]
        finally:
            saved.close()
        # The failed stop's scrapes are the window's (start, round, stop: three each).
        assert state["scrapes"] == {"a": 3, "b": 3}
        found = await still_serving(exp.client)
        assert value(found, "specdec_windows_open") == 1
        a.counters.add(1, 2, [1, 0])  # the window still counts after the failed stop
        b.counters.add(2, 4, [2, 1])
        await exp.round()
        clear_fault()
        stopped = await exp.client.post("/api/v1/windows/w1/stop")
        assert stopped.status == 200
        answer = await stopped.json()
        assert_increase(answer["results"]["a"], increase(a0, a.counters.totals()))
        assert_increase(answer["results"]["b"], increase(b0, b.counters.totals()))
        assert answer["results"]["a"]["coverage"] == "full"
        assert await (await exp.client.post("/api/v1/windows/w1/stop")).json() == answer
        # The answer says where its files are; window.json holds it, key for key.
        where = answer["results_dir"]
        assert where.endswith("/w1") and (Path(where) / "window.json").is_file()
        return answer

    async def test_results_directory_not_writable(self, exporter, pair, tmp_path):
        exp = await _exp(exporter, pair)
        blocker = tmp_path / "out" / "w1"

        def block() -> None:
            # A file where the window's folder goes: the stop cannot write there.
            shutil.rmtree(blocker, ignore_errors=True)
            blocker.write_text("a file where the directory goes")

        answer = await self._stop_fails_then_succeeds(exp, pair, block, blocker.unlink)
        on_disk = json.loads((tmp_path / "out" / "w1" / "window.json").read_text())
        assert on_disk == answer

    async def test_disk_full_writing_results(self, exporter, pair, monkeypatch, tmp_path):
        exp = await _exp(exporter, pair)
        real = resultfiles.atomic_write

        def full(path, data, **_):
            raise OSError(errno.ENOSPC, "No space left on device")

        answer = await self._stop_fails_then_succeeds(
            exp, pair, lambda: monkeypatch.setattr(resultfiles, "atomic_write", full),
            lambda: monkeypatch.setattr(resultfiles, "atomic_write", real))
        assert json.loads((tmp_path / "out" / "w1" / "window.json").read_text()) == answer

    async def test_disk_full_for_the_state_database(self, exporter, pair):
        opened: list[sqlite3.Connection] = []

        def connect(path):
            opened.append(sqlite3.connect(path))
            return opened[-1]

        exp = await _exp(exporter, pair, state_connect=connect)
        (db,) = opened  # the exporter's one connection: its SQLite faults are the store's

        def fill() -> None:
            # SQLite's own "database or disk is full": no page may be added any more.
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            db.execute(f"PRAGMA max_page_count={pages}")

        def free() -> None:
            db.execute("PRAGMA max_page_count=1073741823")

        def refuse_writes() -> None:
            # A stopped window's state is its answer, often no bigger than the open window's:
            # a full disk may well take it. A database that refuses every write does not.
            db.execute("PRAGMA query_only=1")

        def allow_writes() -> None:
            db.execute("PRAGMA query_only=0")

        await self._stop_fails_then_succeeds(exp, pair, refuse_writes, allow_writes)
        # A start that cannot be saved is refused, not half-made: a retry creates it.
        fill()
        big = {"note": "x" * 30_000}  # needs new pages
        refused = await exp.client.post("/api/v1/windows", json={"id": "w2", "labels": big})
        assert refused.status == 503
        assert 'window "w2" not started' in (await refused.json())["error"]
        assert (await exp.client.get("/api/v1/windows/w2")).status == 404
        free()
        assert (await exp.client.post("/api/v1/windows", json={"id": "w2"})).status == 201


class TestCorruptState:
    def _garbage(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"this is not a database\x00" * 500)

    def _wrong_schema(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE windows (id TEXT, colour TEXT)")
        db.execute("INSERT INTO windows VALUES ('x', 'red')")
        db.commit()
        db.close()

    def _truncated(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE windows (id TEXT PRIMARY KEY, open INTEGER NOT NULL, "
                   "started_at REAL NOT NULL, doc TEXT NOT NULL)")
        for n in range(200):
            db.execute("INSERT INTO windows VALUES (?, 1, 0, ?)", (f"w{n}", "{}" + " " * 3000))
        db.commit()
        db.close()
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])

    @pytest.mark.parametrize("damage", ["_garbage", "_wrong_schema", "_truncated"])
    async def test_moved_aside_and_serving(self, exporter, pair, tmp_path, caplog, damage):
        path = tmp_path / "out" / "state.sqlite"
        getattr(self, damage)(path)
        original = path.read_bytes()
        with caplog.at_level(logging.ERROR):
            exp = await _exp(exporter, pair)
        aside = list(path.parent.glob("state.sqlite.corrupt-*"))
        assert len(aside) == 1 and aside[0].read_bytes() == original  # kept, not lost
        assert any("state database unreadable" in r.getMessage() and str(aside[0]) in
                   r.getMessage() for r in caplog.records)
        await exp.round()
        await still_serving(exp.client)
        assert (await exp.client.post("/api/v1/windows", json={"id": "fresh"})).status == 201
        assert (await exp.client.post("/api/v1/windows/fresh/stop")).status == 200

    async def test_unreadable_window_rows_are_skipped_loudly(self, exporter, pair, tmp_path,
                                                             caplog):
        exp = await _exp(exporter, pair)
        assert (await exp.client.post("/api/v1/windows", json={"id": "good"})).status == 201
        # Another writer puts rows the exporter cannot read into the file it holds open.
        with contextlib.closing(sqlite3.connect(tmp_path / "out" / "state.sqlite")) as db, db:
            db.execute("INSERT INTO windows VALUES ('bad-json', 1, 1.0, 'not json {')")
            db.execute("INSERT INTO windows VALUES ('bad-shape', 1, 2.0, '{\"id\": 3}')")
        with caplog.at_level(logging.ERROR):
            again = await _exp(exporter, pair)
        assert "good" in [w.id for w in again.service.book.open_windows()]
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert "bad-json" in messages and "bad-shape" in messages
        for bad in ("bad-json", "bad-shape"):
            response = await again.client.get(f"/api/v1/windows/{bad}")
            assert response.status == 503, bad
            assert "unreadable" in (await response.json())["error"]
        listing = await again.client.get("/api/v1/windows")
        assert listing.status == 200
        await still_serving(again.client)


class TestReload:
    async def test_invalid_file_keeps_the_old_config(self, exporter, pair, tmp_path):
        a, b = pair
        path = tmp_path / "c.yaml"
        good = {"output_dir": str(tmp_path / "out"),
                "targets": [{"name": "a", "url": a.url}, {"name": "b", "url": b.url}]}
        path.write_text(json.dumps(good))
        exp = await exporter(good, config_path=path)
        await exp.round()
        for bad in ("targets: [\n", "scrape_intervall: 5s\n", "targets: [{name: a}]\n", "\x00"):
            path.write_text(bad)
            refused = await exp.client.post("/-/reload")
            assert refused.status == 400
            assert "error" in await refused.json()
            a.counters.add(1, 2, [1, 1])
            await exp.round()
            found = await still_serving(exp.client)
            assert value(found, "specdec_config_last_reload_successful") == 0
            assert value(found, "specdec_target_up", target="a") == 1
            assert value(found, "specdec_drafts_total", target="a") == a.counters.totals()[
                "num_drafts"]
        path.write_text(json.dumps(good))
        assert (await exp.client.post("/-/reload")).status == 200
        found = await still_serving(exp.client)
        assert value(found, "specdec_config_last_reload_successful") == 1

    async def test_dropping_a_target_with_an_open_window(self, exporter, pair, tmp_path):
        a, b = pair
        path = tmp_path / "c.yaml"
        both = {"output_dir": str(tmp_path / "out"),
                "targets": [{"name": "a", "url": a.url}, {"name": "b", "url": b.url}]}
        path.write_text(json.dumps(both))
        exp = await exporter(both, config_path=path)
        a0 = a.counters.totals()
        assert (await exp.client.post("/api/v1/windows", json={"id": "w"})).status == 201
        a.counters.add(5, 10, [5, 2])
        b.counters.add(7, 14, [7, 3])
        await exp.round()
        path.write_text(json.dumps(both | {"targets": both["targets"][:1]}))
        assert (await exp.client.post("/-/reload")).status == 200
        a.counters.add(1, 2, [1, 0])
        b.counters.add(100, 200, [100, 100])  # after its removal: never counted
        await exp.round()
        found = await still_serving(exp.client)
        assert value(found, "specdec_target_up", target="b") is None
        answer = await (await exp.client.post("/api/v1/windows/w/stop")).json()
        assert_increase(answer["results"]["a"], increase(a0, a.counters.totals()))
        dropped = answer["results"]["b"]
        assert dropped["status"] == "na"
        # The time in ISO 8601 UTC, as every time in a note.
        assert re.fullmatch(r"target removed from the config at "
                            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", dropped["error"])
        assert dropped["increase_until_removed"]["num_drafts"] == 7
        assert answer["aggregate"]["targets"] == ["a"]


def _serve_with_a_slow_target(tmp_path, vllm: int, hang) -> tuple[str, list[str]]:
    """(base URL, serve command) of an exporter over a fake vLLM and a target that never answers."""
    port = free_port()
    config = write_config(
        tmp_path / "c.yaml", port,
        [{"name": "a", "url": f"http://127.0.0.1:{vllm}/metrics"},
         {"name": "slow", "url": f"http://127.0.0.1:{hang.getsockname()[1]}/metrics"}],
        scrape_interval="3s", scrape_timeout="2s")
    return f"http://127.0.0.1:{port}", CLI + ["serve", "--config", str(config)]


@pytest.mark.e2e
class TestSigtermDuringStop:
    def test_stop_in_flight_completes_and_a_retry_after_restart_agrees(self, tmp_path):
        hang = hanging_listener()
        with fake_vllm("--k", "2") as vllm:
            base, serve = _serve_with_a_slow_target(tmp_path, vllm, hang)
            with process(serve) as first:
                wait_http(f"{base}/-/healthy")
                assert http("POST", f"{base}/api/v1/windows", {"id": "t1"})[0] == 201
                fake_add(vllm, 6, 12, [5, 3])
                answers = []
                stopper = threading.Thread(
                    target=lambda: answers.append(http("POST", f"{base}/api/v1/windows/t1/stop")))
                stopper.start()
                time.sleep(0.7)  # the stop is waiting on the slow target's scrape
                first.send_signal(signal.SIGTERM)
                stopper.join(timeout=30)
                assert first.wait(timeout=30) == 0
            assert answers and answers[0][0] == 200, answers
            first_answer = answers[0][1]
            assert first_answer["results"]["a"]["data"]["num_drafts"] == 6
            assert first_answer["results"]["slow"]["status"] == "na"
            with process(serve):
                wait_http(f"{base}/-/healthy")
                status, state = http("GET", f"{base}/api/v1/windows/t1")
                assert status == 200 and state == first_answer
                assert http("POST", f"{base}/api/v1/windows/t1/stop") == (200, first_answer)
        hang.close()

    def test_sigterm_during_start_then_stop_after_restart(self, tmp_path):
        hang = hanging_listener()
        with fake_vllm("--k", "2") as vllm:
            base, serve = _serve_with_a_slow_target(tmp_path, vllm, hang)
            with process(serve) as first:
                wait_http(f"{base}/-/healthy")
                answers = []
                starter = threading.Thread(target=lambda: answers.append(
                    http("POST", f"{base}/api/v1/windows", {"id": "s1"})))
                starter.start()
                time.sleep(0.7)
                first.send_signal(signal.SIGTERM)
                starter.join(timeout=30)
                assert first.wait(timeout=30) == 0
            assert answers and answers[0][0] == 201, answers
            fake_add(vllm, 4, 8, [4, 1])
            with process(serve):
                wait_http(f"{base}/-/healthy")
                status, answer = http("POST", f"{base}/api/v1/windows/s1/stop")
        hang.close()
        assert status == 200
        assert answer["results"]["a"]["data"]["num_drafts"] == 4

