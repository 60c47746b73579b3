"""exporter/web/peers.py and the vetting of a peer's answer: a real exporter whose peer is a
loopback aiohttp server answering what a broken or hostile shard would."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from exporter.core.shards import owner
from exporter.web.fanout import FANOUT

NAMES = [f"t{i}" for i in range(8)]
MINE = [n for n in NAMES if owner(n, 2) == 0]
THEIRS = [n for n in NAMES if owner(n, 2) == 1]


def _ok(name: str, drafts) -> dict:
    counts = {"num_drafts": drafts, "num_draft_tokens": 3 * 10, "num_accepted_tokens": 10,
              "accepted_per_pos": {"0": 6, "1": 4}}
    return {"status": "ok", "url": f"http://{name}/metrics", "error": None, "data": {},
            "raw": {"before": None, "after": None}, "increase": counts, "target": name,
            "host_port": f"{name}:1"}


def _stop(results) -> dict:
    return {"id": "w", "name": "evil", "targets": list(THEIRS), "labels": {},
            "started_at": 1.0, "stopped_at": 2.0, "results": results,
            "results_dir": "/etc", "aggregate": {"status": "ok"}}


class Peer:
    """The hostile shard 1: a start it accepts, and a stop answer chosen by the test."""

    def __init__(self) -> None:
        self.stop_body: bytes = b"{}"
        self.hang = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/v1/windows", self.start)
        app.router.add_post("/api/v1/windows/{id}/stop", self.stop)
        return app

    async def start(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"id": body["id"], "name": None, "targets": THEIRS,
                                  "labels": {}, "started_at": 1.0e9, "start_errors": {}},
                                 status=201)

    async def stop(self, request: web.Request) -> web.StreamResponse:
        if self.hang:
            await asyncio.Event().wait()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for at in range(0, len(self.stop_body), 1000):  # many small writes: a chunked answer
            await response.write(self.stop_body[at:at + 1000])
        await response.write_eof()
        return response


@pytest.fixture
async def fleet(exporter, fake_vllm, aiohttp_server):
    peer = Peer()
    server = await aiohttp_server(peer.app())
    fakes = {n: await fake_vllm(k=2) for n in NAMES}
    exp = await exporter({"shards": 2, "shard_index": 0,
                          "peers": ["http://127.0.0.1:9", str(server.make_url("")).rstrip("/")],
                          "targets": [{"name": n, "url": f.url} for n, f in fakes.items()]})
    await exp.round()
    started = await exp.start(id="w", name="mine")
    assert sorted(started["targets"]) == sorted(NAMES), started
    for fake in fakes.values():
        fake.server.add(0, 5, 10, [4, 2])
    await exp.round()
    exp.started_at = started["started_at"]
    return exp, peer, server


def _json(value) -> bytes:
    import json

    return json.dumps(value).encode()


def _mine_counted(answer: dict, started_at: float, theirs: int = 0) -> None:
    for name in MINE:
        assert answer["results"][name]["status"] == "ok", answer["results"][name]
        assert answer["results"][name]["data"]["num_drafts"] == 5
        assert answer["results"][name]["shard"] == 0
    assert answer["aggregate"]["data"]["num_drafts"] == 5 * len(MINE) + theirs
    # The window's own keys stay ours, whatever the peer said.
    assert answer["name"] == "mine" and answer["started_at"] == started_at
    assert answer["results_dir"].endswith("/out/w")


class TestHostilePeer:
    @pytest.mark.parametrize(("results", "why"), [
        ({"t": "not-a-dict"}, "its result for 't' is not an object"),
        ([1, 2], "its results are not an object"),
        ({THEIRS[0]: _ok(THEIRS[0], 1) | {"status": "great"}}, "status 'great' is neither"),
        ({THEIRS[0]: _ok(THEIRS[0], "many")}, "increase.num_drafts is not a count: 'many'"),
        ({THEIRS[0]: _ok(THEIRS[0], 1e308)}, "increase.num_drafts is not a count: 1e+308"),
    ])
    async def test_a_malformed_result_makes_its_targets_na_never_a_500(self, fleet, results,
                                                                       why):
        exp, peer, server = fleet
        peer.stop_body = _json(_stop(results))
        response = await exp.client.post("/api/v1/windows/w/stop")
        assert response.status == 200, await response.text()
        answer = await response.json()
        _mine_counted(answer, exp.started_at)
        for name in THEIRS:
            result = answer["results"][name]
            assert result["status"] == "na"
            assert result["error"].startswith(f"shard 1 at {server.make_url('')}".rstrip("/"))
            assert "its answer is malformed: " in result["error"] and why in result["error"]

    async def test_counts_only_for_the_targets_the_split_gives_it(self, fleet):
        exp, peer, _server = fleet
        lies = {n: _ok(n, 1_000_000) for n in MINE}  # ours: the peer does not own them
        good = {n: _ok(n, 7) for n in THEIRS}
        peer.stop_body = _json(_stop(lies | good | {"ghost-1": _ok("ghost-1", 9)}))
        answer = await exp.stop("w")
        _mine_counted(answer, exp.started_at, theirs=7 * len(THEIRS))
        assert "ghost-1" not in answer["results"]
        assert all(answer["results"][n]["data"]["num_drafts"] == 7 for n in THEIRS)
        refused = answer["shards"][1]["refused"]
        assert refused["ghost-1"] == "no such target in the fleet"
        assert refused[MINE[0]] == "counted by shard 1, but the split gives it to shard 0"
        assert answer["shards"][1]["results_dir"] == "/etc"  # its own claim, not the window's

    async def test_data_is_derived_again_from_the_counts(self, fleet):
        exp, peer, _server = fleet
        lying = {n: _ok(n, 10) | {"data": {"num_drafts": "many"}} for n in THEIRS}
        peer.stop_body = _json(_stop(lying))
        answer = await exp.stop("w")
        assert answer["results"][THEIRS[0]]["data"]["num_drafts"] == 10
        assert answer["results"][THEIRS[0]]["data"]["acceptance_length"] == 2.0

    @pytest.mark.parametrize(("body", "why"), [
        (b"not json at all", "its answer is not a JSON object"),
        (b"[1, 2, 3]", "its answer is not a JSON object"),
    ])
    async def test_garbage_is_named(self, fleet, body, why):
        exp, peer, _server = fleet
        peer.stop_body = body
        answer = await exp.stop("w")
        _mine_counted(answer, exp.started_at)
        assert all(answer["results"][n]["error"].endswith(why) for n in THEIRS)

    async def test_an_answer_bigger_than_one_chunk_is_read_whole(self, fleet):
        exp, peer, _server = fleet
        padding = "x" * 300_000  # many writes, far more than one read of the stream gives
        peer.stop_body = _json(_stop({n: _ok(n, 3) | {"note": padding} for n in THEIRS}))
        answer = await exp.stop("w")
        assert all(answer["results"][n]["data"]["num_drafts"] == 3 for n in THEIRS)

    async def test_over_the_limit_is_refused_with_the_reason(self, fleet):
        exp, peer, _server = fleet
        exp.client.server.app[FANOUT].peers.max_answer = 10_000
        peer.stop_body = _json(_stop({n: _ok(n, 3) | {"note": "x" * 20_000} for n in THEIRS}))
        answer = await exp.stop("w")
        assert all(answer["results"][n]["error"].endswith("its answer is over 10000 bytes")
                   for n in THEIRS)

    async def test_a_peer_that_never_answers_is_waited_for_a_bounded_time(self, fleet):
        exp, peer, _server = fleet
        peer.hang = True
        exp.client.server.app[FANOUT].peers.timeout = 0.5
        answer = await exp.stop("w")
        _mine_counted(answer, exp.started_at)
        assert all(answer["results"][n]["status"] == "na" and
                   answer["results"][n]["error"].endswith("no answer within 0.5 s")
                   for n in THEIRS)


class TestDecode:
    def test_our_codec_both_ways(self):
        from exporter.state.answertext import compact
        from exporter.web.peers import decode_answer

        value = {"big": 2**70, "nan": float("nan"), "s": "é"}
        back = decode_answer(compact(value))
        assert back["big"] == 2**70 and back["nan"] != back["nan"] and back["s"] == "é"
        assert decode_answer(b"[" * 100_000 + b"]" * 100_000) is None
