"""fake-vllm's --enable-per-request-metrics: vLLM 0.32's timing fields where vLLM puts them
(every field, nulls too, in a whole body's `metrics`; on a stream's usage chunk without its
nulls), by vLLM's formulas; and the recording proxy's parse reading them back."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from exporter.core.perrequest import from_json, from_sse
from exporter.fakevllm import FakeServer, make_fake_app

TIMING = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
          "tokens_per_second"}


async def _answer(aiohttp_client: object, fake: FakeServer, stream: bool, n: int = 1
                  ) -> bytes:
    client: TestClient[web.Request, web.Application] = await aiohttp_client(  # type: ignore[operator]
        make_fake_app(fake))
    resp = await client.post("/v1/completions", json={
        "prompt": "x", "max_tokens": 12, "stream": stream, "n": n,
        "stream_options": {"include_usage": True}})
    return await resp.read()


def _metrics(raw: bytes, stream: bool) -> list[dict]:
    if not stream:
        return [json.loads(raw)["metrics"]]
    events = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e.startswith("data: {")]
    return [e["metrics"] for e in events if "metrics" in e]


class TestTimingFields:
    @pytest.mark.parametrize("spec", [True, False])
    async def test_a_whole_body_has_every_field_as_vllm_dumps_it(self, aiohttp_client: object,
                                                               spec: bool) -> None:
        fake = FakeServer(k=3, spec_decode=spec, request_timing=True, step_seconds=0.001,
                          per_request_metrics="summary")
        raw = await _answer(aiohttp_client, fake, stream=False)
        (metrics,) = _metrics(raw, stream=False)
        assert TIMING | {"speculative_decoding"} == set(metrics)
        assert all(metrics[k] is not None for k in TIMING)
        assert (metrics["speculative_decoding"] is None) is not spec
        # vLLM's formulas: ITL over the tokens after the first, throughput from scheduling.
        assert metrics["mean_itl_ms"] == pytest.approx(metrics["generation_time_ms"] / 11)
        assert metrics["tokens_per_second"] == pytest.approx(
            12 / (metrics["time_to_first_token_ms"] + metrics["generation_time_ms"]) * 1000)
        stats = from_json(raw)
        assert stats.timing is not None and stats.timing.by_server
        assert stats.timing.tpot_ms == metrics["mean_itl_ms"]

    async def test_a_stream_has_them_on_the_usage_chunk_without_nulls(
            self, aiohttp_client: object) -> None:
        fake = FakeServer(k=3, spec_decode=False, request_timing=True)
        raw = await _answer(aiohttp_client, fake, stream=True)
        (metrics,) = _metrics(raw, stream=True)
        assert set(metrics) == TIMING  # no spec decode: no speculative_decoding member
        assert from_sse(raw).timing is not None

    @pytest.mark.parametrize("stream", [False, True])
    async def test_without_the_flag_or_for_n_above_1_there_are_none(
            self, aiohttp_client: object, stream: bool) -> None:
        for fake, n in ((FakeServer(k=3, per_request_metrics="summary"), 1),
                        (FakeServer(k=3, request_timing=True), 2)):
            raw = await _answer(aiohttp_client, fake, stream, n)
            for metrics in _metrics(raw, stream):
                assert metrics is None or all(metrics.get(k) is None for k in TIMING)
            assert (from_sse(raw) if stream else from_json(raw)).timing is None

    def test_a_step_time_outside_its_range_is_refused(self) -> None:
        with pytest.raises(ValueError, match="step_seconds"):
            FakeServer(step_seconds=-1.0)
