"""Credentials reach the request only, never a page, a file or a log line."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from clitools import CLI, free_port, http, process, wait_http, write_config

from exporter.core.redact import SECRET, redact_text, redact_url
from faults.servers import Counters, RawTarget

PASSWORD = "pa55-w0rd-url"
HEADER_SECRET = "hdr-s3cret-value"
TOKEN = "t0ken-s3cret-env"
OWN_TOKEN = "exp0rter-own-t0ken"
SECRETS = (PASSWORD, HEADER_SECRET, TOKEN, OWN_TOKEN)


def _leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


class TestRedactText:
    @pytest.mark.parametrize(
        ("given", "shown"),
        [
            ("http://u:p@h:1/metrics", f"http://{SECRET}@h:1/metrics"),
            ("https://user@[::1]:8443/x?q=1", f"https://{SECRET}@[::1]:8443/x?q=1"),
            ("http://h:1/metrics", "http://h:1/metrics"),
            ("http://h:1/a@b", "http://h:1/a@b"),  # an @ in the path is no userinfo
        ],
    )
    def test_redact_url(self, given, shown):
        assert redact_url(given) == shown

    @pytest.mark.parametrize(
        "line",
        [
            "Authorization: Bearer abcdEF12",
            "{'Authorization': 'Bearer abcdEF12'}",
            "failed http://x:abcdEF12@h/ now",
            "header bearer abcdEF12 seen",
        ],
    )
    def test_redact_text(self, line):
        assert "abcdEF12" not in redact_text(line)
        assert SECRET in redact_text(line)


class TestNothingShown:
    async def test_url_userinfo_headers_and_token_stay_in_the_request(
        self, exporter, target, monkeypatch, tmp_path
    ):
        monkeypatch.setenv("SPECDEC_TARGET_TOKEN", TOKEN)
        other = await RawTarget(Counters(k=2)).start()
        url = target.url.replace("http://", f"http://scraper:{PASSWORD}@")
        exp = await exporter({"targets": [
            {"name": "a", "url": url},
            {"name": "b", "url": other.url, "headers": {"X-Api-Key": HEADER_SECRET},
             "token_env": "SPECDEC_TARGET_TOKEN"},
        ]})
        await exp.round()
        await other.stop()
        # The requests themselves carry the credentials.
        assert base64.b64encode(f"scraper:{PASSWORD}".encode()).decode() in (
            target.last_head.decode())
        assert HEADER_SECRET in other.last_head.decode()
        assert f"Bearer {TOKEN}" in other.last_head.decode()

        await exp.start(id="w1")
        target.counters.add(10, 20, [8, 5])
        await exp.round()
        answer = await exp.stop("w1")
        assert answer["results"]["a"]["status"] == "ok"
        assert answer["results"]["a"]["url"] == f"http://{SECRET}@{target.url[7:]}"

        shown = []
        for path in ("/", "/api/v1/targets", "/api/v1/windows", "/api/v1/windows/w1",
                     "/metrics", "/api/v1/windows/w1/series"):
            response = await exp.client.get(path)
            assert response.status == 200, path
            shown.append(await response.text())
        assert SECRET in shown[1]
        written = [p.read_bytes().decode("utf-8", "replace")
                   for p in Path(exp.service.config.output_dir).rglob("*") if p.is_file()]
        assert any(SECRET in text for text in written)  # the result files and window.json
        assert _leaks("\n".join(shown + written)) == []

    async def test_a_failing_target_error_does_not_quote_the_password(
        self, exporter, unused_tcp_port
    ):
        exp = await exporter({"targets": [
            {"name": "a", "url": f"http://u:{PASSWORD}@127.0.0.1:{unused_tcp_port}/metrics"},
        ]})
        await exp.start(id="w1")
        answer = await exp.stop("w1")
        assert answer["results"]["a"]["status"] == "na"
        listing = await (await exp.client.get("/api/v1/targets")).text()
        assert _leaks(str(answer) + listing) == []


@pytest.mark.e2e
class TestNothingLogged:
    def test_debug_log_has_no_credential_even_for_malformed_requests(self, tmp_path):
        target_port, port = free_port(), free_port()
        config = write_config(tmp_path / "c.yaml", port, [
            {"name": "a", "url": f"http://u:{PASSWORD}@127.0.0.1:{target_port}/metrics"},
            {"name": "b", "url": f"http://127.0.0.1:{target_port}/other",
             "headers": {"X-Api-Key": HEADER_SECRET}, "token_env": "SPECDEC_TARGET_TOKEN"},
        ])
        env = {"SPECDEC_TOKEN": OWN_TOKEN, "SPECDEC_TARGET_TOKEN": TOKEN}
        base = f"http://127.0.0.1:{port}"
        with process(CLI + ["--log-level", "debug", "serve", "--config", str(config)],
                     env=env) as proc:
            wait_http(base + "/-/healthy")
            status, _ = http("POST", base + "/api/v1/windows", {"id": "w1"}, token=OWN_TOKEN)
            assert status == 201
            status, _ = http("POST", base + "/api/v1/windows", {"id": "w2"}, token="wrong")
            assert status == 401
            asyncio.run(_malformed_requests(port))
            http("POST", base + "/api/v1/windows/w1/stop", token=OWN_TOKEN)
            http("POST", base + "/-/reload", token=OWN_TOKEN)
            time.sleep(0.5)  # a few failed scrapes of the dead target are logged meanwhile
            proc.terminate()
            _, err = proc.communicate(timeout=20)
        assert "Error handling request" in err or "BadHttpMessage" in err or "400" in err
        assert "scrape failed" in err  # debug lines were written, and quoted no secret
        assert _leaks(err) == [], err[-3000:]


async def _malformed_requests(port: int) -> None:
    """Requests aiohttp's parser refuses; it logs them with the header bytes it saw."""
    for raw in (
        f"POST /api/v1/windows HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OWN_TOKEN}\x01\r\n"
        "Content-Length: 2\r\n\r\n{}",
        f"POST /api/v1/windows HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OWN_TOKEN}\r\n"
        "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}",
        f"GET /{OWN_TOKEN}\x00 HTTP/1.1\r\nAuthorization: Bearer {OWN_TOKEN}\r\n\r\n",
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw.encode("latin-1"))
        await writer.drain()
        await asyncio.wait_for(reader.read(), 5)
        writer.close()


class TestConflictingCredentials:
    def test_url_userinfo_and_token_env_is_a_config_error(self):
        from exporter.config.model import validate_config
        from exporter.core.errors import ConfigError

        with pytest.raises(ConfigError) as caught:
            validate_config({"targets": [{"url": "http://u:p@h:1/metrics", "token_env": "T"}]})
        assert caught.value.problems[0].startswith("targets.0: credentials in the url")


class _HeaderRecorder:
    """A model server that answers every request and keeps each one's headers."""

    def __init__(self) -> None:
        self.heads: list[dict[str, str]] = []

    def app(self) -> web.Application:
        async def answer(request: web.Request) -> web.Response:
            self.heads.append(dict(request.headers))
            return web.json_response({"object": "list", "data": []})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        return app


class TestProxyKeepsTheExportersToken:
    """/proxy/ is authorised by X-Specdec-Token; the client's Authorization is the model
    server's; the exporter's token reaches no upstream, on either listener."""

    async def _rig(self, exporter, aiohttp_server, monkeypatch):
        monkeypatch.setenv("SPECDEC_TOKEN", OWN_TOKEN)
        model = _HeaderRecorder()
        upstream = await aiohttp_server(model.app())
        port = free_port()
        exp = await exporter({"targets": [{"name": "v", "url": str(upstream.make_url("/metrics")),
                                           "proxy": {"listen": f"127.0.0.1:{port}"}}]})
        return model, exp, port

    async def test_the_clients_key_goes_through_and_the_exporters_token_stays(
            self, exporter, aiohttp_server, monkeypatch):
        model, exp, _ = await self._rig(exporter, aiohttp_server, monkeypatch)
        body = {"model": "m", "prompt": "p"}
        ok = await exp.client.post("/proxy/v/v1/completions", json=body, headers={
            "Authorization": "Bearer sk-client-key", "X-Specdec-Token": OWN_TOKEN})
        assert ok.status == 200, await ok.text()
        # An older client that authorises with the exporter's token as Bearer: let through,
        # the token not sent on.
        legacy = await exp.client.post("/proxy/v/v1/completions", json=body,
                                       headers={"Authorization": f"Bearer {OWN_TOKEN}"})
        assert legacy.status == 200
        assert [head.get("Authorization") for head in model.heads] == [
            "Bearer sk-client-key", None]
        assert _leaks(repr(model.heads)) == []
        assert not any("X-Specdec-Token" in head for head in model.heads)

    async def test_without_the_exporters_token_every_method_is_refused_saying_how(
            self, exporter, aiohttp_server, monkeypatch):
        model, exp, _ = await self._rig(exporter, aiohttp_server, monkeypatch)
        for method in ("GET", "POST"):
            refused = await exp.client.request(method, "/proxy/v/v1/models", json={}, headers={
                "Authorization": "Bearer sk-client-key"})
            assert refused.status == 401
            assert "X-Specdec-Token" in (await refused.json())["error"]
        wrong = await exp.client.get("/proxy/v/v1/models", headers={"X-Specdec-Token": "nope"})
        assert wrong.status == 401 and "token wrong" in (await wrong.json())["error"]
        assert model.heads == []

    async def test_the_per_target_port_never_sends_the_exporters_token_on(
            self, exporter, aiohttp_server, monkeypatch):
        model, _, port = await self._rig(exporter, aiohttp_server, monkeypatch)
        async with aiohttp.ClientSession() as session:
            for headers in ({"Authorization": "Bearer sk-client-key"},
                            {"Authorization": f"Bearer {OWN_TOKEN}"},
                            {"X-Specdec-Token": OWN_TOKEN, "Authorization": "Bearer sk-2"}):
                async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                        json={"prompt": "p"}, headers=headers) as answer:
                    assert answer.status == 200
        assert [head.get("Authorization") for head in model.heads] == [
            "Bearer sk-client-key", None, "Bearer sk-2"]
        assert _leaks(repr(model.heads)) == []
