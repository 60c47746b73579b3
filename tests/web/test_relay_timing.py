"""The relay's own clock on each recorded answer (first byte, chunk gaps, end), used where the
server sends no timings of its own; a fake-vllm whose steps take time behind a real proxy app."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from conftest import free_port

from exporter.core.perrequest import RequestStats
from exporter.fakevllm import FakeServer, make_fake_app
from exporter.web.passthrough import PortRelay
from exporter.web.relay import Upstream


async def _through_proxy(fake: FakeServer, stream: bool) -> RequestStats:
    recorded: list[RequestStats] = []
    upstream_server = TestServer(make_fake_app(fake))
    await upstream_server.start_server()
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        origin = f"http://127.0.0.1:{upstream_server.port}"
        upstream = Upstream("t", origin, lambda _t, stats: recorded.append(stats))
        relay, port = PortRelay(upstream), free_port()  # as `Proxying` serves a port
        await relay.open("127.0.0.1", port, header_timeout=30.0)
        try:
            async with session.post(f"http://127.0.0.1:{port}/v1/completions", json={
                    "prompt": "x", "max_tokens": 10, "stream": stream,
                    "stream_options": {"include_usage": True}}) as answer:
                await answer.read()
        finally:
            await relay.close()
            await upstream_server.close()
    (stats,) = recorded
    return stats


class TestProxyClock:
    async def test_a_stream_is_timed_by_the_proxy_when_the_server_does_not(self) -> None:
        stats = await _through_proxy(FakeServer(k=3, step_seconds=0.002), stream=True)
        timing = stats.timing
        assert timing is not None and not timing.by_server
        assert timing.tokens_per_second is not None and timing.tokens_per_second > 0
        assert timing.tpot_ms is not None and timing.ttft_ms is not None
        assert timing.gaps_ms is not None and timing.gaps_ms.count >= 1

    async def test_a_whole_body_gives_tokens_per_second_only(self) -> None:
        stats = await _through_proxy(FakeServer(k=3, step_seconds=0.002), stream=False)
        timing = stats.timing
        assert timing is not None and timing.tokens_per_second is not None
        assert (timing.tpot_ms, timing.ttft_ms, timing.gaps_ms) == (None, None, None)

    @pytest.mark.parametrize("stream", [False, True])
    async def test_the_servers_own_figures_are_kept(self, stream: bool) -> None:
        stats = await _through_proxy(FakeServer(k=3, request_timing=True), stream=stream)
        assert stats.timing is not None and stats.timing.by_server
        assert stats.timing.tpot_ms is not None
