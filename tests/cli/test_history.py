"""The `history` command's time arguments and usage errors."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from storeanswers import HOSTILE_ANSWERS

from exporter.cli.main import main
from exporter.core.isotime import parse_time


def test_times_in_every_accepted_form() -> None:
    assert parse_time("now", now=1000.0) == 1000.0
    assert parse_time("-30m", now=10000.0) == 8200.0
    assert parse_time("-2h", now=10000.0) == 2800.0
    assert parse_time("1700000000") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20Z") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20") == 1700000000.0
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time("yesterday")


def test_a_bad_range_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "exporter", "history", "--prometheus",
                           "http://127.0.0.1:1", "--from", "now", "--to=-1h"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "must be before" in done.stderr
    done = subprocess.run([sys.executable, "-m", "exporter", "history", "--prometheus",
                           "http://127.0.0.1:1", "--from", "soon", "--to", "now"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2


@pytest.mark.parametrize("frm", ["-1e12", "-3650d", "-32d", "-1e300"])
def test_a_range_over_the_limit_is_one_usage_line(frm: str) -> None:
    """Refused before any query or any range is planned: no MemoryError, no store contacted
    (the URL is not even listening)."""
    done = subprocess.run([sys.executable, "-m", "exporter", "history", "--prometheus",
                           "http://127.0.0.1:1", f"--from={frm}", "--to", "now"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "over the limit of 2678400 s (31 days)" in done.stderr
    assert "Traceback" not in done.stderr and "not reachable" not in done.stderr


def test_a_store_url_that_is_not_http_is_refused_in_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "exporter", "history", "--prometheus",
                           "file:///etc", "--from", "99", "--to", "103"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "specdec-exporter: history: store file:///etc: not an http:// or https:// URL"]


class _OneTarget(BaseHTTPRequestHandler):
    """A store holding one target's drafts counter: 10, 25, then 4 after a restart."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        item = {"metric": {"__name__": "vllm:spec_decode_num_drafts_total",
                           "instance": "a:1", "model_name": "m"},
                "values": [[100.0, "10"], [101.0, "25"], [102.0, "4"]]}
        body = json.dumps({"status": "success",
                           "data": {"resultType": "matrix", "result": [item]}}).encode()
        if self.path.startswith("/api/v1/series"):
            body = json.dumps({"status": "success", "data": [{"instance": "a:1"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_history_writes_the_window_and_prints_it(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OneTarget)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    store = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        code = main(["history", "--prometheus", store, "--from", "99", "--to", "103",
                     "--output-dir", str(tmp_path), "--json"])
        answer = json.loads(capsys.readouterr().out)
        assert main(["history", "--prometheus", store, "--from", "99", "--to", "103"]) == 0
        console = capsys.readouterr().out
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert code == 0
    # 15 before the restart, 4 after it.
    assert answer["results"]["a:1"]["increase"]["num_drafts"] == 19
    assert json.loads((tmp_path / "window.json").read_text())["source"] == "prometheus"
    assert "a:1" in console
    assert main(["history", "--prometheus", store, "--from", "99", "--to", "103"]) == 1
    assert "not reachable" in capsys.readouterr().err


async def test_a_redirect_to_another_origin_gets_no_credentials(aiohttp_server: Any) -> None:
    """The CLI follows a store's 302 to another origin without its token, tenant or Basic auth,
    and says so on stderr."""
    heard: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        heard.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response({"status": "success",
                                  "data": {"resultType": "matrix", "result": []}})

    evil_app = web.Application()
    evil_app.router.add_get("/api/v1/query", record)
    evil = str((await aiohttp_server(evil_app)).make_url("")).rstrip("/")

    async def moved(request: web.Request) -> web.Response:
        heard.append({"store": "configured", **{k.lower(): v for k, v in request.headers.items()}})
        raise web.HTTPFound(evil + request.path_qs)

    store_app = web.Application()
    store_app.router.add_get("/api/v1/query", moved)
    store = str((await aiohttp_server(store_app)).make_url("")).rstrip("/")
    env = os.environ | {"STORE_TOKEN": "s3cret", "SPECDEC_STORE_PASSWORD": "pw"}
    for auth in (["--token-env", "STORE_TOKEN", "--tenant", "team-a"],
                 ["--username", "u", "--tenant", "team-a"]):
        heard.clear()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "exporter", "history", "--prometheus", store, "--from", "99",
            "--to", "103", *auth, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 3, err  # the store held nothing in the range
        configured = [h for h in heard if h.get("store") == "configured"]
        others = [h for h in heard if h.get("store") != "configured"]
        assert configured and all("authorization" in h for h in configured)
        assert others and all("authorization" not in h and "x-scope-orgid" not in h
                              for h in others), others
        assert "credentials and tenant were not sent there" in err.decode()


async def test_a_store_answer_that_makes_no_sense_is_one_line_and_exit_1(
        aiohttp_server: Any) -> None:
    answering: list[Any] = [None]

    async def query(request: web.Request) -> web.Response:
        return web.json_response(answering[0])

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    store = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    # Issue 42's H2a-d and H4, and the sum over 2^53: the route's test takes every case.
    for doc, said in [*HOSTILE_ANSWERS[:5], HOSTILE_ANSWERS[-1]]:
        answering[0] = doc
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "exporter", "history", "--prometheus", store, "--from", "99",
            "--to", "110", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        lines = err.decode().splitlines()
        assert proc.returncode == 1, lines
        assert len(lines) == 1 and lines[0].startswith("specdec-exporter: history: store "), lines
        assert said in lines[0], lines
        assert out == b""


def _store_holding(result: list[Any], scraped: list[dict[str, str]]) -> web.Application:
    async def query(request: web.Request) -> web.Response:
        return web.json_response({"status": "success",
                                  "data": {"resultType": "matrix", "result": result}})

    async def series(request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": scraped})

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    app.router.add_get("/api/v1/series", series)
    return app


async def _history(store: str, *more: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter", "history", "--prometheus", store, "--from", "99",
        "--to", "103", *more, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_range_without_data_says_so_and_exits_3(aiohttp_server: Any) -> None:
    store = str((await aiohttp_server(_store_holding([], []))).make_url("")).rstrip("/")
    code, _, err = await _history(store)
    assert code == 3
    assert err.splitlines() == [
        f"specdec-exporter: history: no spec-decode series between 1970-01-01T00:01:39.000Z "
        f"and 1970-01-01T00:01:43.000Z in the store at {store} (--allow-na to accept that)"]
    code, _, err = await _history(store, "--allow-na")
    assert code == 0 and err == ""


async def test_a_scraped_server_without_spec_decode_is_na(aiohttp_server: Any) -> None:
    drafts = {"metric": {"__name__": "vllm:spec_decode_num_drafts_total", "job": "vllm",
                         "instance": "a:1"}, "values": [[100.0, "10"], [101.0, "25"]]}
    scraped = [{"__name__": "up", "job": "vllm", "instance": i} for i in ("a:1", "plain:1")]
    store = str((await aiohttp_server(_store_holding([drafts], scraped))).make_url(""))
    code, out, _ = await _history(store.rstrip("/"), "--json")
    assert code == 0
    results = json.loads(out)["results"]
    assert results["plain:1"]["status"] == "na"
    assert results["plain:1"]["error"] == "No spec decode metrics found on server"
    assert results["a:1"]["increase"]["num_drafts"] == 15
    # Only servers without any result: exit 3, naming how many.
    store_plain = str((await aiohttp_server(_store_holding([], scraped[1:]))).make_url(""))
    code, out, err = await _history(store_plain.rstrip("/"))
    assert code == 3
    assert "1 target(s), none with spec-decode activity" in err
    assert "plain:1" in out
