"""Tests of fake-vllm's per-request spec-decode object, against its own counters."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from clitools import fake_vllm, http

from exporter.fakevllm import FakeServer, make_fake_app
from exporter.fakevllm.openai import spec_decode_object


class TestSpecDecodeObject:
    def test_the_histogram_counts_steps_by_accepted_tokens(self) -> None:
        obj = spec_decode_object([(3, 0), (3, 3), (3, 1), (3, 3)], 3, detailed=True)
        assert obj["acceptance_histogram"] == [1, 1, 0, 2]
        assert (obj["num_spec_steps"], obj["num_draft_tokens"],
                obj["num_accepted_draft_tokens"]) == (4, 12, 7)
        assert obj["mean_acceptance_length"] == 1 + 7 / 4
        assert obj["draft_acceptance_rate"] == 7 / 12
        assert (obj["per_step_accepted"], obj["per_step_drafted"]) == ([0, 3, 1, 3], [3] * 4)
        assert "per_step_accepted" not in spec_decode_object([(2, 1)], 2, detailed=False)


def _bodies(text: str, stream: bool) -> list[dict]:
    return ([json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]
            if stream else [json.loads(text)])


@pytest.mark.parametrize("mode", ["summary", "detailed", ""])
@pytest.mark.parametrize("stream", [False, True])
async def test_answers_carry_the_object_and_it_adds_to_the_counters(
        aiohttp_client: object, mode: str, stream: bool) -> None:
    fake = FakeServer(k=3, per_request_metrics=mode)
    client: TestClient[web.Request, web.Application] = await aiohttp_client(make_fake_app(fake))  # type: ignore[operator]
    resp = await client.post("/v1/completions", json={
        "prompt": "x", "max_tokens": 30, "stream": stream,
        "stream_options": {"include_usage": True}})
    bodies = _bodies(await resp.text(), stream)
    carried = [b["metrics"]["speculative_decoding"] for b in bodies if b.get("metrics")]
    if not mode:
        assert carried == []
        return
    assert len(carried) == 1
    if stream:  # the usage chunk carries it, as vLLM sends it
        assert next(b for b in bodies if b.get("metrics"))["choices"] == []
    obj = carried[0]
    totals = fake.totals()
    assert obj["num_spec_steps"] == totals["num_drafts"]
    assert obj["num_accepted_draft_tokens"] == totals["num_accepted_tokens"]
    assert obj["num_spec_steps"] + obj["num_accepted_draft_tokens"] == 30
    assert bool(obj.get("per_step_accepted")) == (mode == "detailed")


async def test_a_stream_without_usage_carries_no_figures(aiohttp_client: object) -> None:
    fake = FakeServer(k=3, per_request_metrics="summary")
    client: TestClient[web.Request, web.Application] = await aiohttp_client(make_fake_app(fake))  # type: ignore[operator]
    resp = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 20, "stream": True})
    bodies = _bodies(await resp.text(), True)
    assert bodies and not any("metrics" in b or "usage" in b for b in bodies)
    assert fake.totals()["num_drafts"] > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_n_above_1_decodes_each_sequence_and_gives_no_figures(
        aiohttp_client: object, stream: bool) -> None:
    fake = FakeServer(k=3, per_request_metrics="summary")
    client: TestClient[web.Request, web.Application] = await aiohttp_client(make_fake_app(fake))  # type: ignore[operator]
    resp = await client.post("/v1/completions", json={
        "prompt": "x", "max_tokens": 10, "n": 2, "stream": stream,
        "stream_options": {"include_usage": True}})
    bodies = _bodies(await resp.text(), stream)
    totals = fake.totals()
    assert totals["num_drafts"] + totals["num_accepted_tokens"] == 20  # two sequences of 10
    assert {c["index"] for b in bodies for c in b["choices"]} == {0, 1}
    if stream:
        assert not any("metrics" in b for b in bodies)
        assert bodies[-1]["usage"]["completion_tokens"] == 20
    else:
        assert bodies[0]["metrics"] is None and bodies[0]["usage"]["completion_tokens"] == 20


async def test_a_bad_n_is_refused(aiohttp_client: object) -> None:
    app = make_fake_app(FakeServer())
    client: TestClient[web.Request, web.Application] = await aiohttp_client(app)  # type: ignore[operator]
    resp = await client.post("/v1/completions", json={"prompt": "x", "n": 0})
    assert resp.status == 400
    assert "n must be an integer within 1..16" in (await resp.json())["error"]["message"]


@pytest.mark.e2e
def test_the_cli_flag_turns_the_object_on() -> None:
    """`specdec-exporter fake-vllm --per-request-spec-decode-metrics detailed` (a subprocess)."""
    with fake_vllm("--per-request-spec-decode-metrics", "detailed") as port:
        status, body = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                            {"prompt": "x", "max_tokens": 12})
    assert status == 200
    spec = body["metrics"]["speculative_decoding"]
    assert spec["num_spec_steps"] + spec["num_accepted_draft_tokens"] == 12
    assert len(spec["per_step_accepted"]) == spec["num_spec_steps"]
