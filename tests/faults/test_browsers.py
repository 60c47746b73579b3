"""A web page cannot change our state (cross-site requests, DNS rebinding)."""

from __future__ import annotations

import pytest
from clitools import CLI, fake_add, fake_vllm, free_port, process, wait_http, write_config

from exporter.web.csrf import host_allowed, host_name


@pytest.fixture
async def exp(exporter, target):
    return await exporter({"targets": [{"name": "a", "url": target.url},
                                       ], "allowed_hosts": ["bench.example.org", "*.corp.io"]})


async def _windows(exp) -> list:
    return (await (await exp.client.get("/api/v1/windows")).json())["windows"]


class TestHostRules:
    @pytest.mark.parametrize(
        ("host", "name"),
        [("127.0.0.1:9400", "127.0.0.1"), ("[::1]:9400", "::1"), ("Example.ORG", "example.org"),
         ("h:notaport", "h:notaport"), ("[fe80::1]", "fe80::1")],
    )
    def test_host_name(self, host, name):
        assert host_name(host) == name

    @pytest.mark.parametrize(
        ("name", "allowed"),
        [("127.0.0.1", True), ("::1", True), ("10.1.2.3", True), ("localhost", True),
         ("app.localhost", True), ("specdec-exporter", True), ("exp.ns.svc", True),
         ("exp.ns.svc.cluster.local", True), ("bench.example.org", True),
         ("a.corp.io", True), ("corp.io", False), ("evil.example", False),
         ("exp.svc.evil.com", False), ("", False)],
    )
    def test_host_allowed(self, name, allowed):
        assert host_allowed(name, frozenset({"bench.example.org", "*.corp.io"})) is allowed


class TestRefused:
    @pytest.mark.parametrize(
        ("headers", "data", "status", "needle"),
        [
            # What an HTML form or a no-cors fetch sends.
            ({"Content-Type": "application/x-www-form-urlencoded"}, b"id=x", 415,
             "Content-Type must be application/json"),
            ({"Content-Type": "text/plain"}, b'{"id": "x"}', 415, "not text/plain"),
            ({"Content-Type": "multipart/form-data; boundary=b"}, b"--b--", 415, "multipart"),
            ({}, b'{"id": "x"}', 415, "not application/octet-stream"),
            # A cross-site page with a JSON body (no preflight would allow it, but still).
            ({"Content-Type": "application/json", "Origin": "http://evil.example"},
             b'{"id": "x"}', 403, 'Origin "http://evil.example" is not this exporter'),
            ({"Content-Type": "application/json", "Origin": "null"}, b'{"id": "x"}', 403,
             "Origin"),
            # DNS rebinding: same-origin in the browser's eyes, but the Host is the attacker's.
            ({"Content-Type": "application/json", "Host": "rebind.evil.example:9400",
              "Origin": "http://rebind.evil.example:9400"}, b'{"id": "x"}', 403,
             'Host "rebind.evil.example:9400" is not one of ours'),
        ],
        ids=["form", "text-plain", "multipart", "octet-stream", "origin", "origin-null",
             "rebinding"],
    )
    @pytest.mark.parametrize("path", ["/api/v1/windows", "/-/reload"])
    async def test_browser_shaped_posts_are_refused(self, exp, headers, data, status, needle,
                                                    path):
        response = await exp.client.post(path, data=data, headers=headers)
        assert response.status == status, await response.text()
        assert needle in (await response.json())["error"]
        assert await _windows(exp) == []

    async def test_a_bodyless_cross_site_stop_is_refused_and_the_window_stays_open(self, exp):
        await exp.start(id="w1")
        response = await exp.client.post("/api/v1/windows/w1/stop",
                                         headers={"Origin": "https://evil.example"})
        assert response.status == 403
        assert (await _windows(exp))[0]["state"] == "open"

    async def test_gets_are_not_affected(self, exp):
        response = await exp.client.get("/api/v1/windows",
                                        headers={"Host": "rebind.evil.example",
                                                 "Origin": "http://evil.example"})
        assert response.status == 200


class TestAccepted:
    @pytest.mark.parametrize(
        "headers",
        [
            {"Content-Type": "application/json"},
            {"Content-Type": "application/json; charset=utf-8"},
            {"Content-Type": "application/json", "Host": "bench.example.org:9400"},
            {"Content-Type": "application/json", "Host": "x.corp.io"},
            {"Content-Type": "application/json", "Host": "exp.monitoring.svc:9400"},
        ],
    )
    async def test_clients_that_are_clients(self, exp, headers):
        response = await exp.client.post("/api/v1/windows", data=b'{"id": "w"}',
                                         headers=headers)
        assert response.status == 201, await response.text()

    async def test_same_origin_page(self, exp):
        host = f"{exp.client.host}:{exp.client.port}"
        response = await exp.client.post(
            "/api/v1/windows", json={"id": "w"}, headers={"Origin": f"http://{host}"})
        assert response.status == 201, await response.text()

    async def test_bodyless_stop_without_content_type(self, exp):
        await exp.start(id="w1")
        response = await exp.client.post("/api/v1/windows/w1/stop")
        assert response.status == 200

    @pytest.mark.e2e
    def test_the_cli_client_starts_and_stops(self, tmp_path):
        port = free_port()
        base = f"http://localhost:{port}"  # a name, not an IP: the Host check applies
        with fake_vllm("--k", "3") as vllm_port, process(CLI + [
                "serve", "--config", str(write_config(tmp_path / "c.yaml", port, [
                    {"name": "a", "url": f"http://127.0.0.1:{vllm_port}/metrics"}]))]):
            wait_http(f"http://127.0.0.1:{port}/-/healthy")
            import subprocess

            started = subprocess.run(CLI + ["window", "start", "--exporter", base, "--id", "c1"],
                                     capture_output=True, text=True, timeout=60)
            assert started.returncode == 0, started.stderr
            fake_add(vllm_port, 10, 30, [8, 6, 4])
            stopped = subprocess.run(CLI + ["window", "stop", "--exporter", base, "c1"],
                                     capture_output=True, text=True, timeout=60)
            assert stopped.returncode == 0, stopped.stderr
            assert "Speculative Decoding Metrics" in stopped.stdout


class TestEmptyForm:
    async def test_an_empty_form_post_is_refused(self, exp):
        await exp.start(id="w1")
        response = await exp.client.post(
            "/api/v1/windows/w1/stop",
            headers={"Content-Type": "application/x-www-form-urlencoded", "Content-Length": "0"})
        assert response.status == 415
        assert (await _windows(exp))[0]["state"] == "open"
