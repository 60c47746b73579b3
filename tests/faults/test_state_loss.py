"""State that disappears: zombies, late baselines, damaged or deleted files,
and a reload that moves the state database."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import sqlite3

import pytest
from clitools import fake_add, fake_vllm, http, process, serve_over, wait_http
from conftest import Clock

from exporter.state.recovery import LOST_FILES_SPAN
from exporter.state.store import StateStore
from faults.checks import assert_increase, increase, still_serving, value
from faults.servers import Counters, RawTarget


@pytest.fixture
async def targets():
    """Two healthy raw targets with warm-up traffic, and one that never answers."""
    a = await RawTarget(Counters(k=2)).start()
    b = await RawTarget(Counters(k=2)).start()
    slow = await RawTarget(Counters(k=2)).start()
    slow.mode = "hang"
    a.counters.add(10, 20, [9, 8])
    b.counters.add(30, 60, [20, 10])
    yield a, b, slow
    for target in (a, b, slow):
        await target.stop()


def _config(tmp_path, a, b, slow=None, **extra) -> dict:
    targets = [{"name": "a", "url": a.url}, {"name": "b", "url": b.url}]
    if slow is not None:
        targets.append({"name": "slow", "url": slow.url})
    # The slow target's scrape times out after 3 s: the time a start waits on it.
    return {"output_dir": str(tmp_path / "out"), "scrape_interval": "5s",
            "scrape_timeout": "3s", "targets": targets} | extra


def _write(path, config: dict):
    path.write_text(json.dumps(config))
    return path


def _snapshot_state(out, to):
    """What a SIGKILL at this moment leaves on disk: the database and its log, as they are."""
    to.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal"):
        source = out / f"state.sqlite{suffix}"
        if source.exists():
            shutil.copyfile(source, to / f"state.sqlite{suffix}")


class TestZombieStart:
    async def test_window_not_durable_before_its_start_is_acknowledged(
        self, exporter, targets, tmp_path
    ):
        a, b, slow = targets
        path = _write(tmp_path / "c.yaml", _config(tmp_path, a, b, slow))
        exp = await exporter(json.loads(path.read_text()), config_path=path)
        assert (await exp.client.post(
            "/api/v1/windows", json={"id": "other", "targets": ["a", "b"]})).status == 201
        # The start waits on the slow target's baseline scrape...
        start = asyncio.create_task(exp.client.post("/api/v1/windows", json={"id": "z"}))
        while not exp.service.book.in_flight("z"):
            await asyncio.sleep(0.01)
        # ...while a reload drops a target of the other window (which saves it) and a round
        # saves what changed.
        _write(path, _config(tmp_path, a, b, slow) | {
            "targets": [{"name": "a", "url": a.url}, {"name": "slow", "url": slow.url}]})
        assert (await exp.client.post("/-/reload")).status == 200
        a.counters.add(1, 2, [1, 0])
        exp.service.book.save_round()
        _snapshot_state(tmp_path / "out", tmp_path / "killed")  # SIGKILL now
        response = await start
        assert response.status == 201  # acknowledged only now, after the snapshot

        after = await exporter(_config(tmp_path, a, b) | {"output_dir": str(tmp_path / "killed")})
        assert (await after.client.get("/api/v1/windows/z")).status == 404  # no zombie
        assert (await after.client.get("/api/v1/windows/other")).status == 200
        retry = await after.client.post("/api/v1/windows", json={"id": "z", "targets": ["a"]})
        assert retry.status == 201  # starts afresh


class TestRestoredWithoutBaseline:
    async def test_baseline_taken_at_restore_and_said(self, exporter, targets, tmp_path):
        a, b, _ = targets
        # A window saved before its baseline (what an older version could leave behind).
        store = StateStore(tmp_path / "out" / "state.sqlite")
        store.save([{"id": "old", "name": "old", "labels": {}, "started_at": 1.0,
                     "stopped_at": None, "accumulators": {}, "start_errors": {},
                     "stop_errors": {}, "last_errors": {}, "removed": {}, "answer": None,
                     "targets": {"a": [a.url, "127.0.0.1:1"], "b": [b.url, "127.0.0.1:2"]}}])
        store.close()
        # Before schema versions, and without the keys added since: migrated at the start.
        with sqlite3.connect(tmp_path / "out" / "state.sqlite") as db:
            db.execute("PRAGMA user_version=0")
        db.close()
        exp = await exporter(_config(tmp_path, a, b))
        await exp.round()  # the baseline, at restore
        a0 = a.counters.totals()
        a.counters.add(4, 8, [3, 2])
        answer = await exp.stop("old")
        result = answer["results"]["a"]
        assert_increase(result, increase(a0, a.counters.totals()))
        assert result["coverage"] == "partial"
        assert "no baseline was saved" in result["coverage_note"]
        # b counted nothing since its late baseline: no activity, said as such, not "no metrics".
        assert answer["results"]["b"]["status"] == "na"
        assert "No spec decode metrics found" not in answer["results"]["b"]["error"]


class TestDeletedUnderUs:
    async def test_files_deleted_while_running_are_written_back(
        self, exporter, targets, tmp_path, caplog
    ):
        a, b, _ = targets
        exp = await exporter(_config(tmp_path, a, b))
        a0 = a.counters.totals()
        await exp.start(id="w")
        await exp.start(id="done")
        await exp.stop("done")
        a.counters.add(5, 10, [4, 3])
        await exp.round()
        out = tmp_path / "out"
        for suffix in ("", "-wal", "-shm"):
            (out / f"state.sqlite{suffix}").unlink(missing_ok=True)
        with caplog.at_level(logging.ERROR):
            await exp.round()
        assert any("deleted or replaced" in r.getMessage() for r in caplog.records)
        found = await still_serving(exp.client)
        assert value(found, "specdec_state_write_errors_total") == 1
        a.counters.add(2, 4, [2, 1])
        await exp.round()
        _snapshot_state(out, tmp_path / "killed")  # SIGKILL now
        after = await exporter(_config(tmp_path, a, b) | {"output_dir": str(tmp_path / "killed")})
        assert (await after.client.get("/api/v1/windows/done")).status == 200
        answer = await after.stop("w")
        assert_increase(answer["results"]["a"], increase(a0, a.counters.totals()))


class TestFilesLostAfterAStop:
    """A stop syncs the state database, not its result files: a restart writes the latest
    stops' files again from the database where a power cut lost them."""

    async def test_lost_files_of_the_latest_stops_are_written_again(
        self, exporter, targets, tmp_path, caplog
    ):
        a, b, _ = targets
        clock = Clock()
        exp = await exporter(_config(tmp_path, a, b), clock=clock)
        await exp.start(id="old")
        await exp.stop("old")
        clock.now += LOST_FILES_SPAN + 1  # "old" was on the disk long before the cut
        for window in ("w1", "w2"):
            await exp.start(id=window)
            a.counters.add(3, 6, [2, 1])
            await exp.stop(window)
        out, cut = tmp_path / "out", tmp_path / "cut"
        written = {w: _files(out / w) for w in ("w1", "w2")}
        assert len(written["w1"]) == 3 and written["w1"]["window.json"]
        # What a power cut right after the stops can leave: the database, synced, and files
        # not yet on the disk: w1's window.json empty, w2's folder gone.
        _snapshot_state(out, cut)
        (cut / "w1" / "performances").mkdir(parents=True)
        (cut / "w1" / "window.json").write_bytes(b"")
        with caplog.at_level(logging.WARNING):
            await exporter(_config(tmp_path, a, b) | {"output_dir": str(cut)}, clock=clock)
        assert {w: _files(cut / w) for w in ("w1", "w2")} == written
        assert not (cut / "old").exists()  # older than the span: not looked at
        said = [r.getMessage() for r in caplog.records if "written again" in r.getMessage()]
        assert len(said) == 2 and "id=w1" in " ".join(said)

    async def test_files_on_the_disk_are_left_alone(self, exporter, targets, tmp_path):
        a, b, _ = targets
        exp = await exporter(_config(tmp_path, a, b))
        await exp.start(id="w")
        await exp.stop("w")
        before = {p: p.stat().st_mtime_ns for p in (tmp_path / "out" / "w").rglob("*")}
        await exporter(_config(tmp_path, a, b))  # a restart
        assert {p: p.stat().st_mtime_ns for p in (tmp_path / "out" / "w").rglob("*")} == before


def _files(folder) -> dict[str, bytes]:
    """Every file below `folder` by its path there."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


class TestReloadMovesTheState:
    async def test_new_output_dir_keeps_windows_across_a_restart(
        self, exporter, targets, tmp_path
    ):
        a, b, _ = targets
        path = _write(tmp_path / "c.yaml", _config(tmp_path, a, b))
        exp = await exporter(json.loads(path.read_text()), config_path=path)
        a0 = a.counters.totals()
        await exp.start(id="open")
        await exp.start(id="recent")
        await exp.stop("recent")
        moved = _config(tmp_path, a, b) | {"output_dir": str(tmp_path / "elsewhere")}
        _write(path, moved)
        assert (await exp.client.post("/-/reload")).status == 200
        assert not (tmp_path / "out" / "state.sqlite").exists()  # moved, not left behind
        a.counters.add(6, 12, [5, 4])
        await exp.round()
        _snapshot_state(tmp_path / "elsewhere", tmp_path / "killed")  # SIGKILL now
        after = await exporter(moved | {"output_dir": str(tmp_path / "killed")})
        assert (await after.client.get("/api/v1/windows/recent")).status == 200
        answer = await after.stop("open")
        assert_increase(answer["results"]["a"], increase(a0, a.counters.totals()))

    async def test_unwritable_new_place_refuses_the_reload(self, exporter, targets, tmp_path):
        a, b, _ = targets
        path = _write(tmp_path / "c.yaml", _config(tmp_path, a, b))
        exp = await exporter(json.loads(path.read_text()), config_path=path)
        await exp.start(id="open")
        blocker = tmp_path / "file"
        blocker.write_text("not a directory")
        _write(path, _config(tmp_path, a, b) | {"output_dir": str(blocker / "sub")})
        refused = await exp.client.post("/-/reload")
        assert refused.status >= 400
        assert "cannot" in (await refused.json())["error"]
        assert exp.service.config.output_dir == str(tmp_path / "out")  # the old one serves
        assert (await exp.client.post("/api/v1/windows/open/stop")).status == 200


@pytest.mark.e2e
def test_damaged_wal_is_found_logged_and_counted(tmp_path):
    with fake_vllm("--k", "2") as vllm:
        port, serve = serve_over(tmp_path, vllm)
        base = f"http://127.0.0.1:{port}"
        with process(serve) as first:
            wait_http(f"{base}/-/ready")
            for n in range(3):
                assert http("POST", f"{base}/api/v1/windows", {"id": f"w{n}"})[0] == 201
                fake_add(vllm, 3, 6, [2, 1])
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        wal = tmp_path / "out" / "state.sqlite-wal"
        data = bytearray(wal.read_bytes())
        assert len(data) > 32 + 3 * (24 + 4096)  # several frames, commits after the first
        data[32 + 24 + 100] ^= 0xFF  # one bit pattern inside the first frame's page
        wal.write_bytes(bytes(data))
        with process(serve) as second:
            wait_http(f"{base}/-/ready")
            status, text = http("GET", f"{base}/metrics")
            second.send_signal(signal.SIGTERM)
            _, err = second.communicate(timeout=30)
    assert status == 200
    assert "specdec_state_write_errors_total 1.0" in text
    assert "state write-ahead log damaged" in err and "frame 0 checksum mismatch" in err
    assert list((tmp_path / "out").glob("state.sqlite-wal.damaged-*"))  # kept for inspection
