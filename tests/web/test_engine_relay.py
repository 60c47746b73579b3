"""Other engines' answers through the real recording proxy: an aiohttp upstream serves SGLang's
and llama.cpp's fixture answers (tests/testdata/engines/), a real client asks through the
target's proxy port, and the window's per_request counts them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from conftest import free_port

from exporter.fakevllm import FakeServer, make_fake_app

DATA = Path(__file__).resolve().parent.parent / "testdata" / "engines"
# (path, model, stream) -> the fixture the upstream answers with
ANSWERS = {
    ("/v1/chat/completions", "sglang", False): "sglang_chat.json",
    ("/v1/chat/completions", "sglang", True): "sglang_chat_stream.sse",
    ("/v1/completions", "sglang", False): "sglang_completions_n2.json",
    ("/v1/chat/completions", "llama", False): "llamacpp_chat.json",
    ("/v1/chat/completions", "llama", True): "llamacpp_chat_stream.sse",
    ("/v1/completions", "llama", True): "llamacpp_chat_stream_usage.sse",
}


def engines_app() -> web.Application:
    """An upstream answering each request with the fixture its path, model and stream name."""

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = ANSWERS[(request.path, body["model"], bool(body.get("stream")))]
        data = (DATA / name).read_bytes()
        if name.endswith(".sse"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for event in data.split(b"\n\n")[:-1]:  # event by event, as the engines write
                await response.write(event + b"\n\n")
            await response.write_eof()
            return response
        return web.Response(body=data, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_post("/v1/completions", answer)
    return app


class TestOtherEnginesThroughTheProxy:
    async def test_sglang_and_llamacpp_answers_fill_the_windows_per_request_block(
            self, exporter: Any, aiohttp_server: Any) -> None:
        metrics = await aiohttp_server(make_fake_app(FakeServer(k=3)))  # a page to scrape
        engines = await aiohttp_server(engines_app())
        port = free_port()
        under = await exporter({"targets": [{
            "name": "v", "url": str(metrics.make_url("/metrics")),
            "api_url": str(engines.make_url("")).rstrip("/"),
            "proxy": {"listen": f"127.0.0.1:{port}"}}]})
        await under.round()
        opened = await under.start(id="w1")
        relayed = {}
        async with aiohttp.ClientSession() as client:
            for path, model, stream in ANSWERS:
                async with client.post(f"http://127.0.0.1:{port}{path}", json={
                        "model": model, "messages": [{"role": "user", "content": "q"}],
                        "stream": stream, "return_spec_tokens_details": True}) as response:
                    assert response.status == 200
                    relayed[ANSWERS[(path, model, stream)]] = await response.read()
        for name, data in relayed.items():
            assert data == (DATA / name).read_bytes()  # relayed unchanged
        answer = await under.stop(opened["id"])
        block = answer["per_request"]["targets"]["v"]
        assert (block["requests"], block["with_stats"], block["unreadable"]) == (6, 6, 0)
        assert block["without_steps"] == 3  # llama.cpp's: steps and histogram not reported
        # SGLang: 10 + 10 + (10 + 8) verify passes; llama.cpp's tokens join the token sums.
        assert block["num_spec_steps"] == 38
        assert block["num_draft_tokens"] == 30 + 30 + 54 + 3 * 24
        assert block["num_accepted_draft_tokens"] == 15 + 15 + 21 + 3 * 17
        assert block["acceptance_histogram"] == [10, 11, 11, 6]
        assert block["acceptance_length"]["max"] == 2.5
        assert block["draft_acceptance_rate"]["max"] == 17 / 24
        with open(f"{answer['results_dir']}/window.json", encoding="utf-8") as file:
            assert json.load(file)["per_request"] == answer["per_request"]
