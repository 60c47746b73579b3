"""Tests of the recording proxy: real clients through it to a real fake-vllm, bytes unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import free_port

from exporter.config.model import validate_config
from exporter.core.perrequest import PerRequest, RequestStats, per_position_accepted
from exporter.fakevllm import FakeServer, make_fake_app
from exporter.web.passthrough import PortRelay
from exporter.web.proxy import PROXYING, Proxying, Upstream


class PortServer:
    """A per-target proxy port (as `Proxying` serves one), addressed as a TestServer is."""

    def __init__(self, port: int) -> None:
        self.port = port

    def make_url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@contextlib.asynccontextmanager
async def port_relay(upstream: Upstream) -> AsyncIterator[PortServer]:
    relay, port = PortRelay(upstream), free_port()
    await relay.open("127.0.0.1", port, header_timeout=30.0)
    try:
        yield PortServer(port)
    finally:
        await relay.close()


class Rig:
    """fake-vllm, a proxy in front of it, and what the proxy recorded."""

    def __init__(self, fake: FakeServer, upstream: TestServer, proxy: PortServer,
                 recorded: PerRequest) -> None:
        self.fake, self.upstream, self.proxy, self.recorded = fake, upstream, proxy, recorded

    def url(self, server: TestServer | PortServer, path: str = "") -> str:
        return str(server.make_url(path))


async def _rig(fake: FakeServer, upstream_app: web.Application) -> AsyncIterator[Rig]:
    recorded = PerRequest()

    def record(target: str, stats: RequestStats | None) -> None:
        assert target == "t"
        recorded.record(stats)

    upstream = TestServer(upstream_app)
    await upstream.start_server()
    origin = str(upstream.make_url("")).rstrip("/")
    async with port_relay(Upstream("t", origin, record)) as proxy:
        yield Rig(fake, upstream, proxy, recorded)
    await upstream.close()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    fake = FakeServer(k=4, acceptance=0.7, per_request_metrics="summary")
    async for r in _rig(fake, make_fake_app(fake)):
        yield r


class TestRecordingProxy:
    async def test_openai_client_requests_are_all_recorded_and_match_the_counters(
            self, rig: Rig) -> None:
        client = openai.AsyncOpenAI(base_url=rig.url(rig.proxy, "/v1"), api_key="x")
        for stream in (False, True):
            # vLLM sends a stream's figures on the usage chunk alone
            usage = {"stream_options": {"include_usage": True}} if stream else {}
            chat = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi there"}], max_tokens=40,
                stream=stream, **usage)
            if stream:
                async for _ in chat:  # type: ignore[union-attr]
                    pass
            comp = await client.completions.create(model="m", prompt="a b c", max_tokens=33,
                                                   stream=stream, **usage)
            if stream:
                async for _ in comp:  # type: ignore[union-attr]
                    pass
        await client.close()
        totals = rig.fake.totals()
        block = rig.recorded.answer({"num_drafts": totals["num_drafts"],
                                     "draft_tokens": totals["num_draft_tokens"],
                                     "accepted_tokens": totals["num_accepted_tokens"]})
        assert block["requests"] == 4 and block["with_stats"] == 4
        assert block["num_spec_steps"] == totals["num_drafts"] > 0
        assert block["num_accepted_draft_tokens"] == totals["num_accepted_tokens"]
        assert block["covers_all"] is True
        assert per_position_accepted(block["acceptance_histogram"]) == list(
            totals["accepted_per_pos"].values())

    @pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
    async def test_a_proxied_stream_has_the_direct_streams_bytes(self, rig: Rig,
                                                               path: str) -> None:
        body: dict[str, object] = {"model": "m", "max_tokens": 25, "stream": True,
                                   "stream_options": {"include_usage": True}}
        body |= ({"messages": [{"role": "user", "content": "x"}]} if "chat" in path
                 else {"prompt": "x"})
        async with aiohttp.ClientSession() as s:
            async with s.post(rig.url(rig.upstream, path), json=body) as r:
                direct = await r.read()
        assert direct.count(b"speculative_decoding") == 1
        events = [e + b"\n\n" for e in direct.split(b"\n\n") if e]

        # The same stream again, event by event, from a server that answers it verbatim.
        async def replay(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for event in events:
                await response.write(event)
            await response.write_eof()
            return response

        app = web.Application()
        app.router.add_post(path, replay)
        async for again in _rig(FakeServer(), app):
            async with aiohttp.ClientSession() as s:
                async with s.post(rig.url(again.upstream, path), json=body) as r:
                    assert await r.read() == direct
                async with s.post(rig.url(again.proxy, path), json=body) as r:
                    assert r.headers["Content-Type"] == "text/event-stream"
                    assert await r.read() == direct
            assert again.recorded.answer()["with_stats"] == 1

    async def test_without_per_request_metrics_the_reason_says_how_to_start_vllm(self) -> None:
        fake = FakeServer()
        async for rig in _rig(fake, make_fake_app(fake)):
            async with aiohttp.ClientSession() as s:
                async with s.post(rig.url(rig.proxy, "/v1/completions"),
                                  json={"prompt": "x"}) as r:
                    assert r.status == 200
            block = rig.recorded.answer()
            assert block["without_stats"] == 1 and "--per-request-spec-decode-metrics" in (
                block["reason"])

    async def test_upstream_errors_and_other_paths_pass_through_unrecorded(self,
                                                                           rig: Rig) -> None:
        async with aiohttp.ClientSession() as s:
            async with s.post(rig.url(rig.proxy, "/v1/completions"), data=b"{not json") as r:
                assert r.status == 400 and "error" in await r.json()
            async with s.get(rig.url(rig.proxy, "/v1/models?x=1")) as r:
                assert r.status == 200 and (await r.json())["data"][0]["id"]
            async with s.get(rig.url(rig.proxy, "/nowhere")) as r:
                assert r.status == 404
        # The refused completion was proxied and is not an OpenAI answer with figures.
        assert rig.recorded.requests == 1 and rig.recorded.answer()["with_stats"] == 0

    async def test_a_huge_answer_is_relayed_whole_and_counted_unreadable(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        huge = b"x" * 300_000
        monkeypatch.setattr("exporter.web.relay.PARSE_LIMIT", 100_000)

        async def big(request: web.Request) -> web.Response:
            return web.Response(body=huge, content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/completions", big)
        async for rig in _rig(FakeServer(), app):
            async with aiohttp.ClientSession() as s:
                async with s.post(rig.url(rig.proxy, "/v1/completions"), json={}) as r:
                    assert await r.read() == huge
            assert rig.recorded.requests == 1 and rig.recorded.unreadable == 1

    async def test_a_malformed_answer_is_relayed_and_counted_unreadable(self) -> None:
        async def bad(request: web.Request) -> web.Response:
            return web.Response(body=b"\xff[broken", content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", bad)
        async for rig in _rig(FakeServer(), app):
            async with aiohttp.ClientSession() as s:
                async with s.post(rig.url(rig.proxy, "/v1/chat/completions"), json={}) as r:
                    assert await r.read() == b"\xff[broken"
            assert rig.recorded.unreadable == 1

    async def test_request_bodies_arrive_as_sent_small_whole_large_and_unsized_streamed(
            self) -> None:
        # A small body with its length goes whole (Content-Length kept); a large one, or one
        # without a length, is streamed (chunked): the upstream reads the same bytes each way.
        seen: list[tuple[bytes, str | None, str | None]] = []

        async def echo(request: web.Request) -> web.Response:
            seen.append((await request.read(), request.headers.get("Content-Length"),
                         request.headers.get("Transfer-Encoding")))
            return web.json_response({})

        async def unsized() -> AsyncIterator[bytes]:
            for part in (b'{"prompt": ', b'"streamed"}'):
                yield part

        app = web.Application(client_max_size=1 << 21)
        app.router.add_post("/v1/completions", echo)
        small, large = b'{"prompt": "p"}', b"y" * 200_000
        async for rig in _rig(FakeServer(), app):
            async with aiohttp.ClientSession() as s:
                for body in (small, large, unsized()):
                    async with s.post(rig.url(rig.proxy, "/v1/completions"), data=body) as r:
                        assert r.status == 200
        assert seen[0] == (small, str(len(small)), None)
        assert seen[1][0] == large and seen[1][2] == "chunked"
        assert seen[2][0] == b'{"prompt": "streamed"}' and seen[2][2] == "chunked"

    async def test_an_unreachable_upstream_answers_502(self) -> None:
        recorded = PerRequest()
        async with port_relay(Upstream("t", "http://127.0.0.1:1",
                                       lambda t, s: recorded.record(s))) as proxy:
            async with aiohttp.ClientSession() as s:
                async with s.post(str(proxy.make_url("/v1/completions")), json={}) as r:
                    assert r.status == 502 and "upstream" in (await r.json())["error"]
        assert recorded.requests == 0


class TestWindowsRecordProxiedRequests:
    async def test_requests_through_the_proxy_port_fill_the_windows_per_request_block(
            self, proxied: Any) -> None:
        fake = FakeServer(k=3, acceptance=0.75, per_request_metrics="summary")
        under, port = await proxied(make_fake_app(fake))  # drafts only from requests
        opened = await under.start(id="w1")
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        n = 0
        for stream in (False, True):
            for max_tokens in (7, 40):
                usage = {"stream_options": {"include_usage": True}} if stream else {}
                chat = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "q"}],
                    max_tokens=max_tokens, stream=stream, **usage)
                comp = await client.completions.create(model="m", prompt="p",
                                                       max_tokens=max_tokens, stream=stream,
                                                       **usage)
                if stream:
                    async for _ in chat:  # type: ignore[union-attr]
                        pass
                    async for _ in comp:  # type: ignore[union-attr]
                        pass
                n += 2
        await client.close()
        live = await (await under.client.get("/api/v1/windows/w1")).json()
        assert live["per_request"]["aggregate"]["requests"] == n
        answer = await under.stop(opened["id"])
        block = answer["per_request"]["targets"]["v"]
        data = answer["results"]["v"]["data"]
        assert block["requests"] == n and block["with_stats"] == n
        assert block["num_spec_steps"] == data["num_drafts"]
        assert block["num_draft_tokens"] == data["draft_tokens"]
        assert block["num_accepted_draft_tokens"] == data["accepted_tokens"]
        assert block["covers_all"] is True and answer["per_request"]["aggregate"]["covers_all"]
        assert block["per_position_acceptance_rates"] == data["per_position_acceptance_rates"]
        again = await (await under.client.get("/api/v1/windows/w1")).json()
        assert again["per_request"] == answer["per_request"]
        with open(f"{answer['results_dir']}/window.json", encoding="utf-8") as file:
            saved = json.load(file)
        assert saved["per_request"] == answer["per_request"]
        assert saved["results"]["v"] == answer["results"]["v"]  # the RESULT as it was

    async def test_the_proxy_port_relays_and_records_while_the_exporters_loop_is_busy(
            self, exporter: Any) -> None:
        # The port's relay has its own loop: a stop, a scrape or a page render holding the
        # exporter's loop does not hold a benchmark's stream (here the loop is held whole).
        fake = FakeServer(k=3, acceptance=0.75, per_request_metrics="summary")
        with _served_apart(make_fake_app(fake)) as upstream:
            port = free_port()
            under = await exporter({"targets": [{
                "name": "v", "url": f"{upstream}/metrics",
                "proxy": {"listen": f"127.0.0.1:{port}"}}]})
            await under.round()
            await under.start(id="w1")
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", method="POST",
                data=json.dumps({"model": "m", "prompt": "p", "max_tokens": 20, "stream": True,
                                 "stream_options": {"include_usage": True}}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=20) as answer:  # blocks this loop
                streamed = answer.read()
            assert streamed.count(b"speculative_decoding") == 1
            assert streamed.endswith(b"data: [DONE]\n\n")
            answer = await under.stop("w1")
        block = answer["per_request"]["targets"]["v"]
        assert block["requests"] == 1 and block["with_stats"] == 1
        assert block["num_accepted_draft_tokens"] == answer["results"]["v"]["data"][
            "accepted_tokens"]

    async def test_requests_lost_at_a_restart_are_counted_in_its_unobserved_span(
            self, proxied: Any) -> None:
        fake = FakeServer(k=3, acceptance=0.7, per_request_metrics="summary")
        under, port = await proxied(make_fake_app(fake))  # drafts only from requests
        await under.start(id="w1")

        async def ask(max_tokens: int) -> dict[str, Any]:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                        json={"model": "m", "prompt": "p",
                                              "max_tokens": max_tokens}) as answer:
                    return (await answer.json())["metrics"]["speculative_decoding"]

        await ask(30)
        await under.round()
        lost = [await ask(n) for n in (20, 40, 60)]  # counted, never scraped: gone at restart
        await asyncio.sleep(0.01)
        fake.restart()
        await ask(10)
        await under.round()
        answer = await under.stop("w1")
        (span,) = answer["results"]["v"]["unobserved"]
        (hole,) = answer["per_request"]["targets"]["v"]["unobserved"]
        assert (hole["from"], hole["to"]) == (span["from"], span["to"])
        assert hole["requests"] == 3 and hole["complete"] is True
        assert hole["num_draft_tokens"] == sum(s["num_draft_tokens"] for s in lost)
        assert hole["num_accepted_draft_tokens"] == sum(
            s["num_accepted_draft_tokens"] for s in lost)
        totals = answer["per_request"]["aggregate"]["unobserved"]
        assert totals["spans"] == 1 and totals["requests"] == 3

    async def test_the_main_listener_proxies_under_proxy_and_the_target_name(
            self, exporter: Any, aiohttp_server: Any) -> None:
        fake = FakeServer(per_request_metrics="summary")
        upstream = await aiohttp_server(make_fake_app(fake))
        under = await exporter({"targets": [{"name": "v",
                                             "url": str(upstream.make_url("/metrics"))}]})
        await under.start(id="w2")
        client = openai.AsyncOpenAI(base_url=str(under.client.make_url("/proxy/v/v1")),
                                    api_key="x")
        await client.completions.create(model="m", prompt="p", max_tokens=9)
        await client.close()
        missing = await under.client.post("/proxy/nobody/v1/completions", json={})
        assert missing.status == 404 and "nobody" in (await missing.json())["error"]
        answer = await under.stop("w2")
        assert answer["per_request"]["targets"]["v"]["requests"] == 1
        assert answer["per_request"]["aggregate"]["covers_all"] is True

    async def test_a_taken_proxy_port_is_refused_with_the_key_that_names_it(self) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            config = validate_config({"targets": [
                {"name": "a", "url": "http://127.0.0.1:9/metrics",
                 "proxy": {"listen": f"127.0.0.1:{free_port()}"}},
                {"name": "v", "url": "http://127.0.0.1:9/metrics",
                 "proxy": {"listen": f"127.0.0.1:{port}"}}]})
            proxying = Proxying(lambda target, stats: None, lambda: config)
            with pytest.raises(OSError, match=rf"targets.1.proxy.listen: .*127.0.0.1:{port}"):
                async for _ in proxying.serve(web.Application()):
                    pass
        assert proxying.session is None


class TestDisconnects:
    async def test_a_client_that_goes_away_mid_stream_ends_the_upstream_request(self) -> None:
        ended = asyncio.Event()

        async def endless(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            try:
                while True:
                    await response.write(b"data: {}\n\n")
                    await asyncio.sleep(0.01)
            except (ConnectionError, asyncio.CancelledError):
                ended.set()
                raise

        app = web.Application()
        app.router.add_post("/v1/completions", endless)
        async for rig in _rig(FakeServer(), app):
            async with aiohttp.ClientSession() as s:
                async with s.post(rig.url(rig.proxy, "/v1/completions"), json={}) as r:
                    assert (await r.content.readany()).startswith(b"data: {}")
            # The upstream's stream ends only because the proxy closed its side.
            await asyncio.wait_for(ended.wait(), 30)

    async def test_a_slowloris_client_on_the_proxy_port_is_cut_off(self) -> None:
        port = free_port()
        config = validate_config({"header_timeout": "200ms", "targets": [
            {"name": "v", "url": "http://127.0.0.1:9/metrics",
             "proxy": {"listen": f"127.0.0.1:{port}"}}]})
        proxying = Proxying(lambda target, stats: None, lambda: config)
        serving = proxying.serve(web.Application())
        await anext(serving)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # never finished
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 30) == b""  # closed by the proxy
            writer.close()
        finally:
            await serving.aclose()

    async def test_a_reload_opens_and_closes_proxy_ports(self, exporter: Any, aiohttp_server: Any,
                                                         tmp_path: Any) -> None:
        fake = FakeServer(per_request_metrics="summary")
        upstream = await aiohttp_server(make_fake_app(fake))
        target = {"name": "v", "url": str(upstream.make_url("/metrics"))}
        path = tmp_path / "exporter.yaml"
        path.write_text(json.dumps({"targets": [target]}))
        under = await exporter({"targets": [target]}, config_path=str(path))
        port = free_port()
        path.write_text(json.dumps({"targets": [target | {
            "proxy": {"listen": f"127.0.0.1:{port}"}}]}))
        assert (await under.client.post("/-/reload")).status == 200
        proxying = under.client.app[PROXYING]
        await under.round()
        assert proxying.pending is not None
        await proxying.pending
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/v1/models") as r:
                assert r.status == 200
        path.write_text(json.dumps({"targets": [target]}))
        assert (await under.client.post("/-/reload")).status == 200
        await under.round()
        assert proxying.pending is not None
        await proxying.pending
        assert proxying.ports == {}
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)


@contextlib.contextmanager
def _served_apart(app: web.Application) -> Iterator[str]:
    """`app` served on a thread of its own (its own loop), as a model server is; its base URL."""
    port, ready, loop = free_port(), threading.Event(), asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()

    def run() -> None:
        loop.run_until_complete(start())
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30), "the upstream did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
