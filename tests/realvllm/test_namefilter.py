"""The filtered scrape against a real vLLM: proven on /metrics/, the same series as /metrics."""

from __future__ import annotations

import asyncio

from exporter.config.model import validate_config
from exporter.core.parse import parse_page
from exporter.core.snapshot import FILTERED, FULL
from exporter.scrape.scraper import Scraper, make_session
from realvllm.conftest import ask, exporter_over, get, read_counters


async def _two_scrapes(url: str):
    target = validate_config({"targets": [{"name": "real", "url": url}]}).targets[0]
    session = make_session(2)
    scraper = Scraper(session, max_bytes=16 * 1024 * 1024, concurrency=2)
    try:
        return [await scraper.scrape(target, 10) for _ in range(2)]
    finally:
        await scraper.close()
        await session.close()


class TestFilteredScrape:
    def test_filter_honoured_and_the_series_are_the_full_pages(self, fleet):
        server = fleet.ngram
        ask(server.base_url, chat=False, stream=False)
        first, second = asyncio.run(_two_scrapes(server.metrics_url))
        full = parse_page(get(server.metrics_url))  # no request in between: nothing moved
        assert first.snapshot is not None and first.snapshot.read == FULL
        assert second.snapshot is not None and second.snapshot.read == FILTERED, second.error
        assert second.size < first.size / 5
        assert second.snapshot.values == full.values and full.values
        assert second.snapshot.created == full.created

    def test_window_over_the_filtered_read_counts_the_full_pages_increase(self, fleet,
                                                                          tmp_path):
        server = fleet.ngram
        with exporter_over(server, tmp_path) as exporter:
            exporter.start("w")
            before = read_counters(get(server.metrics_url))
            ask(server.base_url, chat=True, stream=True, max_tokens=64)
            after = read_counters(get(server.metrics_url))
            answer = exporter.stop("w")
        result = answer["results"]["real"]
        increase = after.minus(before)
        assert result["status"] == "ok" and result["read"] == FILTERED
        assert increase.drafts > 0
        assert (result["data"]["num_drafts"], result["data"]["accepted_tokens"]) == (
            increase.drafts, increase.accepted)
