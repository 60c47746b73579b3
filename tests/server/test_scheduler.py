"""exporter/server/scheduler.py: the scrape loop's rhythm and what it does around its rounds."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from pathlib import Path

import pytest
from aiohttp import web
from conftest import Clock

from exporter.config.model import validate_config
from exporter.core.errors import ConfigError


class TestRun:
    async def test_what_exists_as_the_loop_starts_is_frozen_before_its_first_round(
        self, exporter, unused_tcp_port
    ):
        # A full collection walked everything made before the loop started, in its first
        # round: 85-180 ms pauses at 1000 targets (bench exposition, "scrape loop alone").
        exp = await exporter({"targets": [
            {"name": "down", "url": f"http://127.0.0.1:{unused_tcp_port}/metrics"}]})
        before = gc.get_freeze_count()
        made_before_the_loop = [[i] for i in range(1000)]  # noqa: F841 - lists are tracked
        loop = asyncio.create_task(exp.service.scheduler.run())
        try:
            await asyncio.sleep(0)  # the loop's first turn: its first round has just begun
            assert not exp.service.scheduler.ready
            assert gc.get_freeze_count() >= before + 1000
        finally:
            loop.cancel()
            try:
                await loop
            except asyncio.CancelledError:
                pass
            gc.unfreeze()  # the rest of the suite's garbage stays collectable


class TestRound:
    async def test_a_spread_round_scrapes_a_target_a_marker_just_scraped(
        self, fake_vllm, exporter
    ):
        # A rule that left such a target to its next round also left out targets whose last
        # round's scrape had come late: 0.81x of the expected scrapes in the fleet bench.
        clock = Clock()
        a, b = await fake_vllm(k=2), await fake_vllm(k=2)
        exp = await exporter({"scrape_interval": "10s", "targets": [
            {"name": "a", "url": a.url}, {"name": "b", "url": b.url}]}, clock=clock)
        await exp.round()
        clock.now += 6
        await exp.start(id="w", targets=["a"])  # a scraped now, b 6 s ago
        clock.now += 1
        await exp.service.scheduler.round(spread=0.001)
        targets = (await (await exp.client.get("/api/v1/targets")).json())["targets"]
        assert {t["name"]: t["last_scrape_at"] for t in targets} == {"a": clock.now,
                                                                      "b": clock.now}


PAGE = (Path(__file__).resolve().parents[1] / "testdata" / "pages"
        / "vllm-0.33.0-rendered-k3.txt").read_bytes()


async def counting_target(aiohttp_server) -> tuple[list[float], str]:
    """A /metrics server on loopback that notes when each scrape came: (times, url)."""
    times: list[float] = []

    async def metrics(request: web.Request) -> web.Response:
        if "name[]" not in request.query:  # a probe of the name filter is not a scrape
            times.append(time.monotonic())
        return web.Response(body=PAGE, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    return times, str(server.make_url("/metrics"))


class TestWindowRounds:
    async def test_targets_of_an_open_window_are_scraped_at_the_window_interval(
        self, aiohttp_server, exporter
    ):
        # A restart loses the window what the server counted since our last scrape: an open
        # window's targets are scraped every window_scrape_interval, the others each round.
        watched, watched_url = await counting_target(aiohttp_server)
        other, other_url = await counting_target(aiohttp_server)
        # name_filter off: its probes at first contact would count as scrapes here.
        exp = await exporter({"scrape_interval": "10s", "scrape_timeout": "1s",
                              "window_scrape_interval": "100ms", "targets": [
                                  {"name": "watched", "url": watched_url, "name_filter": False},
                                  {"name": "other", "url": other_url, "name_filter": False}]})
        await exp.round()
        loop = asyncio.create_task(exp.service.scheduler.window_rounds())
        try:
            await asyncio.sleep(0.6)  # no window open: nothing but the round
            assert len(watched) == 1 and len(other) == 1
            await exp.start(id="w", targets=["watched"])
            started = len(watched)
            await asyncio.sleep(1.0)
            in_window = len(watched) - started
            await exp.stop("w")
            stopped = len(watched)
            await asyncio.sleep(0.6)
            assert 5 <= in_window <= 12  # every 100 ms, give or take the loop's turns
            assert len(watched) == stopped  # closed: back to the 10 s rounds
            assert len(other) == 1  # never in a window: its rounds only
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop

    async def test_a_target_with_a_scrape_in_flight_is_not_due(self, aiohttp_server, exporter):
        times, url = await counting_target(aiohttp_server)
        exp = await exporter({"scrape_interval": "10s", "window_scrape_interval": "1s",
                              "targets": [{"name": "t", "url": url}]})
        await exp.round()
        await exp.start(id="w")
        scheduler = exp.service.scheduler
        assert scheduler.window_due(0.001) == ["t"]  # scraped long enough ago (1 ms)
        assert scheduler.window_due(3600.0) == []  # scraped within half of an hour
        scrape = asyncio.create_task(exp.service.scrape_target("t"))
        await asyncio.sleep(0)  # the scrape holds the target's turn
        assert scheduler.window_due(0.001) == []
        await scrape


class TestWindowScrapeInterval:
    def test_default_is_one_second_within_the_scrape_interval(self):
        assert validate_config({}).window_interval == 1.0
        assert validate_config({"scrape_interval": "500ms", "scrape_timeout": "200ms"}
                               ).window_interval == 0.5
        assert validate_config({"window_scrape_interval": "250ms"}).window_interval == 0.25

    def test_longer_than_the_scrape_interval_names_the_key_and_the_rule(self):
        with pytest.raises(ConfigError) as caught:
            validate_config({"scrape_interval": "5s", "window_scrape_interval": "10s"})
        assert caught.value.problems == [
            "window_scrape_interval: must not be longer than scrape_interval (10s > 5s)"]
