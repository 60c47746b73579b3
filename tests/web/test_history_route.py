"""POST /api/v1/windows/history against a Prometheus-API store served on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

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


def _store_app(queries: list[str]) -> web.Application:
    async def query(request: web.Request) -> web.Response:
        queries.append(request.query["query"])
        return web.json_response({"status": "success",
                                  "data": {"resultType": "matrix", "result": SERIES}})

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
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
        config = {"targets": [], "output_dir": str(tmp_path / "out")}
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
