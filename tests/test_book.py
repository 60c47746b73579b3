"""The window book through the HTTP API: retention of stopped windows and DELETE (issue 13, 4),
and what memory keeps of a stopped window."""

from __future__ import annotations

import pytest
from conftest import Clock
from faults.checks import samples, value
from faults.servers import Counters, RawTarget

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
        window = exp.service.get_window("w")
        assert window.answer == {k: v for k, v in answer.items() if k != "results_dir"}
        assert window.accumulators == {} and window.series == {}
        # The per-scrape series is read back from the store when asked for.
        series = await (await exp.client.get("/api/v1/windows/w/series")).json()
        assert len(series["targets"]["a"]) == 2  # the start and the stop scrape
