"""exporter/server/scheduler.py: the scrape loop's rhythm and what it does around its rounds."""

from __future__ import annotations

import asyncio
import gc

from conftest import Clock


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
        loop = asyncio.create_task(exp.service.run())
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
