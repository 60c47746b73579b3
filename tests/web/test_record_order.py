"""A proxied answer is recorded before its last byte reaches the client: whatever the client
sends next (a window's stop, a GET) finds it, however long reading the answer's figures takes."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from exporter.fakevllm import FakeServer, make_fake_app

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PADDING = 400_000  # log-probabilities beside the answer's figures: ~2.4 MB of JSON to read


@web.middleware
async def padded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """fake-vllm's answer with a large field the relay must read past for its figures."""
    answer = await handler(request)
    if not request.path.endswith("completions"):
        return answer
    assert isinstance(answer, web.Response) and answer.body is not None
    body = json.loads(bytes(answer.body))  # type: ignore[arg-type]
    body["choices"][0]["logprobs"] = {"token_logprobs": [-0.125] * PADDING}
    return web.json_response(body)


async def test_each_answer_is_the_windows_once_the_client_has_it(proxied: Any) -> None:
    app = make_fake_app(FakeServer(k=3, acceptance=0.7, per_request_metrics="summary"))
    app.middlewares.append(padded)
    under, port = await proxied(app)
    await under.start(id="o")
    window = under.service.book.get("o")
    body = {"model": "m", "prompt": "p", "max_tokens": 16}
    async with aiohttp.ClientSession() as session:
        for asked in range(1, 6):
            async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                    json=body) as answer:
                assert answer.status == 200
                assert len(await answer.read()) > 2 * PADDING
            # No await since the last byte: only what was handed before it can be here.
            assert window.per_request["v"].requests == asked
    stopped = await under.stop("o")
    assert stopped["per_request"]["targets"]["v"]["requests"] == 5
