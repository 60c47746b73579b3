"""exporter/server/edges.py: windows bounded by the traffic through the recording proxy, exact
with periodic window scrapes running and other traffic on the server before and after."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from conftest import free_port

from exporter.core.perrequest import SUM_KEYS, from_json, from_sse
from exporter.fakevllm import FakeServer, make_fake_app


@dataclass
class Bench:
    """An AISBench-style client: plain HTTP to the proxy port, what each answer reported."""

    proxy: str
    direct: str
    session: aiohttp.ClientSession

    async def ask(self, *, through_proxy: bool = True, stream: bool = True,
                  max_tokens: int = 24, model: str = "m") -> dict[str, int]:
        base = self.proxy if through_proxy else self.direct
        body = {"model": model, "messages": [{"role": "user", "content": "q w e"}],
                "max_tokens": max_tokens, "stream": stream}
        if stream:  # vLLM sends a stream's figures on the usage chunk alone
            body["stream_options"] = {"include_usage": True}
        async with self.session.post(f"{base}/v1/chat/completions", json=body) as answer:
            assert answer.status == 200
            raw = await answer.read()
        stats = from_sse(raw) if stream else from_json(raw)
        assert stats is not None and stats.spec is not None
        return {k: stats.spec[k] for k in SUM_KEYS}


def summed(figures: list[dict[str, int]]) -> dict[str, int]:
    return {k: sum(f[k] for f in figures) for k in SUM_KEYS}


def counted(result: dict[str, Any]) -> dict[str, int]:
    data = result["data"]
    return {"num_spec_steps": data["num_drafts"], "num_draft_tokens": data["draft_tokens"],
            "num_accepted_draft_tokens": data["accepted_tokens"]}


@pytest.fixture
async def rig(exporter: Any, aiohttp_server: Any) -> AsyncIterator[tuple[Any, Bench, FakeServer]]:
    # No drafts of its own (drafts_per_second 0): every count comes from a request.
    fake = FakeServer(k=4, acceptance=0.7, per_request_metrics="summary")
    upstream = await aiohttp_server(make_fake_app(fake))
    port = free_port()
    under = await exporter({"scrape_interval": "5s", "window_scrape_interval": "50ms",
                            "targets": [{"name": "v", "url": str(upstream.make_url("/metrics")),
                                         "proxy": {"listen": f"127.0.0.1:{port}"}}]})
    await under.round()
    # Window scrapes every 50 ms throughout: the edges must stay exact with them.
    periodic = asyncio.create_task(under.service.scheduler.window_rounds())
    async with aiohttp.ClientSession() as session:
        yield under, Bench(f"http://127.0.0.1:{port}", str(upstream.make_url("")).rstrip("/"),
                           session), fake
    periodic.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await periodic


async def start(under: Any, **body: Any) -> dict[str, Any]:
    response = await under.client.post("/api/v1/windows", json=body)
    assert response.status in (200, 201), await response.text()
    return dict(await response.json())


class TestTrafficEdges:
    async def test_a_warm_up_request_is_left_out_exactly(self, rig: Any) -> None:
        under, bench, fake = rig
        opened = await start(under, id="w", edges="traffic", skip_requests=1)
        assert opened["started_at"] is None and opened["edges"] == "traffic"
        waiting = await (await under.client.get("/api/v1/windows/w")).json()
        assert (waiting["status"], waiting["edges"]["skipped"]) == ("waiting", 0)
        await bench.ask(through_proxy=False)  # another client, before the benchmark starts
        await asyncio.sleep(0.15)
        warm_up = await bench.ask(max_tokens=40)
        await asyncio.sleep(0.15)  # periodic scrapes while waiting feed no window
        measured = [await bench.ask(max_tokens=n, stream=n % 2 == 0) for n in (8, 17, 30, 5)]
        await asyncio.sleep(0.2)  # window scrapes after the last response...
        await bench.ask(through_proxy=False)  # ...and other traffic, before the stop
        await asyncio.sleep(0.2)
        answer = await under.stop("w")
        assert counted(answer["results"]["v"]) == summed(measured)
        assert summed(measured) != summed([warm_up, *measured])
        block = answer["per_request"]["targets"]["v"]
        assert block["requests"] == 4 and block["covers_all"] is True
        edges = answer["edges"]
        assert (edges["skipped"], edges["measured_requests"], edges["ended_by"]) == (
            1, 4, "the last response")
        assert edges["first_request_at"] <= edges["last_response_at"] <= answer["stopped_at"]
        assert fake.totals()["num_drafts"] > answer["results"]["v"]["data"]["num_drafts"]
        again = await (await under.client.get("/api/v1/windows/w")).json()
        assert again["edges"] == edges and again["results"] == answer["results"]

    async def test_a_server_restart_while_idle_loses_the_window_nothing(self, rig: Any) -> None:
        under, bench, fake = rig
        await start(under, id="i", edges="traffic")
        measured = []
        for n in (30, 12, 25, 40):  # paced: idle between the requests
            measured.append(await bench.ask(max_tokens=n))
            await asyncio.sleep(0.12)
        sampled = (await (await under.client.get("/api/v1/windows/i")).json())["scrapes"]["v"]
        await asyncio.sleep(0.2)
        idle = (await (await under.client.get("/api/v1/windows/i")).json())["scrapes"]["v"]
        assert idle > sampled  # still sampled while idle (at window_scrape_interval)
        fake.restart()  # what it counted is gone from its counters
        measured += [await bench.ask(max_tokens=n) for n in (9, 22)]
        answer = await under.stop("i")
        assert counted(answer["results"]["v"]) == summed(measured)
        assert answer["results"]["v"]["resets"] == 1
        assert answer["edges"]["ended_by"] == "the last response"

    async def test_concurrent_requests_after_a_skip_of_three_are_exact(self, rig: Any) -> None:
        under, bench, _ = rig
        await start(under, id="c", edges="traffic", skip_requests=3)
        # Three skipped requests at once, then eight measured ones four at a time: the first
        # measured one waits until the skipped ones have completed.
        skipped = asyncio.gather(*(bench.ask(max_tokens=30) for _ in range(3)))
        while (await (await under.client.get("/api/v1/windows/c")).json())["edges"][
                "skipped"] < 3:  # the three have reached the proxy before any measured one
            await asyncio.sleep(0.005)
        measured: list[dict[str, int]] = []
        for _ in range(2):
            measured += await asyncio.gather(*(bench.ask(max_tokens=n) for n in (9, 21, 4, 13)))
        await skipped
        await bench.ask(through_proxy=False)
        answer = await under.stop("c")
        assert counted(answer["results"]["v"]) == summed(measured)
        assert answer["edges"]["measured_requests"] == 8

    async def test_no_measured_request_stops_an_empty_window_that_says_so(
            self, rig: Any) -> None:
        under, bench, _ = rig
        await start(under, id="e", edges="traffic", skip_requests=1)
        await bench.ask()  # the warm-up only
        answer = await under.stop("e")
        assert answer["results"]["v"]["status"] == "na"
        assert answer["edges"]["ended_by"] == "the stop: no measured request reached the proxy"

    async def test_a_second_start_is_the_retry_and_other_fields_are_refused(
            self, rig: Any) -> None:
        under, _, _ = rig
        first = await under.client.post("/api/v1/windows", json={"id": "r", "edges": "traffic"})
        again = await under.client.post("/api/v1/windows", json={"id": "r", "edges": "traffic"})
        assert (first.status, again.status) == (201, 200)
        other = await under.client.post("/api/v1/windows",
                                        json={"id": "r", "edges": "traffic", "name": "x"})
        assert other.status == 409
        bad = await under.client.post("/api/v1/windows", json={"skip_requests": 2})
        assert bad.status == 400
        assert "skip_requests needs" in json.loads(await bad.text())["error"]
        unknown = await under.client.post("/api/v1/windows",
                                          json={"edges": "traffic", "targets": ["nope"]})
        assert unknown.status == 400

    async def test_waiting_windows_count_toward_max_open_windows(
            self, exporter: Any, aiohttp_server: Any) -> None:
        fake = FakeServer(k=2)
        upstream = await aiohttp_server(make_fake_app(fake))
        under = await exporter({"max_open_windows": 2, "targets": [
            {"name": "v", "url": str(upstream.make_url("/metrics")),
             "proxy": {"listen": f"127.0.0.1:{free_port()}"}}]})
        await under.round()
        await start(under, id="a", edges="traffic")
        await start(under, id="b")
        refused = await under.client.post("/api/v1/windows", json={"id": "c", "edges": "traffic"})
        assert refused.status == 429

    async def test_a_fleet_of_shards_refuses_traffic_edges(self, exporter: Any) -> None:
        # The proxy of a target lives on the shard that scrapes it: one exporter's window.
        under = await exporter({"shards": 2, "shard_index": 0,
                                "peers": ["http://127.0.0.1:1", "http://127.0.0.1:2"]})
        refused = await under.client.post("/api/v1/windows", json={"edges": "traffic"})
        assert refused.status == 400
        assert "needs one exporter" in json.loads(await refused.text())["error"]


class TestAISBenchWarmUps:
    async def test_skip_requests_leaves_out_each_models_warm_up(
            self, exporter: Any, aiohttp_server: Any) -> None:
        # Two models, one server each, asked as AISBench asks them one after the other: GET
        # /v1/models twice, the warm-up POST, GET /v1/models (and GET /metrics: its host_port
        # is the proxy), then the measured POSTs.
        fakes = {m: FakeServer(k=3, acceptance=0.6, per_request_metrics="summary")
                 for m in ("a", "b")}
        upstreams = {m: await aiohttp_server(make_fake_app(f)) for m, f in fakes.items()}
        ports = {m: free_port() for m in fakes}
        under = await exporter({"scrape_interval": "5s", "window_scrape_interval": "50ms",
                                "targets": [{"name": m, "url": str(u.make_url("/metrics")),
                                             "proxy": {"listen": f"127.0.0.1:{ports[m]}"}}
                                            for m, u in upstreams.items()]})
        await under.round()
        periodic = asyncio.create_task(under.service.scheduler.window_rounds())
        await start(under, id="ais", edges="traffic", skip_requests=1)
        measured: dict[str, list[dict[str, int]]] = {}
        async with aiohttp.ClientSession() as session:
            for model in ("a", "b"):
                base = f"http://127.0.0.1:{ports[model]}"
                bench = Bench(base, str(upstreams[model].make_url("")).rstrip("/"), session)
                for path in ("/v1/models", "/v1/models"):
                    async with session.get(base + path) as answer:
                        assert answer.status == 200
                warm_up = await bench.ask(max_tokens=50)
                for path in ("/v1/models", "/metrics"):
                    async with session.get(base + path) as answer:
                        assert answer.status == 200
                measured[model] = [await bench.ask(max_tokens=n) for n in (9, 22, 14)]
                assert summed(measured[model]) != summed([warm_up, *measured[model]])
                await asyncio.sleep(0.15)  # window scrapes between the models
        answer = await under.stop("ais")
        periodic.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await periodic
        for model in ("a", "b"):
            assert counted(answer["results"][model]) == summed(measured[model]), model
            block = answer["per_request"]["targets"][model]
            assert block["requests"] == 3 and block["covers_all"] is True
        edges = answer["edges"]
        assert (edges["skipped"], edges["measured_requests"], edges["ended_by"]) == (
            2, 6, "the last response")

    async def test_two_models_on_one_target_each_leave_their_warm_up_out(
            self, rig: Any) -> None:
        # Both models behind one server (one proxy port), asked as AISBench asks them one
        # after the other: the second model's warm-up comes while the window is open.
        under, bench, _ = rig
        await start(under, id="two", edges="traffic", skip_requests=1)
        measured: list[dict[str, int]] = []
        warm_ups: list[dict[str, int]] = []
        for model in ("a", "b"):
            for path in ("/v1/models", "/v1/models"):
                async with bench.session.get(bench.proxy + path) as answer:
                    assert answer.status == 200
            warm_ups.append(await bench.ask(max_tokens=50, model=model))
            for path in ("/v1/models", "/metrics"):
                async with bench.session.get(bench.proxy + path) as answer:
                    assert answer.status == 200
            measured += [await bench.ask(max_tokens=n, model=model, stream=n % 2 == 0)
                         for n in (9, 22, 14)]
            await asyncio.sleep(0.15)  # window scrapes between the models
        answer = await under.stop("two")
        assert counted(answer["results"]["v"]) == summed(measured)
        assert summed(measured) != summed([*warm_ups, *measured])
        block = answer["per_request"]["targets"]["v"]
        assert block["requests"] == 6 and block["covers_all"] is True
        assert block["num_spec_steps"] == summed(measured)["num_spec_steps"]
        edges = answer["edges"]
        assert (edges["skipped"], edges["measured_requests"], edges["ended_by"]) == (
            2, 6, "the last response")

    async def test_a_warm_up_among_measured_requests_waits_and_is_taken_off(
            self, rig: Any) -> None:
        # Model b's warm-up sent while model a's measured requests are in flight; then the
        # server restarts (the warm-up's counts gone with the rest) and b goes on.
        under, bench, fake = rig
        await start(under, id="mix", edges="traffic", skip_requests=1)
        await bench.ask(max_tokens=40, model="a")  # a's warm-up: before the window
        first = [await bench.ask(max_tokens=11, model="a")]
        mixed = await asyncio.gather(*(bench.ask(max_tokens=n, model="a") for n in (30, 27)),
                                     bench.ask(max_tokens=45, model="b"))
        measured = [*first, *mixed[:2], await bench.ask(max_tokens=19, model="b")]
        await asyncio.sleep(0.15)
        fake.restart()
        measured += [await bench.ask(max_tokens=n, model="b") for n in (16, 8)]
        answer = await under.stop("mix")
        assert counted(answer["results"]["v"]) == summed(measured)
        assert answer["per_request"]["targets"]["v"]["requests"] == 6
        assert (answer["edges"]["skipped"], answer["edges"]["measured_requests"]) == (2, 6)

    async def test_a_stop_after_a_warm_up_ends_before_it(self, rig: Any) -> None:
        under, bench, _ = rig
        await start(under, id="end", edges="traffic", skip_requests=1)
        await bench.ask(max_tokens=40, model="a")
        measured = [await bench.ask(max_tokens=n, model="a") for n in (13, 28)]
        await bench.ask(max_tokens=35, model="b")  # b's warm-up, and no request after it
        await asyncio.sleep(0.15)  # window scrapes after it
        answer = await under.stop("end")
        assert counted(answer["results"]["v"]) == summed(measured)
        assert answer["per_request"]["targets"]["v"]["requests"] == 2
        assert answer["edges"]["ended_by"] == "the last response"
