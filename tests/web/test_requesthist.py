"""Tests of the live per-request acceptance-length histogram: its text, and through a real proxy."""

from __future__ import annotations

from typing import Any

import aiohttp
from conftest import free_port
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.perrequest import RequestStats
from exporter.fakevllm import FakeServer, make_fake_app
from exporter.web.requesthist import BUCKETS, RequestLengths, request_length


def _stats(steps: int, accepted: int) -> RequestStats:
    spec = {"num_spec_steps": steps, "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": 3 * steps}
    return RequestStats("r", "m", 1, 1, spec)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _bucket(samples: dict, target: str, le: str) -> float:
    return samples[("specdec_request_acceptance_length_bucket",
                    (("le", le), ("target", target)))]


class TestRequestLengths:
    def test_buckets_are_cumulative_with_sum_and_count(self) -> None:
        lengths = RequestLengths()
        for steps, accepted in ((10, 0), (10, 10), (4, 6), (2, 20)):  # 1.0, 2.0, 2.5, 11.0
            lengths.observe("a", _stats(steps, accepted))
        samples = _samples("".join(lengths.lines()))
        assert _bucket(samples, "a", "1.0") == 1
        assert _bucket(samples, "a", "2.0") == 2
        assert _bucket(samples, "a", "2.5") == 3
        assert _bucket(samples, "a", "8.0") == 3  # 11.0 is past the last bound
        assert _bucket(samples, "a", "+Inf") == 4
        name = "specdec_request_acceptance_length"
        assert samples[(name + "_count", (("target", "a"),))] == 4
        assert samples[(name + "_sum", (("target", "a"),))] == 16.5
        assert len([k for k in samples if k[0].endswith("_bucket")]) == len(BUCKETS) + 1

    def test_answers_without_figures_are_not_samples_and_nothing_is_absent(self) -> None:
        lengths = RequestLengths()
        lengths.observe("a", None)
        lengths.observe("a", RequestStats("r", "m", None, None, None))
        assert lengths.lines() == []

    def test_a_target_gone_from_the_config_leaves(self) -> None:
        lengths = RequestLengths()
        lengths.observe("a", _stats(1, 1))
        lengths.observe("b", _stats(1, 0))
        lengths.keep({"b": {"cluster": "east"}})
        labels = {k[1] for k in _samples("".join(lengths.lines())) if k[0].endswith("_count")}
        assert labels == {(("cluster", "east"), ("target", "b"))}

    def test_a_request_without_verify_steps_has_length_one(self) -> None:
        assert request_length({"num_spec_steps": 0, "num_accepted_draft_tokens": 0}) == 1.0


class TestThroughTheProxy:
    async def test_each_proxied_answer_is_one_sample_of_its_own_length(self, proxied: Any) -> None:
        fake = FakeServer(k=3, acceptance=0.7, per_request_metrics="summary")
        under, port = await proxied(make_fake_app(fake))
        lengths = []
        async with aiohttp.ClientSession() as session:
            for max_tokens in (5, 20, 60, 120):
                async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                        json={"model": "m", "prompt": "p",
                                              "max_tokens": max_tokens}) as answer:
                    spec = (await answer.json())["metrics"]["speculative_decoding"]
                lengths.append(request_length(spec))
        text = await (await under.client.get("/metrics")).text()
        samples = _samples(text)
        name = "specdec_request_acceptance_length"
        assert samples[(name + "_count", (("target", "v"),))] == 4
        assert abs(samples[(name + "_sum", (("target", "v"),))] - sum(lengths)) < 1e-9
        for bound in BUCKETS:
            assert _bucket(samples, "v", str(bound)) == sum(x <= bound for x in lengths)

    async def test_openmetrics_keeps_eof_last(self, exporter: Any, aiohttp_server: Any) -> None:
        fake = FakeServer(k=3, per_request_metrics="summary")
        upstream = await aiohttp_server(make_fake_app(fake))
        port = free_port()
        under = await exporter({"targets": [{
            "name": "v", "url": str(upstream.make_url("/metrics")),
            "proxy": {"listen": f"127.0.0.1:{port}"}}]})
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                    json={"model": "m", "prompt": "p", "max_tokens": 9}) as r:
                await r.read()
        answer = await under.client.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        text = await answer.text()
        assert "# TYPE specdec_request_acceptance_length histogram" in text
        assert text.endswith("# EOF\n") and text.count("# EOF") == 1
