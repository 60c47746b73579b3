"""POST /api/v1/windows/history against a Prometheus-API store served on loopback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from storeanswers import HOSTILE_ANSWERS

from exporter.scrape import storequery

DRAFTS = "vllm:spec_decode_num_drafts_total"


def _series(name: str, values: tuple[int, int, int], **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": name, "instance": "a:1", "model_name": "m", **labels},
            "values": [[at, str(v)] for at, v in zip((100.0, 101.0, 102.0), values, strict=True)]}


# One k=3 target: 10, 25, then a restart to 4 drafts (the range's samples), the rest in step.
SERIES = [
    _series(DRAFTS, (10, 25, 4)),
    _series("vllm:spec_decode_num_draft_tokens_total", (30, 75, 12)),
    _series("vllm:spec_decode_num_accepted_tokens_total", (15, 40, 6)),
    *(_series("vllm:spec_decode_num_accepted_tokens_per_pos_total", v, position=str(i))
      for i, v in enumerate(((8, 20, 3), (5, 14, 2), (2, 6, 1)))),
]


def _store_app(queries: list[str], heard: list[dict[str, str]] | None = None,
               base: str = "") -> web.Application:
    async def query(request: web.Request) -> web.Response:
        queries.append(request.query["query"])
        if heard is not None:
            heard.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response({"status": "success",
                                  "data": {"resultType": "matrix", "result": SERIES}})

    app = web.Application()
    app.router.add_get(base + "/api/v1/query", query)
    return app


@pytest.fixture
async def store(aiohttp_server: Any) -> tuple[str, list[str]]:
    queries: list[str] = []
    server = await aiohttp_server(_store_app(queries))
    return str(server.make_url("")).rstrip("/"), queries


class TestHistoryRoute:
    async def test_records_a_stopped_window_listed_paged_and_written(
            self, exporter: Any, store: tuple[str, list[str]]) -> None:
        url, queries = store
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history",
                                         json={"from": 99, "to": 103, "id": "h1",
                                               "name": "yesterday"})
        body = await answer.json()
        assert answer.status == 201, body
        result = body["results"]["a:1"]
        assert result["increase"]["num_drafts"] == 19  # 15 before the restart, 4 after
        assert body["source"] == "prometheus" and body["id"] == "h1"
        assert all("rate(" not in q and "increase(" not in q for q in queries)
        listed = await (await under.client.get("/api/v1/windows")).json()
        assert [w["id"] for w in listed["windows"]] == ["h1"]
        got = await (await under.client.get("/api/v1/windows/h1")).json()
        assert got["results"]["a:1"]["increase"] == result["increase"]
        assert got["name"] == "yesterday" and got["stopped_at"] == 103
        page = await (await under.client.get("/windows/h1")).text()
        assert "yesterday" in page and "a:1" in page
        saved = json.loads((Path(body["results_dir"]) / "window.json").read_text())
        assert saved["results"]["a:1"]["increase"]["num_drafts"] == 19
        again = await under.client.post("/api/v1/windows/history",
                                        json={"from": 99, "to": 103, "id": "h1"})
        assert again.status == 409

    async def test_compared_and_advised_like_any_window(
            self, exporter: Any, store: tuple[str, list[str]]) -> None:
        url, _ = store
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        dirs = []
        for window_id, to in (("ha", 101.5), ("hb", 103)):
            answer = await under.client.post("/api/v1/windows/history",
                                             json={"from": 99, "to": to, "id": window_id})
            assert answer.status == 201
            dirs.append((await answer.json())["results_dir"])
        page = await under.client.get("/compare?a=ha&b=hb")
        assert page.status == 200 and "a:1" in await page.text()
        cli = [sys.executable, "-m", "exporter"]
        compared = subprocess.run([*cli, "compare", *dirs, "--json"], capture_output=True,
                                  text=True, timeout=60)
        assert compared.returncode in (0, 1), compared.stderr  # 1: a gate, none set here
        assert "a:1" in json.dumps(json.loads(compared.stdout))
        advised = subprocess.run([*cli, "advise", dirs[1]], capture_output=True, text=True,
                                 timeout=60)
        assert advised.returncode == 0, advised.stderr
        assert "a:1" in advised.stdout

    async def test_survives_a_restart_of_the_exporter(
            self, exporter: Any, store: tuple[str, list[str]], tmp_path: Path) -> None:
        url, _ = store
        config = {"targets": [], "output_dir": str(tmp_path / "out"),
                  "history": {"allowed_stores": [{"url": url}]}}
        first = await exporter(config)
        answer = await first.client.post("/api/v1/windows/history",
                                         json={"prometheus": url, "from": 99, "to": 103,
                                               "id": "h2"})
        assert answer.status == 201
        await first.client.close()
        second = await exporter(config)
        got = await second.client.get("/api/v1/windows/h2")
        assert got.status == 200
        assert (await got.json())["results"]["a:1"]["increase"]["num_drafts"] == 19

    @pytest.mark.parametrize(("body", "status", "said"), [
        ({"from": 103, "to": 99}, 400, "bad range"),
        ({"from": "soon", "to": "now"}, 400, "ISO 8601"),
        ({"to": "now"}, 400, '"from" is required'),
        ({"from": 1, "to": 2, "prometheus": "ftp://x"}, 400, "http:// or https://"),
        ({"from": 1, "to": 2, "step": 5}, 400, "unknown keys: step"),
        ({"from": 1, "to": 2, "match": [1]}, 400, '"match" must be'),
        ({"from": 1, "to": 2, "match": "up"}, 400, "give label matchers only"),
        ({"from": 1, "to": 2, "match": ['{a="1"}', "rate(x[5m])"]}, 400, "label matchers only"),
    ])
    async def test_bad_requests_say_why(self, exporter: Any, store: tuple[str, list[str]],
                                        body: dict[str, Any], status: int, said: str) -> None:
        url, _ = store
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history", json=body)
        assert answer.status == status
        assert said in (await answer.json())["error"]

    async def test_no_store_configured_or_given_is_a_400(self, exporter: Any) -> None:
        under = await exporter({"targets": []})
        answer = await under.client.post("/api/v1/windows/history", json={"from": 1, "to": 2})
        assert answer.status == 400
        assert "history.prometheus" in (await answer.json())["error"]

    async def test_a_store_that_is_down_is_a_502_naming_it(self, exporter: Any) -> None:
        from conftest import free_port

        down = f"http://127.0.0.1:{free_port()}"
        under = await exporter({"targets": [], "history": {"prometheus": down}})
        answer = await under.client.post("/api/v1/windows/history", json={"from": 1, "to": 2})
        assert answer.status == 502
        assert down in (await answer.json())["error"]

    async def test_behind_the_token_like_every_post(self, exporter: Any,
                                                    store: tuple[str, list[str]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
        url, _ = store
        monkeypatch.setenv("SPECDEC_TOKEN", "s3cret")
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history", json={"from": 99, "to": 103})
        assert answer.status == 401


def _redirecting_app(to: str) -> web.Application:
    """A store that sends every query on to `to` (another origin, or any URL) with a 302."""

    async def query(request: web.Request) -> web.Response:
        location = to + request.path_qs if to.startswith("http") else to
        raise web.HTTPFound(location)

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    return app


CREDENTIALS = ("authorization", "x-scope-orgid")


@pytest.fixture
async def hostile(aiohttp_server: Any) -> tuple[str, list[dict[str, str]]]:
    """A store on another origin that records every header it is sent."""
    heard: list[dict[str, str]] = []
    server = await aiohttp_server(_store_app([], heard))
    return str(server.make_url("")).rstrip("/"), heard


class TestStoreCredentials:
    """The config's store credentials reach the configured store's origin and nothing else."""

    CONFIG = {"token_env": "STORE_TOKEN", "tenant": "team-a"}

    async def test_a_body_url_not_configured_is_refused_and_never_contacted(
            self, exporter: Any, store: tuple[str, list[str]],
            hostile: tuple[str, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("STORE_TOKEN", "s3cret")
        url, queries = store
        evil, heard = hostile
        under = await exporter({"targets": [], "history": {"prometheus": url, **self.CONFIG}})
        for given in (evil, evil + "/", url + "/other", url.replace("127.0.0.1", "localhost")):
            answer = await under.client.post("/api/v1/windows/history",
                                             json={"prometheus": given, "from": 99, "to": 103})
            assert answer.status == 400, given
            error = (await answer.json())["error"]
            assert "is not a configured store" in error and "history.allowed_stores" in error
        assert heard == [] and queries == []

    async def test_a_listed_store_gets_only_its_own_credentials(
            self, exporter: Any, store: tuple[str, list[str]],
            hostile: tuple[str, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("STORE_TOKEN", "s3cret")
        monkeypatch.setenv("OTHER_PASSWORD", "pw2")
        url, _ = store
        other, heard = hostile
        listed = {"url": other, "username": "u2", "password_env": "OTHER_PASSWORD"}
        under = await exporter({"targets": [], "history": {
            "prometheus": url, **self.CONFIG, "allowed_stores": [listed, {"url": other + "/x"}]}})
        answer = await under.client.post("/api/v1/windows/history",
                                         json={"prometheus": other, "from": 99, "to": 103})
        assert answer.status == 201, await answer.text()
        assert heard and all(h["authorization"] == "Basic dTI6cHcy" for h in heard)
        assert all("x-scope-orgid" not in h for h in heard)
        heard.clear()
        bare = await under.client.post("/api/v1/windows/history",
                                       json={"prometheus": other + "/x", "from": 99, "to": 103})
        assert bare.status == 502  # that path is no store; what counts is what it was sent
        assert heard == []  # 404s are not recorded by the store app: nothing reached it

    async def test_a_redirect_to_another_origin_carries_no_credentials(
            self, exporter: Any, aiohttp_server: Any,
            hostile: tuple[str, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("STORE_TOKEN", "s3cret")
        evil, heard = hostile
        mover = str((await aiohttp_server(_redirecting_app(evil))).make_url("")).rstrip("/")
        for auth in (self.CONFIG, {"username": "u", "password_env": "STORE_TOKEN",
                                   "tenant": "t"}):
            heard.clear()
            under = await exporter({"targets": [], "history": {"prometheus": mover, **auth}})
            answer = await under.client.post("/api/v1/windows/history",
                                             json={"from": 99, "to": 103})
            body = await answer.json()
            assert answer.status == 201, body
            assert heard, "the redirect was not followed"
            assert all(not set(CREDENTIALS) & set(h) for h in heard), heard
            assert any("credentials and tenant were not sent" in n for n in body["store_notes"])

    async def test_a_redirect_within_the_store_keeps_them(
            self, exporter: Any, aiohttp_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("STORE_TOKEN", "s3cret")
        heard: list[dict[str, str]] = []
        app = _store_app([], heard, base="/prom/old")

        async def moved(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect("/prom" + request.path_qs)

        app.router.add_get("/old/api/v1/query", moved)
        base = str((await aiohttp_server(app)).make_url("")).rstrip("/")
        under = await exporter({"targets": [], "history": {"prometheus": base + "/old",
                                                            **self.CONFIG}})
        answer = await under.client.post("/api/v1/windows/history", json={"from": 99, "to": 103})
        assert answer.status == 201
        assert heard and all(h["authorization"] == "Bearer s3cret" for h in heard)
        assert not any("credentials" in n for n in (await answer.json())["store_notes"])

    @pytest.mark.parametrize("to", ["file:///etc/passwd", "ftp://127.0.0.1/x",
                                    "gopher://127.0.0.1:70/"])
    async def test_a_redirect_out_of_http_is_refused(self, exporter: Any, aiohttp_server: Any,
                                                     to: str) -> None:
        mover = str((await aiohttp_server(_redirecting_app(to))).make_url("")).rstrip("/")
        under = await exporter({"targets": [], "history": {"prometheus": mover}})
        answer = await under.client.post("/api/v1/windows/history", json={"from": 99, "to": 103})
        assert answer.status == 502
        assert "only http:// and https:// are followed" in (await answer.json())["error"]


class TestBounds:
    """A read is bounded before its first query (the range) and as answers come in."""

    @pytest.mark.parametrize("frm", [-1e12, "-3650d", -1e300, "-745h"])
    async def test_a_range_over_the_limit_is_a_400_and_no_query(
            self, exporter: Any, store: tuple[str, list[str]], frm: Any) -> None:
        url, queries = store
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history",
                                         json={"from": frm, "to": "now"})
        assert answer.status == 400
        assert "over the limit of 2678400 s (31 days)" in (await answer.json())["error"]
        assert queries == []

    async def test_a_range_at_the_limit_is_read(self, exporter: Any,
                                                store: tuple[str, list[str]]) -> None:
        url, queries = store
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history",
                                         json={"from": 103 - 31 * 86400, "to": 103})
        assert answer.status == 201
        assert len(queries) == 31 * 12  # 2 h per query

    @pytest.mark.parametrize("points", [11_001, 50_000])
    async def test_too_many_points_per_series_is_a_502(self, exporter: Any, aiohttp_server: Any,
                                                       points: int) -> None:
        series = [{"metric": {"__name__": DRAFTS, "instance": "a:1"},
                   "values": [[100 + i / 1000, str(i)] for i in range(points)]}]

        async def query(request: web.Request) -> web.Response:
            return web.json_response({"status": "success",
                                      "data": {"resultType": "matrix", "result": series}})

        app = web.Application()
        app.router.add_get("/api/v1/query", query)
        url = str((await aiohttp_server(app)).make_url("")).rstrip("/")
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history", json={"from": 99, "to": 150})
        assert answer.status == 502
        error = (await answer.json())["error"]
        assert f"{points} points for one series" in error and "over 11,000 per query" in error

    async def test_samples_in_all_are_bounded(self, exporter: Any, store: tuple[str, list[str]],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(storequery, "MAX_SAMPLES", 10)  # the store holds 18 in the range
        url, _ = store
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history", json={"from": 99, "to": 103})
        assert answer.status == 502
        assert "over 10 samples in all" in (await answer.json())["error"]

    async def test_the_store_queries_stop_when_the_client_leaves(
            self, exporter: Any, aiohttp_server: Any) -> None:
        queries: list[float] = []

        async def slow(request: web.Request) -> web.Response:
            queries.append(asyncio.get_running_loop().time())
            await asyncio.sleep(0.2)
            return web.json_response({"status": "success",
                                      "data": {"resultType": "matrix", "result": []}})

        app = web.Application()
        app.router.add_get("/api/v1/query", slow)
        url = str((await aiohttp_server(app)).make_url("")).rstrip("/")
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        # 360 queries of 0.2 s would take 72 s: the client leaves after about 1 s.
        async with aiohttp.ClientSession() as session:
            with pytest.raises(TimeoutError):
                await session.post(under.client.make_url("/api/v1/windows/history"),
                                   json={"from": "-30d", "to": "now"},
                                   timeout=aiohttp.ClientTimeout(total=1.0))
        await asyncio.sleep(1.0)  # the exporter sees the client gone; a query may be in flight
        seen = len(queries)
        await asyncio.sleep(1.5)
        assert len(queries) == seen, "store queries went on after the client left"
        assert 0 < seen < 20
        listed = await (await under.client.get("/api/v1/windows")).json()
        assert listed["windows"] == []  # nothing recorded for a request nobody waits for


def _answering(doc: Any) -> web.Application:
    async def query(request: web.Request) -> web.Response:
        return web.json_response(doc)

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    return app


class TestHostileAnswers:
    @pytest.mark.parametrize(("doc", "said"), HOSTILE_ANSWERS)
    async def test_a_store_answer_that_makes_no_sense_is_a_502_saying_what(
            self, exporter: Any, aiohttp_server: Any, doc: Any, said: str) -> None:
        url = str((await aiohttp_server(_answering(doc))).make_url("")).rstrip("/")
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history", json={"from": 99, "to": 110})
        assert answer.status == 502
        error = (await answer.json())["error"]
        assert error.startswith(f"the store at {url}: store {url}"), error
        assert said in error, error
        assert (await (await under.client.get("/api/v1/windows")).json())["windows"] == []

    async def test_a_store_url_with_a_password_is_not_repeated(
            self, exporter: Any, aiohttp_server: Any) -> None:
        url = str((await aiohttp_server(_answering([1]))).make_url("")).rstrip("/")
        secret = url.replace("http://", "http://u:hunter2@")
        under = await exporter({"targets": [], "history": {"prometheus": secret}})
        answer = await under.client.post("/api/v1/windows/history", json={"from": 99, "to": 110})
        assert answer.status == 502
        assert "hunter2" not in await answer.text()

    @pytest.mark.parametrize(("given", "said"), [
        (12345, "id must be 1-128 characters"), (True, "id must be"), ("", "id must be"),
        ("../up", "without '..'"), ({"a": 1}, "id must be"), ("x" * 129, "id must be"),
    ])
    async def test_an_id_is_taken_as_given_or_refused(
            self, exporter: Any, store: tuple[str, list[str]], given: Any, said: str) -> None:
        url, queries = store
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history",
                                         json={"from": 99, "to": 103, "id": given})
        assert answer.status == 400
        assert said in (await answer.json())["error"]
        assert queries == []

    async def test_a_name_too_long_is_refused(self, exporter: Any,
                                              store: tuple[str, list[str]]) -> None:
        url, _ = store
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history",
                                         json={"from": 99, "to": 103, "name": "n" * 10_000})
        assert answer.status == 400
        assert "name must be at most" in (await answer.json())["error"]


class TestOffTheLoop:
    """The window is counted and its files written by the stop's worker, committed as a stop."""

    async def test_files_that_cannot_be_written_are_a_503_and_nothing_is_kept(
            self, exporter: Any, store: tuple[str, list[str]], tmp_path: Path) -> None:
        url, _ = store
        out = tmp_path / "out"
        under = await exporter({"targets": [], "output_dir": str(out),
                                "history": {"prometheus": url}})
        out.mkdir(exist_ok=True)
        (out / "h9").write_text("a file where the window's folder goes")
        answer = await under.client.post("/api/v1/windows/history",
                                         json={"from": 99, "to": 103, "id": "h9"})
        assert answer.status == 503
        assert 'window "h9" not recorded' in (await answer.json())["error"]
        assert (await under.client.get("/api/v1/windows/h9")).status == 404
        (out / "h9").unlink()
        again = await under.client.post("/api/v1/windows/history",
                                        json={"from": 99, "to": 103, "id": "h9"})
        assert again.status == 201
        body = await again.json()
        saved = json.loads((out / "h9" / "window.json").read_text())
        assert saved["results"] == body["results"]
        got = await (await under.client.get("/api/v1/windows/h9")).json()
        assert got["results"] == body["results"]

    @pytest.mark.parametrize("in_child", ["1", "0"])
    async def test_the_answer_is_the_same_in_a_child_or_a_thread(
            self, exporter: Any, store: tuple[str, list[str]],
            monkeypatch: pytest.MonkeyPatch, in_child: str) -> None:
        monkeypatch.setenv("SPECDEC_STOP_IN_CHILD", in_child)
        url, _ = store
        under = await exporter({"targets": [], "history": {"prometheus": url}})
        answer = await under.client.post("/api/v1/windows/history",
                                         json={"from": 99, "to": 103, "id": "hc"})
        body = await answer.json()
        assert answer.status == 201, body
        assert body["results"]["a:1"]["increase"]["num_drafts"] == 19
        assert body["results_dir"].endswith("hc")
        listed = await (await under.client.get("/api/v1/windows")).json()
        assert [w["id"] for w in listed["windows"]] == ["hc"]
