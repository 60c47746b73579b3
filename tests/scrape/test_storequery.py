"""The store client, against a real loopback HTTP server answering as Prometheus's query API."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import free_port

from exporter.config.model import StoreAuth
from exporter.scrape import storequery
from exporter.scrape.storequery import (
    HistoryError,
    HistoryQuery,
    check_range,
    chunks,
    fetch_series,
    selectors,
)


class _Store(BaseHTTPRequestHandler):
    answers: list[tuple[int, bytes]] = []
    scraped: list[dict[str, str]] = []
    seen: list[tuple[dict[str, list[str]], dict[str, str]]] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        params = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        if self.path.startswith("/api/v1/series"):
            self._send(200, json.dumps({"status": "success", "data": self.scraped}).encode())
            return
        self.seen.append((params, {k.lower(): v for k, v in self.headers.items()}))
        status, body = self.answers.pop(0) if self.answers else (200, _matrix([]))
        self._send(status, body)

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _matrix(result: list[dict[str, Any]]) -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": "matrix", "result": result}}).encode()


def _item(instance: str, values: list[tuple[float, str]]) -> dict[str, Any]:
    return {"metric": {"__name__": "vllm:spec_decode_num_drafts_total", "instance": instance},
            "values": [[t, v] for t, v in values]}


@pytest.fixture
def store() -> Iterator[str]:
    _Store.answers, _Store.seen = [], []
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Store)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_chunks_are_merged_and_clipped_to_the_range(store: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storequery, "CHUNK_SECONDS", 10.0)
    _Store.answers = [(200, _matrix([_item("a", [(5.0, "1"), (10.0, "2"), (20.0, "3")])])),
                      (200, _matrix([_item("a", [(20.0, "3"), (25.0, "4"), (31.0, "9")])]))]
    got = fetch_series(HistoryQuery(store, 10.0, 30.0)).series
    assert [s.samples for s in got] == [[(10.0, 2.0), (20.0, 3.0), (25.0, 4.0)]]
    times = [params["time"][0] for params, _ in _Store.seen]
    assert times == ["20.000", "30.000"]
    assert _Store.seen[0][0]["query"][0].endswith("[10001ms]")


def test_auth_and_tenant_headers(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORE_TOKEN", "s3cret")
    fetch_series(HistoryQuery(store, 0.0, 1.0, auth=StoreAuth(token_env="STORE_TOKEN",
                                                                  tenant="team-a")))
    headers = _Store.seen[-1][1]
    assert headers["authorization"] == "Bearer s3cret"
    assert headers["x-scope-orgid"] == "team-a"
    monkeypatch.setenv("STORE_PASSWORD", "p")
    auth = StoreAuth(username="u", password_env="STORE_PASSWORD")
    fetch_series(HistoryQuery(store, 0.0, 1.0, auth=auth))
    assert _Store.seen[-1][1]["authorization"] == "Basic dTpw"
    with pytest.raises(HistoryError, match="NOT_SET_VAR is not set"):
        fetch_series(HistoryQuery(store, 0.0, 1.0, auth=StoreAuth(token_env="NOT_SET_VAR")))


def test_limits_and_errors_are_clear(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storequery, "MAX_SERIES", 1)
    _Store.answers = [(200, _matrix([_item("a", [(1.0, "1")]), _item("b", [(1.0, "1")])]))]
    with pytest.raises(HistoryError, match="over 1 series"):
        fetch_series(HistoryQuery(store, 0.0, 1.0))
    monkeypatch.setattr(storequery, "MAX_BYTES", 100)
    _Store.answers = [(200, _matrix([_item("a", [(1.0, "1")] * 50)]))]
    with pytest.raises(HistoryError, match="over 100 bytes"):
        fetch_series(HistoryQuery(store, 0.0, 1.0))
    _Store.answers = [(400, b'{"status":"error","error":"bad query"}')]
    with pytest.raises(HistoryError, match="HTTP 400.*bad query"):
        fetch_series(HistoryQuery(store, 0.0, 1.0))
    _Store.answers = [(200, b"not json")]
    with pytest.raises(HistoryError, match="answer is not JSON"):
        fetch_series(HistoryQuery(store, 0.0, 1.0))
    with pytest.raises(HistoryError, match="is not reachable"):
        fetch_series(HistoryQuery(f"http://u:pw@127.0.0.1:{free_port()}", 0.0, 1.0))


def test_matchers_and_ranges_are_checked() -> None:
    (one,) = selectors(['{job="vllm"}'])
    assert one.startswith('{__name__=~"') and one.endswith(',job="vllm"}')
    assert len(selectors(["{a=\"1\"}", "{b=\"2\"}"])) == 2
    with pytest.raises(HistoryError, match="label matchers only"):
        selectors(["up"])
    with pytest.raises(HistoryError, match="bad range"):
        check_range(10.0, 5.0)
    assert list(chunks(0.0, 25.0, 10.0)) == [(0.0, 10.0), (10.0, 20.0), (20.0, 25.0)]
