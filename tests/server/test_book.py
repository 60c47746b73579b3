"""exporter/server/book.py through the HTTP API on real fake servers: windows started and
stopped with exact numbers in every RESULT, their files, the API's answers to bad or racing
requests, DELETE, retention of stopped windows, and what memory keeps of a stopped window."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import sqlite3
import types

import aiohttp
import pytest
from conftest import Clock
from faults.checks import samples, value
from faults.servers import Counters, RawTarget

from exporter.core.console import format_window
from exporter.server.book import RECENT_WINDOWS
from exporter.state.store import StateStore
from server.test_isolate import children_of, zombies_of

DAY = 86400.0


@pytest.fixture
async def target():
    raw = await RawTarget(Counters(k=2)).start()
    raw.counters.add(10, 20, [9, 8])
    yield raw
    await raw.stop()


async def _stopped(exp, target, window_id: str) -> dict:
    await exp.start(id=window_id)
    target.counters.add(3, 6, [2, 1])
    return await exp.stop(window_id)


class TestWindowNumbers:
    async def test_one_engine_exact(self, fake_vllm, exporter):
        fake = await fake_vllm(k=5)
        fake.server.add(0, 50, 250, [50, 50, 50, 50, 50])  # warm-up before the window
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        started = await exp.start(id="w1", name="run one")
        assert started["id"] == "w1" and started["targets"] == ["a"]
        fake.server.add(0, 100, 500, [99, 99, 99, 99])
        await exp.round()
        fake.server.add(0, 63, 315, [63, 63, 63, 63, 62])
        answer = await exp.stop("w1")
        result = answer["results"]["a"]
        assert result["status"] == "ok" and result["error"] is None
        assert result["url"] == fake.url
        assert result["data"] == {
            "num_drafts": 163, "draft_tokens": 815, "accepted_tokens": 4 * 99 + 4 * 63 + 62,
            "acceptance_rate": (4 * 99 + 4 * 63 + 62) / 815 * 100,  # full precision
            "acceptance_length": 1 + (4 * 99 + 4 * 63 + 62) / 163,
            "per_position_acceptance_rates": {
                "0": 162 / 163, "1": 162 / 163, "2": 162 / 163, "3": 162 / 163, "4": 62 / 163,
            },
        }
        assert result["raw"]["before"]["num_drafts"] == 50
        assert result["raw"]["after"]["num_drafts"] == 213
        assert result["resets"] == 0 and result["scrapes"] == 3 and result["engines"] == 1
        assert result["coverage"] == "full"
        assert answer["aggregate"]["data"] == result["data"]

    async def test_two_engines_summed_before_dividing(self, fake_vllm, exporter):
        fake = await fake_vllm(k=3, engines=2)
        exp = await exporter({"targets": [{"name": "dp", "url": fake.url}]})
        await exp.start(id="w2")
        fake.server.add(0, 10, 30, [9, 6, 3])
        fake.server.add(1, 30, 90, [15, 6, 0])
        answer = await exp.stop("w2")
        data = answer["results"]["dp"]["data"]
        assert data["num_drafts"] == 40 and data["draft_tokens"] == 120
        assert data["accepted_tokens"] == 39
        assert data["acceptance_rate"] == 39 / 120 * 100
        assert data["acceptance_length"] == 1 + 39 / 40
        assert data["per_position_acceptance_rates"] == {"0": 0.6, "1": 0.3, "2": 0.075}
        assert answer["results"]["dp"]["engines"] == 2

    async def test_twelve_positions_in_numeric_order(self, fake_vllm, exporter):
        fake = await fake_vllm(k=12)
        exp = await exporter({"targets": [{"name": "k12", "url": fake.url}]})
        await exp.start(id="w12")
        fake.server.add(0, 100, 1200, [100 - 5 * i for i in range(12)])
        answer = await exp.stop("w12")
        rates = answer["results"]["k12"]["data"]["per_position_acceptance_rates"]
        assert list(rates) == [str(i) for i in range(12)]
        assert rates["10"] == 0.5 and rates["11"] == 0.45
        block = format_window(answer)
        assert "{0: 1.0000, 1: 0.9500, 2: 0.9000," in block
        assert "9: 0.5500, 10: 0.5000, 11: 0.4500}" in block

    async def test_position_never_accepted_shows_zero(self, fake_vllm, exporter):
        fake = await fake_vllm(k=3)
        fake.server.add(0, 5, 15, [5, 5, 5])
        exp = await exporter({"targets": [{"name": "z", "url": fake.url}]})
        await exp.start(id="wz")
        fake.server.add(0, 10, 30, [6, 2, 0])
        answer = await exp.stop("wz")
        rates = answer["results"]["z"]["data"]["per_position_acceptance_rates"]
        assert rates == {"0": 0.6, "1": 0.2, "2": 0.0}

    async def test_restart_in_the_middle_counts_both_sides(self, fake_vllm, exporter):
        fake = await fake_vllm(k=2)
        fake.server.add(0, 1000, 2000, [900, 800])
        exp = await exporter({"targets": [{"name": "r", "url": fake.url}]})
        await exp.start(id="wr")
        fake.server.add(0, 10, 20, [8, 6])
        await exp.round()
        fake.server.restart()
        fake.server.add(0, 5, 10, [5, 1])
        await exp.round()
        fake.server.add(0, 5, 10, [3, 1])
        answer = await exp.stop("wr")
        result = answer["results"]["r"]
        assert result["data"]["num_drafts"] == 20
        assert result["data"]["draft_tokens"] == 40
        assert result["data"]["accepted_tokens"] == 8 + 6 + 5 + 1 + 3 + 1
        assert result["data"]["per_position_acceptance_rates"] == {"0": 0.8, "1": 0.4}
        assert result["resets"] == 1
        assert "restart" in result["reset_note"]

    async def test_restart_between_scrapes_seen_by_created(self, fake_vllm, exporter):
        # The counter climbs past its old value after the restart: only _created tells.
        fake = await fake_vllm(k=1)
        fake.server.add(0, 10, 10, [5])
        exp = await exporter({"targets": [{"name": "c", "url": fake.url}]})
        await exp.start(id="wc")
        fake.server.restart()
        fake.server.add(0, 30, 30, [20])
        answer = await exp.stop("wc")
        result = answer["results"]["c"]
        assert result["data"]["num_drafts"] == 30 and result["data"]["accepted_tokens"] == 20
        assert result["resets"] == 1

    async def test_server_down_at_start(self, fake_vllm, exporter, unused_tcp_port):
        fake = await fake_vllm(k=2)
        exp = await exporter({"targets": [
            {"name": "up", "url": fake.url},
            {"name": "down", "url": f"http://127.0.0.1:{unused_tcp_port}/metrics"},
        ]})
        await exp.start(id="wd")
        fake.server.add(0, 10, 20, [10, 5])
        answer = await exp.stop("wd")
        down = answer["results"]["down"]
        assert down["status"] == "na"
        url = f"http://127.0.0.1:{unused_tcp_port}/metrics"
        assert down["error"].startswith(f"Failed to fetch metrics from {url} at window start")
        assert "at window stop" in down["error"]
        assert answer["results"]["up"]["status"] == "ok"
        assert answer["aggregate"]["data"]["num_drafts"] == 10
        assert answer["aggregate"]["targets"] == ["up"]

    async def test_server_down_at_stop_is_partial(self, fake_vllm, exporter):
        fake = await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "p", "url": fake.url}]})
        await exp.start(id="wp")
        fake.server.add(0, 10, 20, [10, 5])
        await exp.round()
        await fake.stop()
        answer = await exp.stop("wp")
        result = answer["results"]["p"]
        assert result["status"] == "ok"
        assert result["data"]["num_drafts"] == 10
        assert result["coverage"] == "partial"
        assert "at window stop" in result["coverage_note"]

    async def test_server_down_at_stop_without_activity_says_stop(self, fake_vllm, exporter):
        fake = await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "p", "url": fake.url}]})
        await exp.start(id="wq")
        await fake.stop()
        answer = await exp.stop("wq")
        result = answer["results"]["p"]
        assert result["status"] == "na"
        assert "at window stop" in result["error"]
        assert "at window start" not in result["error"]

    async def test_server_without_spec_decode(self, fake_vllm, exporter):
        fake = await fake_vllm(spec_decode=False)
        exp = await exporter({"targets": [{"name": "plain", "url": fake.url}]})
        await exp.start(id="wn")
        answer = await exp.stop("wn")
        assert answer["results"]["plain"]["status"] == "na"
        assert answer["results"]["plain"]["error"] == "No spec decode metrics found on server"

    async def test_no_traffic(self, fake_vllm, exporter):
        fake = await fake_vllm(k=2)
        fake.server.add(0, 10, 20, [10, 5])
        exp = await exporter({"targets": [{"name": "idle", "url": fake.url}]})
        await exp.start(id="wi")
        answer = await exp.stop("wi")
        result = answer["results"]["idle"]
        assert result["status"] == "na"
        assert result["error"] == "No spec decode activity detected during benchmark window"
        assert answer["aggregate"]["status"] == "na"

    async def test_aggregate_sums_then_divides(self, fake_vllm, exporter):
        a, b = await fake_vllm(k=2), await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "a", "url": a.url},
                                          {"name": "b", "url": b.url}]})
        await exp.start(id="wa")
        a.server.add(0, 100, 200, [100, 100])  # ratio 1.0 over 200 tokens
        b.server.add(0, 10, 20, [0, 0])  # ratio 0.0 over 20 tokens
        answer = await exp.stop("wa")
        aggregate = answer["aggregate"]["data"]
        assert aggregate["acceptance_rate"] == 200 / 220 * 100  # not the mean, 50.0
        assert aggregate["num_drafts"] == 110
        assert format_window(answer).count("Speculative Decoding Metrics") == 3
        assert "[all]" in format_window(answer)


class TestWindowFiles:
    async def test_files_written(self, fake_vllm, exporter, tmp_path):
        fake = await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        await exp.start(id="files")
        fake.server.add(0, 4, 8, [3, 1])
        answer = await exp.stop("files")
        host, port = fake.host_port.rsplit(":", 1)
        path = tmp_path / "out" / "files" / "performances" / f"spec_decode_{host}_{port}.json"
        assert json.loads(path.read_text()) == answer["results"]["a"]
        # The stop answer says where it was written; the file is the whole answer, that too.
        assert answer["results_dir"] == str((tmp_path / "out" / "files").resolve())
        assert json.loads((tmp_path / "out" / "files" / "window.json").read_text()) == answer


class TestWindowApi:
    async def test_start_same_id_is_idempotent(self, fake_vllm, exporter):
        fake = await fake_vllm()
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        first = await exp.client.post("/api/v1/windows", json={"id": "same"})
        second = await exp.client.post("/api/v1/windows", json={"id": "same"})
        assert first.status == 201 and second.status == 200
        assert await first.json() == await second.json()

    async def test_stop_twice_same_body(self, fake_vllm, exporter):
        fake = await fake_vllm()
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        await exp.start(id="twice")
        fake.server.add(0, 1, 3, [1, 1, 0])
        assert await exp.stop("twice") == await exp.stop("twice")

    @pytest.mark.parametrize(
        ("body", "status", "needle"),
        [
            (b"{not json", 400, "not valid JSON"),
            (b"[1, 2]", 400, "JSON object"),
            (b'{"targets": ["nope"]}', 400, 'unknown target "nope"'),
            (b'{"id": "../../etc"}', 400, "id must be"),
            (b'{"targets": "a"}', 400, "targets"),
            (b'{"colour": "red"}', 400, "unknown field"),
            (b'{"name": 5}', 400, "name"),
            (b'{"x": "' + b"a" * 70000 + b'"}', 413, ""),
        ],
    )
    async def test_bad_start_requests(self, fake_vllm, exporter, body, status, needle):
        fake = await fake_vllm()
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        response = await exp.client.post("/api/v1/windows", data=body,
                                         headers={"Content-Type": "application/json"})
        assert response.status == status
        assert needle in (await response.json())["error"]
        listing = await (await exp.client.get("/api/v1/windows")).json()
        assert listing["windows"] == []

    async def test_unknown_window(self, exporter):
        exp = await exporter({"targets": []})
        response = await exp.client.post("/api/v1/windows/nope/stop")
        assert response.status == 404
        assert (await response.json())["error"] == 'unknown window "nope"'
        assert (await exp.client.get("/api/v1/windows/nope")).status == 404

    async def test_target_by_host_port(self, fake_vllm, exporter):
        fake = await fake_vllm()
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        started = await exp.start(targets=[fake.host_port])
        assert started["targets"] == ["a"]

    async def test_token_required_for_posts(self, fake_vllm, exporter, monkeypatch):
        monkeypatch.setenv("SPECDEC_TEST_TOKEN", "s3cret")
        fake = await fake_vllm()
        exp = await exporter({"auth": {"token_env": "SPECDEC_TEST_TOKEN"},
                              "targets": [{"name": "a", "url": fake.url}]})
        missing = await exp.client.post("/api/v1/windows", json={"id": "t"})
        wrong = await exp.client.post("/api/v1/windows", json={"id": "t"},
                                      headers={"Authorization": "Bearer nope"})
        assert missing.status == 401 and wrong.status == 401
        assert (await exp.client.get("/api/v1/windows/t")).status == 404  # nothing changed
        assert (await exp.client.get("/api/v1/windows")).status == 200  # GETs stay open
        ok = await exp.client.post("/api/v1/windows", json={"id": "t"},
                                   headers={"Authorization": "Bearer s3cret"})
        assert ok.status == 201

    async def test_open_window_cap(self, fake_vllm, exporter):
        fake = await fake_vllm()
        exp = await exporter({"max_open_windows": 2, "targets": [{"name": "a", "url": fake.url}]})
        await exp.start(id="c1")
        await exp.start(id="c2")
        response = await exp.client.post("/api/v1/windows", json={"id": "c3"})
        assert response.status == 429

    async def test_the_cap_holds_under_50_concurrent_starts(self, fake_vllm, exporter):
        import asyncio

        fake = await fake_vllm()
        exp = await exporter({"max_open_windows": 5, "targets": [{"name": "a", "url": fake.url}]})
        starts = await asyncio.gather(
            *(exp.client.post("/api/v1/windows", json={"id": f"cap{i}"}) for i in range(50)))
        assert sorted(r.status for r in starts) == [201] * 5 + [429] * 45
        listed = await (await exp.client.get("/api/v1/windows?state=open")).json()
        assert len(listed["windows"]) == 5

    async def test_concurrent_starts_and_stops_make_one_window(self, fake_vllm, exporter):
        import asyncio

        fake = await fake_vllm()
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        starts = await asyncio.gather(
            *(exp.client.post("/api/v1/windows", json={"id": "race"}) for _ in range(50))
        )
        assert sorted(r.status for r in starts) == [200] * 49 + [201]
        fake.server.add(0, 2, 6, [2, 1, 0])
        stops = await asyncio.gather(
            *(exp.client.post("/api/v1/windows/race/stop") for _ in range(50))
        )
        bodies = [await r.json() for r in stops]
        assert all(r.status == 200 for r in stops)
        assert all(b == bodies[0] for b in bodies)
        assert bodies[0]["results"]["a"]["data"]["num_drafts"] == 2


class TestDelete:
    async def test_forgets_a_stopped_window_and_keeps_its_files(self, exporter, target, tmp_path):
        exp = await exporter({"targets": [{"name": "a", "url": target.url}]})
        await _stopped(exp, target, "old")
        answer = await _stopped(exp, target, "new")
        response = await exp.client.delete("/api/v1/windows/new")
        assert response.status == 200
        assert await response.json() == {"id": "new", "deleted": True}
        assert (await exp.client.get("/api/v1/windows/new")).status == 404
        listed = await (await exp.client.get("/api/v1/windows")).json()
        assert [w["id"] for w in listed["windows"]] == ["old"]
        assert (tmp_path / "out" / "new" / "window.json").exists()  # files are the user's
        # The last-window gauges fall back to the window before it.
        found = samples(await (await exp.client.get("/metrics")).text())
        assert value(found, "specdec_last_window_info", id="old") is not None
        assert value(found, "specdec_last_window_info", id="new") is None
        assert answer["id"] == "new"
        # Gone after a restart too.
        again = await exporter({"targets": [{"name": "a", "url": target.url}]})
        assert (await again.client.get("/api/v1/windows/new")).status == 404
        assert (await again.client.get("/api/v1/windows/old")).status == 200

    async def test_open_is_409_unknown_is_404_bad_id_is_400(self, exporter, target):
        exp = await exporter({"targets": [{"name": "a", "url": target.url}]})
        await exp.start(id="open")
        response = await exp.client.delete("/api/v1/windows/open")
        assert response.status == 409
        assert "stop it first" in (await response.json())["error"]
        assert (await exp.client.get("/api/v1/windows/open")).status == 200
        response = await exp.client.delete("/api/v1/windows/nope")
        assert response.status == 404
        assert (await response.json())["error"] == 'unknown window "nope"'
        assert (await exp.client.delete("/api/v1/windows/..")).status in (400, 404)

    async def test_needs_the_token_like_a_post(self, exporter, target, monkeypatch):
        monkeypatch.setenv("SPECDEC_TOKEN", "s3cret")
        exp = await exporter({"targets": [{"name": "a", "url": target.url}]})
        auth = {"Authorization": "Bearer s3cret"}
        assert (await exp.client.post("/api/v1/windows", json={"id": "w"},
                                      headers=auth)).status == 201
        assert (await exp.client.post("/api/v1/windows/w/stop", headers=auth)).status == 200
        assert (await exp.client.delete("/api/v1/windows/w")).status == 401
        assert (await exp.client.delete(
            "/api/v1/windows/w", headers={"Authorization": "Bearer wrong"})).status == 401
        assert (await exp.client.get("/api/v1/windows/w")).status == 200
        assert (await exp.client.delete("/api/v1/windows/w", headers=auth)).status == 200


class TestRetention:
    async def test_stopped_windows_past_retention_leave_the_state(
        self, exporter, target, tmp_path
    ):
        clock = Clock(1_000_000.0)
        config = {"targets": [{"name": "a", "url": target.url}], "window_retention": "2d"}
        exp = await exporter(config, clock=clock)
        await _stopped(exp, target, "ancient")
        clock.now += 1.5 * DAY
        await _stopped(exp, target, "recent")
        await exp.start(id="open-long")  # open windows never expire
        clock.now += 1 * DAY  # "ancient" started 2.5 days ago, "recent" 1 day ago
        await exp.round()
        assert (await exp.client.get("/api/v1/windows/ancient")).status == 404
        assert (await exp.client.get("/api/v1/windows/recent")).status == 200
        assert (await exp.client.get("/api/v1/windows/open-long")).status == 200
        assert (tmp_path / "out" / "ancient" / "window.json").exists()
        clock.now += 10 * DAY
        await exp.round()
        assert (await exp.client.get("/api/v1/windows/recent")).status == 404
        assert (await exp.client.get("/api/v1/windows/open-long")).status == 200
        again = await exporter(config, clock=clock)
        assert (await again.client.get("/api/v1/windows/recent")).status == 404

    async def test_default_is_thirty_days(self, exporter, target):
        clock = Clock(1_000_000.0)
        exp = await exporter({"targets": [{"name": "a", "url": target.url}]}, clock=clock)
        await _stopped(exp, target, "w")
        clock.now += 29 * DAY
        await exp.round()
        assert (await exp.client.get("/api/v1/windows/w")).status == 200
        clock.now += 2 * DAY
        await exp.round()
        assert (await exp.client.get("/api/v1/windows/w")).status == 404


class TestStoppedWindowsInMemory:
    async def test_a_stopped_window_keeps_only_its_answer(self, exporter, target):
        exp = await exporter({"targets": [{"name": "a", "url": target.url}]})
        answer = await _stopped(exp, target, "w")
        window = exp.service.book.get("w")
        assert window.answer == answer
        assert window.accumulators == {} and window.series == {}
        # The per-scrape series is read back from the store when asked for.
        series = await (await exp.client.get("/api/v1/windows/w/series")).json()
        assert len(series["targets"]["a"]) == 2  # the start and the stop scrape

    async def test_many_stops_leave_no_answer_in_memory(self, exporter, target):
        exp = await exporter({"targets": [{"name": "a", "url": target.url}]})
        stops = []
        for n in range(RECENT_WINDOWS + 5):
            await exp.start(id=f"w{n:02d}")
            target.counters.add(3, 6, [2, 1])
            response = await exp.client.post(f"/api/v1/windows/w{n:02d}/stop")
            stops.append(await response.read())
        book = exp.service.book
        assert _answers_held(book) == 0
        listed = [w.id for w in book.recent()]
        assert len(listed) == RECENT_WINDOWS and listed[0] == f"w{RECENT_WINDOWS + 4}"
        # The oldest, no longer even listed in memory, comes whole from the store: the same
        # bytes as its stop answered, and as a second stop answers.
        assert await (await exp.client.get("/api/v1/windows/w00")).read() == stops[0]
        assert await (await exp.client.post("/api/v1/windows/w00/stop")).read() == stops[0]
        assert await (await exp.client.get("/api/v1/windows/w30")).read() == stops[30]
        assert _answers_held(book) == 1  # the one read last, kept for a page's next request
        gauges = _last_window_samples(await (await exp.client.get("/metrics")).text())
        listing = await (await exp.client.get("/api/v1/windows")).read()
        # After a restart: the same answers, list and gauges, and still no answer held.
        again = await exporter({"targets": [{"name": "a", "url": target.url}]})
        assert await (await again.client.get("/api/v1/windows")).read() == listing
        assert _last_window_samples(await (await again.client.get("/metrics")).text()) == gauges
        assert _answers_held(again.service.book) == 0
        assert await (await again.client.get("/api/v1/windows/w00")).read() == stops[0]
        assert await (await again.client.get("/api/v1/windows/w54")).read() == stops[54]
        assert (await again.client.get("/windows/w54")).status == 200
        assert (await again.client.get("/compare?a=w00&b=w54")).status == 200
        assert _answers_held(again.service.book) == 1


def _answers_held(book) -> int:
    """Stop answers (dicts with `results`) reachable from the book, its store aside."""
    seen, found, todo = {id(book.store)}, 0, [book]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type | types.ModuleType | types.FunctionType
                                         | types.MethodType | str | bytes):
            continue
        seen.add(id(obj))
        found += isinstance(obj, dict) and "results" in obj and "stopped_at" in obj
        todo.extend(gc.get_referents(obj))
    return found


def _last_window_samples(text: str) -> dict:
    return {k: v for k, v in samples(text).items() if "last_window" in k[0]}


class TestStoppedWindowsInTheStore:
    async def test_unreadable_stopped_rows_are_left_out_of_lists_loudly(
        self, exporter, target, caplog
    ):
        config = {"targets": [{"name": "a", "url": target.url}]}
        exp = await exporter(config)
        for window_id in ("good", "nan"):
            await _stopped(exp, target, window_id)
        nan = await (await exp.client.get("/api/v1/windows/nan")).read()
        # A second writer on the state file (as an operator's sqlite3 would be).
        db = sqlite3.connect(exp.service.book.store.path, isolation_level=None)
        # JSON to Python, not to SQLite: listed and read the slow way, not lost.
        (raw,) = db.execute("SELECT doc FROM windows WHERE id='nan'").fetchone()
        db.execute("UPDATE windows SET doc=? WHERE id='nan'",
                   (json.dumps(json.loads(raw) | {"downtimes": [[float("nan"), 1.0]]}),))
        db.execute("INSERT INTO windows VALUES ('bad-json', 0, 5e9, 'not json {')")
        db.execute("INSERT INTO windows VALUES ('bad-shape', 0, 5e9, '{\"id\": \"bad-shape\"}')")
        db.execute("INSERT INTO windows VALUES ('bad-fields', 0, 5e9, ?)",
                   (json.dumps(json.loads(raw) | {"id": "bad-fields", "stopped_at": "soon"}),))
        db.close()
        with caplog.at_level(logging.ERROR):
            again = await exporter(config)
            listed = await (await again.client.get("/api/v1/windows")).json()
        assert [w["id"] for w in listed["windows"]] == ["nan", "good"]
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert all(bad in messages for bad in ("bad-json", "bad-shape", "bad-fields"))
        assert await (await again.client.get("/api/v1/windows/nan")).read() == nan
        assert (await again.client.get("/windows/nan")).status == 200

    async def test_a_lost_database_gets_stopped_windows_back_from_their_files(
        self, exporter, target, tmp_path, caplog
    ):
        exp = await exporter({"targets": [{"name": "a", "url": target.url}]})
        await _stopped(exp, target, "lost")
        await exp.start(id="kept")
        target.counters.add(3, 6, [2, 1])
        kept = await (await exp.client.post("/api/v1/windows/kept/stop")).read()
        (tmp_path / "out" / "lost" / "window.json").unlink()
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / "out" / f"state.sqlite{suffix}").unlink(missing_ok=True)
        with caplog.at_level(logging.ERROR):
            await exp.round()  # finds the database gone and writes back what it can
        assert await (await exp.client.get("/api/v1/windows/kept")).read() == kept
        assert (await exp.client.get("/api/v1/windows/lost")).status == 404
        assert any("not written back id=lost" in r.getMessage() for r in caplog.records)


class TestScrapesDuringAStop:
    """A stop's scrapes come in one by one while the loop scrapes on: each target's count
    ends at its stop scrape, whatever is scraped of it after."""

    @staticmethod
    async def gated_target(aiohttp_server, page: bytes):
        """A /metrics server that answers only once its gate is open."""
        from aiohttp import web

        gate = asyncio.Event()
        gate.set()

        async def metrics(request):
            await gate.wait()
            return web.Response(body=page, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        server = await aiohttp_server(app)
        return gate, f"http://127.0.0.1:{server.port}/metrics"

    @staticmethod
    async def last_scrape_at(exp, name: str) -> float:
        targets = (await (await exp.client.get("/api/v1/targets")).json())["targets"]
        return next(t["last_scrape_at"] for t in targets if t["name"] == name)

    async def stop_halfway(self, fake_vllm, exporter, aiohttp_server, stop):
        """Window "w" over "fast" (3 drafts in it) and "slow", whose stop scrape waits at its
        gate: `stop(exp)` started as a task, returned once the stop's scrape of "fast" is in.
        (fake server, exporter, gate, the stop's task)."""
        fast = await fake_vllm(k=2)
        fast.server.add(0, 10, 20, [9, 8])
        gate, slow_url = await self.gated_target(
            aiohttp_server, b"# TYPE x counter\nx_total 1\n")
        exp = await exporter({"targets": [{"name": "fast", "url": fast.url},
                                          {"name": "slow", "url": slow_url}]})
        await exp.start(id="w")
        fast.server.add(0, 3, 6, [2, 1])
        before = await self.last_scrape_at(exp, "fast")
        gate.clear()  # the stop's scrape of "slow" waits: the stop stays under way
        task = asyncio.create_task(stop(exp))
        for _ in range(500):
            if await self.last_scrape_at(exp, "fast") != before:
                break  # the stop's scrape of "fast" is in
            await asyncio.sleep(0.01)
        assert await self.last_scrape_at(exp, "fast") != before and not task.done()
        return fast, exp, gate, task

    async def test_a_scrape_after_a_targets_stop_scrape_is_not_the_windows(
            self, fake_vllm, exporter, aiohttp_server):
        fast, exp, gate, stop = await self.stop_halfway(
            fake_vllm, exporter, aiohttp_server,
            lambda exp: exp.client.post("/api/v1/windows/w/stop"))
        # Traffic after the stop's scrape, and a scrape of it by the loop, before the stop ends.
        fast.server.add(0, 100, 200, [90, 80])
        await exp.service.scrape_target("fast")
        gate.set()
        response = await stop
        assert response.status == 200, await response.text()
        result = (await response.json())["results"]["fast"]
        # Fed after the stop's, the loop's newer count then the stop's older one looked like a
        # server restart: resets 1 and the increase counted twice.
        assert result["resets"] == 0
        assert result["increase"]["num_drafts"] == 3
        assert result["raw"]["after"]["num_drafts"] == 13

    @pytest.mark.parametrize(("child", "streamed"), [("1", "1"), ("1", "0"), ("0", "1")])
    async def test_the_stop_scrapes_count_with_or_without_a_child(
            self, fake_vllm, exporter, monkeypatch, child, streamed):
        # A child fed the scrapes as they come takes them in its window; one forked after
        # them, or a thread, has the server's window take them.
        monkeypatch.setenv("SPECDEC_STOP_IN_CHILD", child)
        monkeypatch.setenv("SPECDEC_STOP_STREAMED", streamed)
        fake = await fake_vllm(k=2)
        fake.server.add(0, 10, 20, [9, 8])
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        await exp.start(id="w")
        fake.server.add(0, 7, 14, [6, 5])  # only the stop's scrape sees this
        result = (await exp.stop("w"))["results"]["a"]
        assert result["increase"]["num_drafts"] == 7 and result["scrapes"] == 2
        assert result["increase"]["accepted_per_pos"] == {"0": 6, "1": 5}

    async def test_a_child_killed_midway_leaves_the_answer_to_a_thread_counts_exact(
            self, fake_vllm, exporter, aiohttp_server, monkeypatch):
        # The child took "fast"'s stop scrape alone (the server's window only held it): with
        # the child gone, the server's window takes it before a thread makes the answer.
        monkeypatch.setenv("SPECDEC_STOP_STREAMED", "1")
        earlier = set(children_of(os.getpid()))  # an earlier test's, still ending
        fast, exp, gate, stop = await self.stop_halfway(
            fake_vllm, exporter, aiohttp_server, lambda exp: exp.service.stop_window("w"))
        (child,) = set(children_of(os.getpid())) - earlier  # the stop's, working on "fast"
        os.kill(child, signal.SIGKILL)
        fast.server.add(0, 100, 200, [90, 80])  # after the stop's scrape: not the window's
        gate.set()
        window = await stop
        result = window.answer["results"]["fast"]
        assert result["increase"]["num_drafts"] == 3 and result["resets"] == 0
        assert result["scrapes"] == 2
        assert zombies_of(os.getpid()) == []

    async def test_a_stop_cancelled_midway_leaves_the_window_open_with_its_scrapes(
            self, fake_vllm, exporter, aiohttp_server):
        fast, exp, gate, stop = await self.stop_halfway(
            fake_vllm, exporter, aiohttp_server, lambda exp: exp.service.stop_window("w"))
        stop.cancel()  # the stop's child is working on "fast" meanwhile
        with pytest.raises(asyncio.CancelledError):
            await stop
        window = exp.service.book.get("w")
        assert window.is_open and not window.finals
        assert window.accumulators["fast"].scrapes == 2  # its start and the stop's scrape
        assert zombies_of(os.getpid()) == []
        gate.set()
        fast.server.add(0, 1, 2, [1, 0])
        result = (await exp.stop("w"))["results"]["fast"]
        assert result["increase"]["num_drafts"] == 4 and result["resets"] == 0


class TestStreamsStops:
    def test_said_by_the_environment_or_by_a_spare_core(self, monkeypatch):
        from exporter.server.isolate import spare_cores
        from exporter.server.stop import forks_early

        monkeypatch.setenv("SPECDEC_STOP_STREAMED", "0")
        assert forks_early() is False
        monkeypatch.setenv("SPECDEC_STOP_STREAMED", "1")
        assert forks_early() is True
        monkeypatch.delenv("SPECDEC_STOP_STREAMED")
        assert forks_early() is (spare_cores() >= 1)


class TestStopWorkFails:
    @pytest.mark.parametrize("streamed", ["0", "1"])
    async def test_an_error_of_the_answers_work_leaves_the_window_open(
            self, fake_vllm, exporter, monkeypatch, streamed):
        from exporter.server import stop as stopchild

        monkeypatch.setenv("SPECDEC_STOP_STREAMED", streamed)
        fake = await fake_vllm(k=2)
        fake.server.add(0, 10, 20, [9, 8])
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        await exp.start(id="w")
        fake.server.add(0, 3, 6, [2, 1])
        real = stopchild.kept_of

        def broken(*args, **kwargs):
            raise ValueError("a bug in the answer's work")

        monkeypatch.setattr(stopchild, "kept_of", broken)  # the child inherits it
        response = await exp.client.post("/api/v1/windows/w/stop")
        assert response.status == 500
        state = await (await exp.client.get("/api/v1/windows/w")).json()
        assert state["status"] == "open" and state["scrapes"] == {"a": 2}
        # Nothing was saved stopped: the state database holds it open.
        saved = StateStore(exp.service.config.state_path)
        try:
            assert [doc["id"] for doc in saved.load_open()] == ["w"]
        finally:
            saved.close()
        monkeypatch.setattr(stopchild, "kept_of", real)
        fake.server.add(0, 1, 2, [1, 0])
        result = (await exp.stop("w"))["results"]["a"]
        assert result["increase"]["num_drafts"] == 4 and result["scrapes"] == 3


class TestConcurrentStops:
    async def test_two_windows_stopped_at_once_each_answer_exact(self, fake_vllm, exporter):
        fake = await fake_vllm(k=2)
        fake.server.add(0, 10, 20, [9, 8])
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        await exp.start(id="first")
        fake.server.add(0, 5, 10, [4, 3])
        await exp.start(id="second")
        fake.server.add(0, 2, 4, [2, 1])
        answers = await asyncio.gather(exp.stop("first"), exp.stop("second"))
        drafts = [a["results"]["a"]["increase"]["num_drafts"] for a in answers]
        assert drafts == [7, 2]
        assert all(a["results"]["a"]["resets"] == 0 for a in answers)


async def _clients(base: str, clients: int, requests: int) -> None:
    """`clients` streaming clients on loopback, each sending `requests` one after another."""
    async with aiohttp.ClientSession() as session:
        async def one() -> None:
            for _ in range(requests):
                async with session.post(f"{base}/v1/completions", json={
                        "prompt": "x", "max_tokens": 120, "stream": True}) as response:
                    assert response.status == 200
                    await response.read()

        await asyncio.gather(*(one() for _ in range(clients)))


def _band_sums(by_load: dict) -> dict:
    """The bands' increases summed, as the RESULT's `increase` spells counters."""
    total: dict = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                   "accepted_per_pos": {}}
    for band in by_load.values():
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            total[key] += band["increase"][key]
        for pos, v in band["increase"]["accepted_per_pos"].items():
            total["accepted_per_pos"][pos] = total["accepted_per_pos"].get(pos, 0) + v
    return total


class TestWindowByLoad:
    """A window's increase by the server's running-requests band, from its counters."""

    async def test_two_load_levels_partition_the_window_exactly(self, fake_vllm, exporter):
        fake = await fake_vllm(k=3, engines=2, step_seconds=0.002, seed=7)
        other = await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "a", "url": fake.url},
                                          {"name": "b", "url": other.url}]})
        await exp.start(id="w")
        base = str(fake.http.make_url("/"))[:-1]
        for clients in (1, 6):
            load = asyncio.create_task(_clients(base, clients, 4))
            while not load.done():
                await exp.round()
                await asyncio.sleep(0.03)
            await load
            await exp.round()
        other.server.background = 40
        other.server.add(0, 10, 20, [7, 3])
        answer = await exp.stop("w")
        result, aggregate = answer["results"]["a"], answer["aggregate"]
        assert result["status"] == "ok"
        by_load = result["by_load"]
        # Every interval in one band: their sums are the window's increase, exactly.
        assert _band_sums(by_load) == result["increase"]
        assert sum(b["intervals"] for b in by_load.values()) == result["scrapes"] - 1
        # One client decodes alone; six keep four to seven running between them.
        assert by_load["1"]["num_drafts"] > 0 and by_load["4-7"]["num_drafts"] > 0
        assert "unknown" not in by_load
        for band in by_load.values():
            if band["num_drafts"]:
                assert band["acceptance_length"] == 1 + (
                    band["accepted_tokens"] / band["num_drafts"])
        # The other target: idle (its intervals in band 0, no figures), then one interval from
        # 0 running to 40 with all its drafts.
        idle, busy = answer["results"]["b"]["by_load"].values()
        assert list(answer["results"]["b"]["by_load"]) == ["0", "16-31"]
        assert idle["num_drafts"] == 0 and idle["acceptance_length"] is None
        assert busy["intervals"] == 1 and busy["num_drafts"] == 10
        # (The aggregate's k=3 and k=2 targets leave position 2 with fewer drafts: its
        # `num_drafts_per_pos` is no sum of counters.)
        assert _band_sums(aggregate["by_load"]) == {
            k: v for k, v in aggregate["increase"].items() if k != "num_drafts_per_pos"}
        assert aggregate["by_load"]["16-31"]["num_drafts"] == 10
