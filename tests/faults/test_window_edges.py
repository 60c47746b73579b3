"""Windows whose first usable page lacks the counters (found by the soak): never counted from
zero when the counters were already counting, but partial, from when they first showed."""

from __future__ import annotations

from exporter.core.window import UNSEEN_AT_BASELINE
from faults.servers import Counters, RawTarget

CONFIG = {"scrape_interval": "5s", "scrape_timeout": "4s"}


def counts(result: dict) -> list[int]:
    got = result["increase"]
    return [got["num_drafts"], got["num_draft_tokens"], got["num_accepted_tokens"]]


async def run_window(exporter, start_mode: str) -> dict:
    """50 drafts before the window; its start page per `start_mode`, then a page without
    spec-decode series, 5 drafts, the series back, 7 drafts, the stop."""
    target = await RawTarget(Counters(k=3)).start()
    target.counters.add(50, 150, [30, 20, 10])
    exp = await exporter(CONFIG | {"targets": [{"name": "t", "url": target.url}]})
    await exp.round()
    target.mode = start_mode
    await exp.start(id="w")
    target.mode = "vanish"
    await exp.round()
    target.mode = "ok"
    target.counters.add(5, 15, [3, 2, 1])
    await exp.round()
    target.counters.add(7, 21, [3, 2, 1])
    answer = await exp.stop("w")
    await target.stop()
    return answer["results"]["t"]


async def test_failed_start_then_page_without_series_counts_from_their_return(exporter):
    result = await run_window(exporter, "http500")
    assert result["status"] == "ok", result
    assert counts(result) == [7, 21, 6], result  # not [62, 186, 72]: the 50 before it
    assert result["coverage"] == "partial"
    assert "at window start: HTTP 500" in result["coverage_note"]
    assert UNSEEN_AT_BASELINE in result["coverage_note"]


async def test_start_page_without_series_counts_from_their_return(exporter):
    result = await run_window(exporter, "vanish")
    assert result["status"] == "ok", result
    assert counts(result) == [7, 21, 6], result
    assert result["coverage"] == "partial"
    assert UNSEEN_AT_BASELINE in result["coverage_note"]


async def test_series_created_inside_the_window_count_from_zero(exporter):
    target = await RawTarget(Counters(k=3)).start()
    exp = await exporter(CONFIG | {"targets": [{"name": "t", "url": target.url}]})
    target.mode = "vanish"  # the server has no spec-decode series yet
    await exp.start(id="w")
    target.mode = "ok"
    target.counters.restart()  # its counters begin now, inside the window
    target.counters.add(4, 12, [2, 1, 0])
    await exp.round()
    target.counters.add(3, 9, [1, 1, 1])
    result = (await exp.stop("w"))["results"]["t"]
    await target.stop()
    assert counts(result) == [7, 21, 6], result
    assert result["coverage"] == "full", result
