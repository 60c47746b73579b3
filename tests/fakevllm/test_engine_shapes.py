"""fake-vllm answering as SGLang and llama.cpp do (`--dialect sglang|llamacpp`): each answer,
read by the proxy's own parse, gives figures equal to the fake's counters."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from exporter.core.perrequest import from_json, from_sse
from exporter.fakevllm import FakeServer, make_fake_app


async def _ask(aiohttp_client: Any, fake: FakeServer, body: dict[str, Any]) -> bytes:
    client: TestClient[web.Request, web.Application] = await aiohttp_client(make_fake_app(fake))
    resp = await client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 30} | body)
    assert resp.status == 200
    return await resp.read()


def _events(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(e[6:]) for e in data.split(b"\n\n") if e.startswith(b"data: {")]


@pytest.mark.parametrize("dialect", ["sglang", "llamacpp"])
@pytest.mark.parametrize(("stream", "usage"), [(False, False), (True, False), (True, True)])
async def test_the_answer_reads_as_the_counters_moved(aiohttp_client: Any, dialect: str,
                                                      stream: bool, usage: bool) -> None:
    fake = FakeServer(k=3, dialect=dialect)
    data = await _ask(aiohttp_client, fake, {
        "stream": stream, "return_spec_tokens_details": True,
        "stream_options": {"include_usage": usage}})
    stats = from_sse(data) if stream else from_json(data)
    totals = fake.totals()
    assert stats.spec is not None and stats.unreadable is None
    assert stats.spec["engine"] == {"sglang": "sglang", "llamacpp": "llama.cpp"}[dialect]
    assert stats.spec["num_draft_tokens"] == totals["num_draft_tokens"]
    assert stats.spec["num_accepted_draft_tokens"] == totals["num_accepted_tokens"]
    if dialect == "sglang":
        assert stats.spec["num_spec_steps"] == totals["num_drafts"]
        assert sum(stats.spec["acceptance_histogram"]) == totals["num_drafts"]
    else:
        assert stats.spec["num_spec_steps"] is None and stats.spec["acceptance_histogram"] is None
    if stream:  # where each server puts them: SGLang a chunk of its own, llama.cpp the last
        events = _events(data)
        carrier = next(i for i, e in enumerate(events) if "sglext" in e or "draft_n" in str(e))
        if dialect == "sglang":
            assert events[carrier]["choices"] == [] and "usage" not in events[carrier]
            assert events[carrier - 1]["choices"][0]["finish_reason"] == "length"
        else:
            assert carrier == len(events) - 1 and ("usage" in events[carrier]) == usage


async def test_sglang_sends_its_figures_only_when_asked(aiohttp_client: Any) -> None:
    fake = FakeServer(k=3, dialect="sglang")
    stats = from_json(await _ask(aiohttp_client, fake, {}))
    assert stats.unreadable is None and stats.spec is None and fake.totals()["num_drafts"]
