"""Segments through the real proxy port: a tag header, the body's temperature and the requests
in flight key each request; the window's segments sum to its totals and those to the counters."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from browser import Browser
from conftest import free_port

from exporter.config.model import validate_config
from exporter.core.errors import ConfigError
from exporter.core.segments import DIMENSIONS
from exporter.fakevllm import FakeServer, make_fake_app
from exporter.web.proxy import PROXYING

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gate:
    """Holds fake-vllm's completions until opened, counting those that arrived."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.arrived = 0
        self.changed = asyncio.Condition()

    async def reached(self, count: int) -> None:
        """Until `count` requests have arrived upstream (so have passed the proxy's start)."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.arrived >= count)

    def app(self, fake: FakeServer) -> web.Application:
        """fake-vllm behind this gate."""
        @web.middleware
        async def hold(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path.endswith("completions"):
                async with self.changed:
                    self.arrived += 1
                    self.changed.notify_all()
                await self.open.wait()
            return await handler(request)

        app = make_fake_app(fake)
        app.middlewares.append(hold)
        return app


async def _post(session: aiohttp.ClientSession, url: str, tag: str | None,
                body: dict[str, Any], header: str = "X-Run-Tag") -> None:
    headers = {header: tag} if tag else {}
    async with session.post(url, json=body, headers=headers) as answer:
        assert answer.status == 200, await answer.text()
        await answer.read()


async def _wave(session: aiohttp.ClientSession, url: str, gate: Gate,
                requests: list[tuple[str | None, dict[str, Any]]],
                header: str = "X-Run-Tag") -> None:
    """Send `requests` one after another while the upstream holds them, then let them go."""
    gate.open.clear()
    tasks = []
    for tag, body in requests:
        tasks.append(asyncio.ensure_future(_post(session, url, tag, body, header)))
        await gate.reached(gate.arrived + 1)  # each one's start sees those before it in flight
    gate.open.set()
    await asyncio.gather(*tasks)


class TestSegmentsThroughTheProxy:
    async def test_two_tags_and_two_concurrency_levels_sum_to_the_totals_and_counters(
            self, exporter: Any, aiohttp_server: Any) -> None:
        fake = FakeServer(k=3, acceptance=0.7, per_request_metrics="summary")
        gate = Gate()
        upstream = await aiohttp_server(gate.app(fake))
        port = free_port()
        under = await exporter({"targets": [{
            "name": "v", "url": str(upstream.make_url("/metrics")),
            "proxy": {"listen": f"127.0.0.1:{port}", "tag_header": "X-Run-Tag"}}]})
        await under.round()
        await under.start(id="w1")
        url = f"http://127.0.0.1:{port}/v1/completions"
        body = {"model": "m", "prompt": "p", "max_tokens": 20}
        async with aiohttp.ClientSession() as session:
            for tag in ("math", "code"):
                await _wave(session, url, gate, [(tag, body)])  # alone: concurrency 1
            await _wave(session, url, gate, [
                ("math", body | {"temperature": 0.5}), ("code", body), (None, body),
                ("math", body | {"temperature": 0})])  # 1, 2, 3, 4 in flight
        answer = await under.stop("w1")
        block = answer["per_request"]["targets"]["v"]
        by = block["by"]
        assert {t: s["requests"] for t, s in by["tag"].items()} == {
            "code": 2, "math": 3, "untagged": 1}
        assert {c: s["requests"] for c, s in by["concurrency"].items()} == {
            "1": 3, "2-3": 2, "4-7": 1}
        assert {t: s["requests"] for t, s in by["temperature"].items()} == {
            "0": 1, "0.5": 1, "default": 4}
        data = answer["results"]["v"]["data"]
        assert (block["num_spec_steps"], block["num_draft_tokens"],
                block["num_accepted_draft_tokens"]) == (
            data["num_drafts"], data["draft_tokens"], data["accepted_tokens"])
        for dimension in DIMENSIONS:
            segments = by[dimension].values()
            for key in ("requests", "with_stats", "num_spec_steps", "num_draft_tokens",
                        "num_accepted_draft_tokens"):
                assert sum(s[key] for s in segments) == block[key]
            assert sum(s["share_of_drafts"] for s in segments) == 1.0
        assert answer["per_request"]["aggregate"]["by"] == by  # one target: the same
        assert by["tag"]["math"]["note"].startswith("3 requests")  # too few for a figure

    async def test_the_main_listeners_proxy_route_counts_its_own_requests_in_flight(
            self, exporter: Any, aiohttp_server: Any) -> None:
        fake = FakeServer(k=3, acceptance=0.7, per_request_metrics="summary")
        gate = Gate()
        upstream = await aiohttp_server(gate.app(fake))
        under = await exporter({"targets": [{"name": "v",
                                             "url": str(upstream.make_url("/metrics"))}]})
        await under.round()
        await under.start(id="w1")
        url = str(under.client.make_url("/proxy/v/v1/completions"))
        body = {"model": "m", "prompt": "p", "max_tokens": 10}
        async with aiohttp.ClientSession() as session:
            gate.open.clear()
            first = asyncio.ensure_future(_post(session, url, "a", body, "X-Specdec-Tag"))
            await gate.reached(1)
            second = asyncio.ensure_future(_post(session, url, "b", body, "X-Specdec-Tag"))
            await gate.reached(2)
            gate.open.set()
            await asyncio.gather(first, second)
        by = (await under.stop("w1"))["per_request"]["aggregate"]["by"]
        assert {t: s["requests"] for t, s in by["tag"].items()} == {"a": 1, "b": 1}
        assert {c: s["requests"] for c, s in by["concurrency"].items()} == {"1": 1, "2-3": 1}


class TestTagHeaderReload:
    async def test_a_reloaded_tag_header_applies_to_the_open_port_and_the_proxy_route(
            self, exporter: Any, aiohttp_server: Any, tmp_path: Any) -> None:
        fake = FakeServer(k=3, acceptance=0.7, per_request_metrics="summary")
        upstream = await aiohttp_server(make_fake_app(fake))
        port = free_port()
        target = {"name": "v", "url": str(upstream.make_url("/metrics")),
                  "proxy": {"listen": f"127.0.0.1:{port}"}}
        path = tmp_path / "exporter.yaml"
        path.write_text(json.dumps({"targets": [target]}))
        under = await exporter({"targets": [target]}, config_path=str(path))
        await under.round()
        await under.start(id="w1")
        body = {"model": "m", "prompt": "p", "max_tokens": 5}
        urls = (f"http://127.0.0.1:{port}/v1/completions",
                str(under.client.make_url("/proxy/v/v1/completions")))
        async with aiohttp.ClientSession() as session:
            for url in urls:
                await _post(session, url, "before", body, "X-Specdec-Tag")
            target["proxy"] |= {"tag_header": "X-Run-Tag"}
            path.write_text(json.dumps({"targets": [target]}))
            assert (await under.client.post("/-/reload")).status == 200
            await under.round()
            proxying = under.client.app[PROXYING]
            assert proxying.pending is not None
            await proxying.pending
            for url in urls:
                await _post(session, url, "after", body, "X-Run-Tag")
                await _post(session, url, "ignored", body, "X-Specdec-Tag")
        tags = (await under.stop("w1"))["per_request"]["aggregate"]["by"]["tag"]
        assert {t: s["requests"] for t, s in tags.items()} == {
            "after": 2, "before": 2, "untagged": 2}


class TestTagHeaderKey:
    @pytest.mark.parametrize("name", ["X Tag", "X-Tag:", "", "Tag\u00e9"])
    def test_a_tag_header_that_is_no_header_name_names_the_key_and_rule(self, name: str) -> None:
        with pytest.raises(ConfigError) as caught:
            validate_config({"targets": [{"url": "http://127.0.0.1:9/metrics",
                                          "proxy": {"tag_header": name}}]})
        assert "targets.0.proxy.tag_header: must be an HTTP header name" in str(caught.value)

    def test_the_tag_header_defaults_to_x_specdec_tag(self) -> None:
        config = validate_config({"targets": [{"url": "http://127.0.0.1:9/metrics",
                                               "proxy": {}}]})
        assert config.targets[0].proxy is not None
        assert config.targets[0].proxy.tag_header == "X-Specdec-Tag"


async def _run(exporter: Any, aiohttp_server: Any, window: str, acceptance: float) -> Any:
    """A window of 24 requests through the proxy: 12 alone, then three waves of four at once,
    tags `a` and `b` by turns."""
    fake = FakeServer(k=3, acceptance=acceptance, per_request_metrics="summary", seed=len(window))
    gate = Gate()
    upstream = await aiohttp_server(gate.app(fake))
    port = free_port()
    under = await exporter({"targets": [{
        "name": "v", "url": str(upstream.make_url("/metrics")),
        "proxy": {"listen": f"127.0.0.1:{port}"}}]})
    await under.round()
    await under.start(id=window)
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"model": "m", "prompt": "p", "max_tokens": 40}
    async with aiohttp.ClientSession() as session:
        gate.open.set()
        for i in range(12):
            await _post(session, url, "ab"[i % 2], body, "X-Specdec-Tag")
        for _ in range(3):
            await _wave(session, url, gate, [("ab"[i % 2], body) for i in range(4)],
                        "X-Specdec-Tag")
    return under, await under.stop(window)


MEASURE = """JSON.stringify({
    overflow: document.documentElement.scrollWidth - window.innerWidth,
    charts: [...document.querySelectorAll('svg.chart.segments')].map(svg => {
        const box = svg.getBoundingClientRect();
        return {label: svg.getAttribute('aria-label'), width: box.width,
                dots: [...svg.querySelectorAll('circle')].map(c => {
                    const r = c.getBoundingClientRect();
                    return r.left >= box.left && r.right <= box.right; }),
                whiskers: svg.querySelectorAll('line').length,
                none: [...svg.querySelectorAll('text')].filter(
                    t => t.textContent.startsWith('too few')).length}; }),
    tables: [...document.querySelectorAll('table.segments')].map(t => ({
        scrolls: t.closest('.scroll') !== null, rows: t.querySelectorAll('tr').length - 1}))})"""


@pytest.mark.e2e
class TestSegmentPages:
    async def test_window_and_compare_pages_draw_segments_in_headless_chromium(
            self, exporter: Any, aiohttp_server: Any, tmp_path: Any) -> None:
        under, first = await _run(exporter, aiohttp_server, "w1", 0.8)
        by = first["per_request"]["aggregate"]["by"]
        assert {c: s["requests"] for c, s in by["concurrency"].items()} == {
            "1": 15, "2-3": 6, "4-7": 3}
        assert by["concurrency"]["1"]["acceptance_length"] is not None
        assert by["concurrency"]["4-7"]["acceptance_length"] is None
        base = str(under.client.make_url("/")).rstrip("/")
        async with Browser(tmp_path / "profile") as browser:
            seen = {}
            for width in (1400, 400):
                await browser.open(f"{base}/windows/w1", width)
                seen[width] = json.loads(await browser.evaluate(MEASURE))
                await browser.screenshot(f"segments-window-{width}px")
            await browser.open(f"{base}/compare?a=w1&b=w1", 1400)
            compared = json.loads(await browser.evaluate(MEASURE))
        for width, facts in seen.items():
            assert facts["overflow"] <= 0, width
            charts = {c["label"]: c for c in facts["charts"]}
            assert list(charts) == ["acceptance length by concurrency", "acceptance length by tag"]
            concurrency, tag = charts.values()
            # 1 has a figure; 2-3 and 4-7 are too few (fewer than 10 requests): said, not drawn
            assert concurrency["dots"] == [True] and concurrency["none"] == 2
            assert tag["dots"] == [True, True] and tag["none"] == 0
            assert tag["whiskers"] == 2 and 0 < tag["width"] <= width
        assert compared["overflow"] <= 0
        assert compared["tables"] and all(t["scrolls"] for t in compared["tables"])
        rows = {r["rows"] for r in compared["tables"]}
        assert len(compared["tables"]) == 6 and 3 in rows  # six dimensions; 3 concurrency bands

    async def test_compare_lines_up_segments_in_json_and_on_the_console(
            self, exporter: Any, aiohttp_server: Any) -> None:
        under, _ = await _run(exporter, aiohttp_server, "w1", 0.9)
        url = str(under.client.make_url("/")).rstrip("/")
        for args, want in ((["--json"], "json"), ([], "text")):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "exporter", "compare", "w1", "w1", "--exporter", url,
                *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await proc.communicate()
            assert proc.returncode == 0, err
            if want == "json":
                segments = json.loads(out)["segments"]
                assert [r["value"] for r in segments["tag"]] == ["a", "b"]
                row = segments["concurrency"][0]
                assert (row["value"], row["a_requests"], row["verdict"]) == (
                    "1", 15, "no significant difference")
                assert row["difference"]["value"] == 0 and row["a"] == row["b"]
                assert segments["concurrency"][2]["verdict"] == "unknown"  # 4-7: too few
            else:
                text = out.decode()
                assert "[acceptance length by tag]" in text
                assert "4-7 (3/3 req)" in text and "too few requests" in text
