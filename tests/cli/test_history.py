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
    assert "--from must be before --to" in done.stderr
    done = subprocess.run([sys.executable, "-m", "exporter", "history", "--prometheus",
                           "http://127.0.0.1:1", "--from", "soon", "--to", "now"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2


class _OneTarget(BaseHTTPRequestHandler):
    """A store holding one target's drafts counter: 10, 25, then 4 after a restart."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        item = {"metric": {"__name__": "vllm:spec_decode_num_drafts_total",
                           "instance": "a:1", "model_name": "m"},
                "values": [[100.0, "10"], [101.0, "25"], [102.0, "4"]]}
        body = json.dumps({"status": "success",
                           "data": {"resultType": "matrix", "result": [item]}}).encode()
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
        assert proc.returncode == 0, err
        configured = [h for h in heard if h.get("store") == "configured"]
        others = [h for h in heard if h.get("store") != "configured"]
        assert configured and all("authorization" in h for h in configured)
        assert others and all("authorization" not in h and "x-scope-orgid" not in h
                              for h in others), others
        assert "credentials and tenant were not sent there" in err.decode()
