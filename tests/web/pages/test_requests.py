"""The window page's per-request section: its chart from a block, and through a real proxy."""

from __future__ import annotations

import re
from typing import Any

import aiohttp

from exporter.fakevllm import FakeServer, make_fake_app
from exporter.web.pages.requests import LEFT, WIDTH, per_request_section


def _block(**summary: float) -> dict[str, Any]:
    return {"requests": 5, "with_stats": 5, "reason": None, "acceptance_length": summary}


SPREAD = {"min": 1.0, "p5": 1.5, "p50": 2.0, "p95": 3.0, "max": 3.0, "mean": 2.25}


class TestSection:
    def test_one_box_per_target_and_the_aggregate_on_one_axis(self) -> None:
        html = per_request_section({"per_request": {
            "targets": {"a": _block(**SPREAD), "b": _block(**SPREAD | {"max": 4.0})},
            "aggregate": _block(**SPREAD | {"max": 4.0})}}, {})
        assert html.count("<rect") == 3 and html.count("<circle") == 3
        # The axis runs from 1 to the largest max (4): b's median 2.0 sits a third along.
        medians = re.findall(r'<line x1="([\d.]+)" x2="\1" y1', html)
        assert float(medians[1]) == round(LEFT + WIDTH / 3, 1)
        assert ">all</td>" in html and ">2.25</td>" in html

    def test_without_figures_it_says_why_and_draws_nothing(self) -> None:
        reason = "start vLLM with --per-request-spec-decode-metrics summary"
        html = per_request_section({"per_request": {"targets": {"a": {
            "requests": 3, "with_stats": 0, "reason": reason, "acceptance_length": None}},
            "aggregate": {}}}, {})
        assert "<svg" not in html and reason in html

    def test_odd_blocks_from_a_peer_are_skipped_and_no_block_no_section(self) -> None:
        assert per_request_section({}, {}) == ""
        html = per_request_section({"per_request": {"targets": {
            "a": "junk", "b": _block(**SPREAD | {"p50": "many"})}}}, {})
        assert "<svg" not in html and ">b</td>" in html


class TestThroughTheProxy:
    async def test_the_window_page_shows_the_proxied_requests(self, proxied: Any) -> None:
        fake = FakeServer(k=3, acceptance=0.7, per_request_metrics="summary")
        under, port = await proxied(make_fake_app(fake))
        await under.start(id="w1")
        async with aiohttp.ClientSession() as session:
            for max_tokens in (10, 50, 90):
                async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                        json={"model": "m", "prompt": "p",
                                              "max_tokens": max_tokens}) as answer:
                    await answer.read()
        for stop in (False, True):
            if stop:
                await under.stop("w1")
            html = await (await under.client.get("/windows/w1")).text()
            assert "Acceptance across requests" in html
            assert re.search(r"<td>v</td><td>3</td><td>3</td>", html)
            assert html.count('aria-label="acceptance length across requests"') == 1
