"""scheduler: the loop's rounds, spread over the interval, and what they leave out."""

from __future__ import annotations

from conftest import Clock


async def last_scrapes(exp) -> dict[str, float]:
    targets = (await (await exp.client.get("/api/v1/targets")).json())["targets"]
    return {t["name"]: t["last_scrape_at"] for t in targets}


class TestSpreadRounds:
    async def test_a_target_a_marker_just_scraped_waits_for_its_next_round(
            self, fake_vllm, exporter):
        clock = Clock()
        a, b = await fake_vllm(k=2), await fake_vllm(k=2)
        exp = await exporter({"scrape_interval": "10s", "targets": [
            {"name": "a", "url": a.url}, {"name": "b", "url": b.url}]}, clock=clock)
        await exp.round()
        clock.now += 6
        await exp.start(id="w", targets=["a"])  # a scraped now, b 6 s ago
        scheduler = exp.service.scheduler
        clock.now += 4  # a's scrape is 4 s old: less than half the interval
        await scheduler.round(spread=0.001)
        assert await last_scrapes(exp) == {"a": clock.now - 4, "b": clock.now}
        clock.now += 1  # a's is 5 s old: half the interval; b's 1 s, left out in turn
        await scheduler.round(spread=0.001)
        assert await last_scrapes(exp) == {"a": clock.now, "b": clock.now - 1}

    async def test_a_failed_scrape_is_tried_again_at_once(self, fake_vllm, exporter):
        clock = Clock()
        a = await fake_vllm(k=2)
        exp = await exporter({"scrape_interval": "10s", "targets": [
            {"name": "a", "url": a.url}]}, clock=clock)
        await a.stop()
        await exp.round()
        clock.now += 1
        await exp.service.scheduler.round(spread=0.001)
        assert await last_scrapes(exp) == {"a": clock.now}

    async def test_rounds_without_spread_scrape_every_target(self, fake_vllm, exporter):
        # What tests and the bench drive: each round scrapes, however recent the last.
        clock = Clock()
        a = await fake_vllm(k=2)
        exp = await exporter({"scrape_interval": "10s", "targets": [
            {"name": "a", "url": a.url}]}, clock=clock)
        await exp.round()
        clock.now += 1
        await exp.round()
        assert await last_scrapes(exp) == {"a": clock.now}
