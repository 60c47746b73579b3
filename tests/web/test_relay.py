"""Tests of the relay as an attacker would try it: silent, stalling and hostile upstreams (raw
asyncio servers), clients that leave (raw sockets that close), bodies past the limit, hop-by-hop
headers; every relayed answer counted once."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from clitools import CLI, process, wait_http, write_config
from conftest import free_port

from exporter.config.model import validate_config
from exporter.core.errors import ConfigError
from exporter.core.perrequest import PerRequest, RequestStats, Unreadable, from_sse
from exporter.fakevllm import FakeServer, make_fake_app
from exporter.web.passthrough import PortRelay
from exporter.web.relay import (
    MAX_RELAYED_BODY,
    PARSE_LIMIT,
    SMALL_BODY,
    TAIL,
    Kept,
    Timeouts,
    Upstream,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class RawUpstream:
    """A raw asyncio server running `script` per connection; it counts open connections."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.accepted = 0
        self.open = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        try:
            await self.script(reader, writer)
            await reader.read()  # until the proxy closes its side
        except ConnectionError:
            pass
        finally:
            self.open -= 1
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def read_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_head(reader)  # and never a byte back


async def until(condition: Callable[[], bool], within: float = 10.0) -> None:
    """Wait for `condition` (a bound on waiting, not a measured time)."""
    for _ in range(int(within / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    assert condition()


@asynccontextmanager
async def proxied(origin: str, timeouts: Timeouts | None = None) -> AsyncIterator[
        tuple[str, PerRequest]]:
    """A per-target proxy app in front of `origin`: its base URL and what it recorded."""
    recorded = PerRequest()
    timeouts = timeouts or Timeouts()

    def record(target: str, stats: RequestStats) -> None:
        recorded.record(stats)

    relay = PortRelay(Upstream("t", origin, record, timeouts=timeouts))
    port = free_port()
    await relay.open("127.0.0.1", port, header_timeout=30.0)  # as `Proxying` serves a port
    try:
        yield f"http://127.0.0.1:{port}", recorded
    finally:
        await relay.close()


def raw_request(path: str, body: bytes = b"{}", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def answered_whole(port: int, path: str) -> None:
    """One request on its own connection, its chunked answer read to the end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw_request(path))
    await read_head(reader)
    await reader.readuntil(b"0\r\n\r\n")
    writer.close()


def slam(writer: asyncio.StreamWriter) -> None:
    """Close with a reset, as a client killed mid-answer does."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


class TestTimeouts:
    async def test_a_silent_upstream_answers_504_after_the_first_byte_timeout(self) -> None:
        upstream = RawUpstream(silent)
        async with upstream as origin, proxied(origin, Timeouts(first_byte=0.3)) as (base, rec):
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{base}/v1/completions", json={}) as r:
                    assert r.status == 504
                    error = (await r.json())["error"]
            assert origin in error and "first_byte_timeout" in error and "0.3s" in error
            await until(lambda: upstream.open == 0)
        assert rec.requests == 0  # no answer came: nothing to count

    async def test_a_head_begun_and_never_finished_answers_504(self) -> None:
        async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_head(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
            await writer.drain()

        async with RawUpstream(trickle) as origin, proxied(
                origin, Timeouts(first_byte=0.3)) as (base, _):
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{base}/v1/completions", json={}) as r:
                    assert r.status == 504 and "first_byte_timeout" in (await r.json())["error"]

    async def test_a_stream_that_stalls_midway_is_cut_and_counted_stalled(self) -> None:
        first = b'data: {"id": "c", "model": "m", "choices": []}\n\n'

        async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_head(reader)
            writer.write(SSE_HEAD + chunk(first))
            await writer.drain()

        upstream = RawUpstream(stall)
        async with upstream as origin, proxied(origin, Timeouts(idle=0.3)) as (base, rec):
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{base}/v1/completions", json={"stream": True}) as r:
                    assert r.status == 200 and await r.content.readexactly(len(first)) == first
                    with pytest.raises(aiohttp.ClientPayloadError):
                        await r.read()  # cut: the client sees no clean end
            await until(lambda: upstream.open == 0)
        assert (rec.requests, rec.reasons) == (1, {Unreadable.STALLED: 1})

    async def test_a_connect_that_hangs_answers_504_after_the_connect_timeout(self) -> None:
        # A listener whose accept queue is full drops further SYNs: the connect never ends.
        with socket.socket() as full:
            full.bind(("127.0.0.1", 0))
            full.listen(0)
            port = full.getsockname()[1]
            fillers = []
            for _ in range(3):
                filler = socket.socket()
                filler.setblocking(False)
                with suppress(BlockingIOError):
                    filler.connect(("127.0.0.1", port))
                fillers.append(filler)
            async with proxied(f"http://127.0.0.1:{port}", Timeouts(connect=0.3)) as (base, _):
                async with aiohttp.ClientSession() as s:
                    async with s.post(f"{base}/v1/completions", json={}) as r:
                        assert r.status == 504
                        assert "connect_timeout" in (await r.json())["error"]
            for filler in fillers:
                filler.close()

    async def test_the_target_keys_set_the_waits_on_both_ports(self, exporter: Any) -> None:
        port = free_port()
        async with RawUpstream(silent) as origin:
            under = await exporter({"targets": [{
                "name": "v", "url": f"{origin}/metrics", "proxy": {
                    "listen": f"127.0.0.1:{port}", "first_byte_timeout": "300ms"}}]})
            async with aiohttp.ClientSession() as s:
                async with s.post(f"http://127.0.0.1:{port}/v1/completions", json={}) as r:
                    assert r.status == 504
                    assert "proxy.first_byte_timeout of target v" in (await r.json())["error"]
            r2 = await under.client.post("/proxy/v/v1/completions", json={})
            assert r2.status == 504 and "0.3s" in (await r2.json())["error"]

    def test_the_keys_default_past_any_benchmark_and_refuse_nonsense(self) -> None:
        config = validate_config({"targets": [{"url": "http://127.0.0.1:9/metrics",
                                               "proxy": {"listen": "127.0.0.1:1"}}]})
        proxy = config.targets[0].proxy
        assert proxy is not None
        assert (proxy.connect_timeout, proxy.first_byte_timeout, proxy.idle_timeout) == (
            10.0, 300.0, 120.0)
        with pytest.raises(ConfigError, match=r"targets\.0\.proxy\.idle_timeout: must be"):
            validate_config({"targets": [{"url": "http://127.0.0.1:9/metrics",
                                          "proxy": {"idle_timeout": "0s"}}]})


class TestClientsThatLeave:
    async def test_20_clients_gone_before_the_first_byte_leave_no_upstream_connection(
            self) -> None:
        upstream = RawUpstream(silent)
        async with upstream as origin, proxied(origin) as (base, rec):
            clients = [await asyncio.open_connection("127.0.0.1", port_of(base))
                       for _ in range(20)]
            for _, writer in clients:
                writer.write(raw_request("/v1/completions"))
            await until(lambda: upstream.accepted == 20 and upstream.open == 20)
            for _, writer in clients:
                slam(writer)
            await until(lambda: upstream.open == 0)  # the default waits are minutes
        assert rec.requests == 0

    async def test_a_client_gone_mid_upload_ends_the_upstream_request(self) -> None:
        upstream = RawUpstream(silent)
        async with upstream as origin, proxied(origin) as (base, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n" + chunk(b"x" * 100_000))
            await until(lambda: upstream.open == 1)
            slam(writer)
            await until(lambda: upstream.open == 0)

    @pytest.mark.e2e
    async def test_through_the_served_exporter_on_both_ports(self, tmp_path: Any) -> None:
        upstream = RawUpstream(silent)
        main, own = free_port(), free_port()
        async with upstream as origin:
            config = write_config(tmp_path / "c.yaml", main, [{
                "name": "v", "url": "http://127.0.0.1:1/metrics", "api_url": origin,
                "proxy": {"listen": f"127.0.0.1:{own}"}}])
            with process(CLI + ["serve", "--config", str(config)]):
                await asyncio.to_thread(wait_http, f"http://127.0.0.1:{main}/-/ready")
                clients = []
                for port, path in [(own, "/v1/completions")] * 10 + [
                        (main, "/proxy/v/v1/chat/completions")] * 10:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(raw_request(path))
                    clients.append(writer)
                await until(lambda: upstream.open == 20)
                for writer in clients:
                    slam(writer)
                await until(lambda: upstream.open == 0)

    async def test_100_streams_whose_clients_close_right_after_done_are_all_recorded(
            self, caplog: pytest.LogCaptureFixture) -> None:
        fake = FakeServer(k=3, acceptance=0.7, per_request_metrics="summary")
        body = json.dumps({"model": "m", "prompt": "p", "max_tokens": 12, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
        pauses = iter([0.0, 0.03, 0.2] * 34)

        async def answer(request: web.Request) -> web.StreamResponse:
            # fake-vllm's stream, its end held back a little after [DONE] as a busy server's
            # can be: the client has gone by the time the relay ends the answer.
            direct = await fake_client.post("/v1/completions", data=body)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(await direct.read())
            await asyncio.sleep(next(pauses))
            await response.write_eof()
            return response

        app = web.Application()
        app.router.add_post("/v1/completions", answer)
        fake_server = TestServer(make_fake_app(fake))
        upstream = TestServer(app)
        await fake_server.start_server()
        await upstream.start_server()
        caplog.set_level(logging.ERROR)
        try:
            async with aiohttp.ClientSession(str(fake_server.make_url(""))) as fake_client, \
                    proxied(str(upstream.make_url("")).rstrip("/")) as (base, rec):
                async def one() -> None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
                    writer.write(raw_request("/v1/completions", body))
                    await reader.readuntil(b"data: [DONE]\n\n")
                    slam(writer)

                for _ in range(10):
                    await asyncio.gather(*(one() for _ in range(10)))
                await until(lambda: rec.requests == 100)
        finally:
            await upstream.close()
            await fake_server.close()
        totals = fake.totals()
        block = rec.answer({"num_drafts": totals["num_drafts"],
                            "draft_tokens": totals["num_draft_tokens"],
                            "accepted_tokens": totals["num_accepted_tokens"]})
        assert (block["requests"], block["with_stats"], block["unreadable"]) == (100, 100, 0)
        assert block["covers_all"] is True
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []

    async def test_a_client_gone_before_the_end_is_counted_client_left_once(self) -> None:
        first = b'data: {"id": "c", "model": "m", "choices": []}\n\n'

        async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_head(reader)
            writer.write(SSE_HEAD + chunk(first))
            await writer.drain()  # the rest never comes: the client leaves first

        upstream = RawUpstream(slow)
        async with upstream as origin, proxied(origin) as (base, rec):
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
            writer.write(raw_request("/v1/completions"))
            await reader.readuntil(b"\n\n\r\n")
            slam(writer)
            await until(lambda: upstream.open == 0)
            await until(lambda: rec.requests == 1)
        assert rec.reasons == {Unreadable.CLIENT_LEFT: 1}


class Sink:
    """An upstream that reads request bodies as they come and says what it saw."""

    def __init__(self) -> None:
        self.received = 0
        self.bodies: list[int] = []

    async def handle(self, request: web.Request) -> web.Response:
        size = 0
        async for piece in request.content.iter_any():
            size += len(piece)
            self.received += len(piece)
        self.bodies.append(size)
        return web.json_response({"id": "x", "choices": []})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


class TestBodies:
    async def test_a_long_prompt_is_relayed_streamed_on_both_ports(
            self, exporter: Any, aiohttp_server: Any) -> None:
        sink = Sink()
        upstream = await aiohttp_server(sink.app())
        own = free_port()
        under = await exporter({"targets": [{
            "name": "v", "url": "http://127.0.0.1:1/metrics",
            "api_url": str(upstream.make_url("")).rstrip("/"),
            "proxy": {"listen": f"127.0.0.1:{own}"}}]})
        main = f"http://127.0.0.1:{under.client.port}/proxy/v"
        prompt = b"p" * (512 << 10)  # 8x the API routes' body limit

        async def streamed() -> AsyncIterator[bytes]:
            yield prompt
            before = sink.received
            # Not held whole: the upstream reads the first part before the client sends more.
            await until(lambda: sink.received > before)
            yield prompt

        json_type = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession(headers=json_type) as s:
            for base in (main, f"http://127.0.0.1:{own}"):
                for whole in (prompt, prompt[:SMALL_BODY], prompt[:SMALL_BODY - 1]):
                    async with s.post(f"{base}/v1/completions", data=whole) as r:
                        assert r.status == 200, await r.text()
                async with s.post(f"{base}/v1/completions", data=streamed()) as r:
                    assert r.status == 200, await r.text()
        sizes = [len(prompt), SMALL_BODY, SMALL_BODY - 1, 2 * len(prompt)]
        assert sink.bodies == sizes * 2

    async def test_a_declared_body_over_the_limit_is_413_unread_on_both_ports(
            self, exporter: Any) -> None:
        upstream = RawUpstream(silent)
        own = free_port()
        async with upstream as origin:
            under = await exporter({"targets": [{
                "name": "v", "url": "http://127.0.0.1:1/metrics", "api_url": origin,
                "proxy": {"listen": f"127.0.0.1:{own}"}}]})
            for port, path in ((own, "/v1/completions"),
                               (under.client.port, "/proxy/v/v1/completions")):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: "
                             f"application/json\r\nContent-Length: {MAX_RELAYED_BODY + 1}"
                             "\r\n\r\n".encode())  # and never the body
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 413")
                writer.close()
        assert upstream.accepted == 0

    async def test_a_chunked_body_past_the_limit_is_413_and_the_upstream_cut(self) -> None:
        sink = Sink()
        server = TestServer(sink.app())
        await server.start_server()
        piece = b"q" * (1 << 20)

        async def endless() -> AsyncIterator[bytes]:
            for _ in range(MAX_RELAYED_BODY // len(piece) + 2):
                yield piece

        try:
            async with proxied(str(server.make_url("")).rstrip("/")) as (base, rec):
                async with aiohttp.ClientSession() as s:
                    async with s.post(f"{base}/v1/completions", data=endless()) as r:
                        assert r.status == 413 and "64 MiB" in (await r.json())["error"]
        finally:
            await server.close()
        assert sink.bodies == [] and rec.requests == 0  # the upstream never had a whole body


class TestConnections:
    async def test_answers_in_turn_share_one_upstream_connection_and_its_bytes_pass_through(
            self) -> None:
        events = [b'data: {"id": "c", "model": "m", "choices": []}\n\n', b"data: [DONE]\n\n"]
        framed = b"".join(chunk(e) for e in events) + b"0\r\n\r\n"

        async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for _ in range(3):
                await read_head(reader)
                await reader.readexactly(2)  # the request's body, {}
                writer.write(SSE_HEAD + framed)
                await writer.drain()

        upstream = RawUpstream(keep_alive)
        async with upstream as origin, proxied(origin) as (base, rec):
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
            for _ in range(3):
                writer.write(raw_request("/v1/completions"))
                head = await read_head(reader)
                # The upstream's chunks as it framed them, not re-framed by the relay.
                assert b"transfer-encoding: chunked" in head.lower()
                assert await reader.readexactly(len(framed)) == framed
            writer.close()
        assert upstream.accepted == 1 and rec.requests == 3 and rec.unreadable == 0

    async def test_pipelined_requests_are_answered_whole_and_in_order(self) -> None:
        def answer(name: bytes) -> bytes:
            event = b'data: {"id": "%s", "model": "m", "choices": []}\n\n' % name
            return chunk(event) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"

        async def in_turn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                head = await read_head(reader)
                await reader.readexactly(2)
                name = head.split(b" ")[1].split(b"/")[2]  # /v1/<name>/completions
                if name == b"slow":
                    await asyncio.sleep(0.3)  # a later answer must still wait for this one
                writer.write(SSE_HEAD + answer(name))
                await writer.drain()

        upstream = RawUpstream(in_turn)
        async with upstream as origin, proxied(origin) as (base, rec):
            warm = (answered_whole(port_of(base), "/v1/warm/completions") for _ in range(3))
            await asyncio.gather(*warm)  # 3 pooled connections
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
            # Three requests in one write: each answer must end before the next begins.
            names = [b"slow", b"fast1", b"fast2"]
            writer.write(b"".join(raw_request(f"/v1/{n.decode()}/completions") for n in names))
            for name in names:
                await read_head(reader)
                assert await reader.readexactly(len(answer(name))) == answer(name)
            writer.close()
        assert rec.requests == 6 and rec.unreadable == 0

    async def test_clients_gone_as_their_requests_go_on_leave_nothing_in_flight(self) -> None:
        events = b'data: {"id": "c", "model": "m", "choices": []}\n\ndata: [DONE]\n\n'

        async def answers_all_but_left(reader: asyncio.StreamReader,
                                       writer: asyncio.StreamWriter) -> None:
            while True:
                head = await read_head(reader)
                await reader.readexactly(2)
                if b"/left" in head:
                    return  # no answer: its client is gone
                writer.write(SSE_HEAD + chunk(events) + b"0\r\n\r\n")
                await writer.drain()

        seen: list[RequestStats] = []
        upstream = RawUpstream(answers_all_but_left)
        async with upstream as origin:
            relay = PortRelay(Upstream("t", origin, lambda _, stats: seen.append(stats)))
            port = free_port()
            await relay.open("127.0.0.1", port, header_timeout=30.0)
            try:
                whole = (answered_whole(port, "/v1/completions") for _ in range(20))
                await asyncio.gather(*whole)  # 20 pooled connections
                # Clients gone at once, their requests sent on from the callback that completed
                # each (pooled connections) or by their task.
                for _ in range(20):
                    _, gone = await asyncio.open_connection("127.0.0.1", port)
                    gone.write(raw_request("/v1/left/completions"))
                    slam(gone)
                await until(lambda: relay.upstream.flight.count == 0)
                await answered_whole(port, "/v1/completions")
            finally:
                await relay.close()
        # An answer never begun records nothing; the last request was alone in flight.
        assert [s.unreadable for s in seen] == [None] * 21
        assert seen[-1].context is not None and seen[-1].context.concurrency == 1

    async def test_a_client_that_expects_100_continue_gets_it_and_its_body_goes_on(
            self) -> None:
        sink = Sink()  # as curl sends a large body: the head, then the body once told to
        server = TestServer(sink.app())
        await server.start_server()
        try:
            async with proxied(str(server.make_url("")).rstrip("/")) as (base, _):
                reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
                writer.write(b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                             b"Expect: 100-continue\r\n\r\n")
                told = await asyncio.wait_for(read_head(reader), 10)
                assert told == b"HTTP/1.1 100 Continue\r\n\r\n"
                writer.write(b"hello")
                assert (await read_head(reader)).startswith(b"HTTP/1.1 200")
                writer.close()
        finally:
            await server.close()
        assert sink.bodies == [5]


class TestHopByHop:
    async def test_hop_headers_and_those_connection_names_stay_on_their_hop(self) -> None:
        seen: list[bytes] = []

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(await read_head(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Up-Hop\r\n"
                         b"X-Up-Hop: u\r\nX-Up-Kept: k\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

        hop = ("Connection: keep-alive, X-Hop-A , x-hop-b\r\nConnection: X-Hop-C\r\n"
               "X-Hop-A: a\r\nX-HOP-B: b\r\nX-Hop-C: c\r\nProxy-Authorization: Basic eDp5\r\n"
               "Keep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: h2c\r\n"
               "Proxy-Connection: keep-alive\r\nX-Kept: yes\r\nAuthorization: Bearer sk\r\n")
        async with RawUpstream(echo) as origin, proxied(origin) as (base, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
            writer.write(raw_request("/v1/models", b"{}", hop))
            answer = (await reader.readuntil(b"{}")).lower()
            writer.close()
        head = seen[0].lower()
        for name in (b"x-hop-a", b"x-hop-b", b"x-hop-c", b"proxy-authorization", b"keep-alive:",
                     b"te:", b"upgrade", b"proxy-connection"):
            assert b"\n" + name not in head, name
        assert b"\nx-kept: yes" in head and b"\nauthorization: bearer sk" in head
        for added in (b"accept", b"user-agent"):  # none the client did not send either
            assert b"\n" + added not in head, added
        assert b"\nx-up-hop" not in answer and b"\nx-up-kept: k" in answer


def _spec_answer(spec: object) -> bytes:
    return json.dumps({"id": "x", "model": "m", "choices": [],
                       "metrics": {"speculative_decoding": spec}}).encode()


class TestHostileAnswers:
    async def test_each_answer_is_relayed_unchanged_and_counted_once_with_its_reason(
            self) -> None:
        deep = b'{"id": "x", "metrics": {"speculative_decoding": ' + b'{"a": ' * 200_000 + (
            b"1" + b"}" * 200_000 + b"}}")
        spec = {"num_spec_steps": 4, "num_draft_tokens": 12, "num_accepted_draft_tokens": 6,
                "acceptance_histogram": [1, 1, 1, 1]}
        bodies = {
            "deep": (deep, Unreadable.TOO_DEEP),
            "long": (_spec_answer(spec | {"acceptance_histogram": [4] + [0] * 20_000}),
                     Unreadable.HISTOGRAM_TOO_LONG),
            "liar": (_spec_answer({"num_spec_steps": 1, "num_draft_tokens": 3,
                                   "num_accepted_draft_tokens": 500,
                                   "acceptance_histogram": [0, 0, 0, 900]}),
                     Unreadable.ACCEPTED_OVER_DRAFTED),
            "fine": (_spec_answer(spec), None),
        }

        async def answer(request: web.Request) -> web.Response:
            return web.Response(body=bodies[request.match_info["kind"]][0],
                                content_type="application/json")

        app = web.Application()
        app.router.add_post("/{kind}/v1/completions", answer)
        server = TestServer(app)
        await server.start_server()
        try:
            async with proxied(str(server.make_url("")).rstrip("/")) as (base, rec):
                async with aiohttp.ClientSession() as s:
                    for kind, (body, _) in bodies.items():
                        async with s.post(f"{base}/{kind}/v1/completions", json={}) as r:
                            assert await r.read() == body
        finally:
            await server.close()
        assert (rec.requests, rec.unreadable, rec.lengths.count) == (4, 3, 1)
        assert rec.reasons == {reason: 1 for _, reason in bodies.values() if reason}

    async def test_a_stream_the_upstream_ends_mid_event_is_unreadable(self) -> None:
        part = b'data: {"id": "c", "model": "m", "choices": []}\n\ndata: {"id": "c", "met'

        async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_head(reader)
            writer.write(SSE_HEAD + chunk(part) + b"0\r\n\r\n")  # a clean end, mid-event
            await writer.drain()

        async with RawUpstream(cut) as origin, proxied(origin) as (base, rec):
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{base}/v1/chat/completions", json={}) as r:
                    assert await r.read() == part
        assert rec.reasons == {Unreadable.CUT_MID_EVENT: 1} and rec.requests == 1

    async def test_an_upstream_that_drops_the_connection_mid_answer_is_cut(self) -> None:
        part = b'data: {"id": "c", "model": "m", "choices": []}\n\n'

        async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_head(reader)
            writer.write(SSE_HEAD + b"1000\r\n" + part)  # a chunk of 4096 begun, then gone
            await writer.drain()
            slam(writer)

        async with RawUpstream(drop) as origin, proxied(origin) as (base, rec):
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{base}/v1/completions", json={}) as r:
                    with pytest.raises(aiohttp.ClientPayloadError):
                        await r.read()  # the client sees the cut too
        assert rec.reasons == {Unreadable.CUT: 1} and rec.requests == 1


class TestTailRead:
    def test_a_long_streams_figures_come_from_its_first_event_and_tail_alone(self) -> None:
        spec = {"num_spec_steps": 4, "num_draft_tokens": 12, "num_accepted_draft_tokens": 6,
                "acceptance_histogram": [1, 1, 1, 1]}
        token = b'data: {"id": "c", "model": "m", "choices": [{"text": "' + b"t" * 60 + b'"}]}'
        last = json.dumps({"id": "c", "model": "m", "choices": [], "usage": {
            "prompt_tokens": 3, "completion_tokens": 60_000},
            "metrics": {"speculative_decoding": spec}}).encode()
        for sep in (b"\n\n", b"\r\n\r\n"):
            stream = sep.join([token] * 60_000 + [b"data: " + last, b"data: [DONE]"]) + sep
            assert len(stream) > PARSE_LIMIT  # read whole, it would be too large to read
            kept = Kept(sse=True, length=None, sent=0.0)
            for at in range(0, len(stream), 4093):  # pieces that cut events anywhere
                kept.add(stream[at:at + 4093])
                assert kept.held < TAIL + 4093  # the tokens before the tail are not held
            stats = kept.stats(None)
            # The same figures as the whole stream read (the relay's clock aside).
            assert replace(stats, timing=None) == from_sse(stream) and stats.unreadable is None
            assert (stats.request_id, stats.model, stats.completion_tokens, stats.spec) == (
                "c", "m", 60_000, spec)
            cut = Kept(sse=True, length=None, sent=0.0)
            cut.add(stream[:-len(sep) - 3])  # ended mid-event, [DONE] never whole
            assert cut.stats(None).unreadable == Unreadable.CUT_MID_EVENT
