"""The OpenMetrics 1.0 page vLLM's Rust frontend serves, scraped by a real exporter.

OpenMetrics names a counter's family without `_total` in `# TYPE` while its samples carry it,
ends with `# EOF`, and this page has no `_created` samples: a restart shows only as counters
going down.
"""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web

from exporter.core.parse import parse_page

PAGE = (Path(__file__).parents[1] / "testdata" / "pages"
        / "vllm-rust-frontend-openmetrics-k3.txt").read_bytes()
CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def _grown(page: bytes, by: int) -> bytes:
    """The page with every spec-decode sample `by` times its value (counters that grew)."""
    def scale(match: re.Match[bytes]) -> bytes:
        return match.group(1) + str(int(match.group(2)) * by).encode()
    return re.sub(rb"^(vllm:spec_decode_\S+ )(\d+)$", scale, page, flags=re.M)


class TestRustFrontendPage:
    def test_the_fixture_is_openmetrics_as_the_rust_encoder_writes_it(self):
        lines = PAGE.decode().splitlines()
        assert lines[-1] == "# EOF"
        assert "# TYPE vllm:spec_decode_num_drafts counter" in lines
        assert not any("_created" in line for line in lines)

    def test_counters_summed_over_engines(self):
        snapshot = parse_page(PAGE)
        totals = {}
        for key, value in snapshot.values.items():
            name = (key.field.value, key.position)
            totals[name] = totals.get(name, 0) + value
        assert totals[("num_drafts", -1)] == 100
        assert totals[("num_draft_tokens", -1)] == 270
        assert totals[("num_accepted_tokens", -1)] == 162
        assert [totals[("accepted_per_pos", p)] for p in range(3)] == [74, 51, 37]
        assert snapshot.created == {}

    async def test_a_window_over_the_served_page_counts_its_increase(
            self, aiohttp_server, exporter):
        served = {"page": PAGE}

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=served["page"], headers={"Content-Type": CONTENT_TYPE})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        server = await aiohttp_server(app)
        under = await exporter({"targets": [{"name": "rust",
                                             "url": str(server.make_url("/metrics"))}]})
        await under.round()
        await under.start(id="w")
        served["page"] = _grown(PAGE, 3)
        await under.round()
        answer = await under.stop("w")
        result = answer["results"]["rust"]
        assert result["status"] == "ok"
        data = result["data"]
        assert (data["num_drafts"], data["draft_tokens"], data["accepted_tokens"]) == (
            200, 540, 324)
        assert data["per_position_acceptance_rates"] == {"0": 148 / 200, "1": 102 / 200,
                                                         "2": 74 / 200}
