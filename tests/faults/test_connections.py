"""Slowloris and too many sockets; the API and /metrics keep answering."""

from __future__ import annotations

import asyncio
import resource
import socket
import time

import pytest
from clitools import CLI, free_port, http, process, wait_http, write_config

FD_LIMIT = 256  # the exporter's whole file descriptor budget in these tests
ATTACKERS = 400  # more sockets than it has descriptors


def _lowered(soft: int, hard: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return limit


def _partial_heads(port: int, count: int) -> list[socket.socket]:
    """`count` connections that each send half a request head and then nothing."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(sock)
    return socks


def _closed_by_server(socks: list[socket.socket]) -> int:
    closed = 0
    for sock in socks:
        sock.settimeout(0.01)
        try:
            while sock.recv(65536):  # an answer sent before the close is read past
                pass
            closed += 1
        except (ConnectionResetError, BrokenPipeError):
            closed += 1
        except (TimeoutError, BlockingIOError):
            pass
    return closed


def _serve(tmp_path, port: int, soft: int, hard: int, **config):
    path = write_config(tmp_path / "c.yaml", port, [
        {"name": "a", "url": f"http://127.0.0.1:{free_port()}/metrics"}], **config)
    return process(CLI + ["serve", "--config", str(path)], preexec_fn=_lowered(soft, hard))


@pytest.mark.e2e
class TestFdLimit:
    def test_soft_limit_is_raised_to_the_hard_one(self, tmp_path):
        port = free_port()
        with _serve(tmp_path, port, FD_LIMIT, 1024) as proc:
            wait_http(f"http://127.0.0.1:{port}/-/healthy")
            with open(f"/proc/{proc.pid}/limits") as file:
                limits = file.read()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert line.split()[3:5] == ["1024", "1024"], line


@pytest.mark.e2e
class TestSlowloris:
    def test_api_and_metrics_answer_while_more_sockets_than_fds_hang(self, tmp_path):
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        with _serve(tmp_path, port, FD_LIMIT, FD_LIMIT, header_timeout="60s") as proc:
            wait_http(base + "/-/healthy")
            socks = _partial_heads(port, ATTACKERS)
            try:
                # Every attacker socket is held open by the client side; the exporter cuts the
                # oldest waiting ones to stay under its descriptors and keeps serving.
                for round_ in range(3):
                    status, text = http("GET", base + "/metrics")
                    assert status == 200 and "specdec_target_up" in text
                    status, body = http("POST", base + "/api/v1/windows", {"id": f"w{round_}"})
                    assert status == 201, body
                    status, body = http("POST", base + f"/api/v1/windows/w{round_}/stop", {})
                    assert status == 200, body
                    assert http("GET", base + "/api/v1/targets")[0] == 200
                    socks += _partial_heads(port, 50)
                closed = _closed_by_server(socks)
                assert closed >= len(socks) - FD_LIMIT, (closed, len(socks))
            finally:
                for sock in socks:
                    sock.close()
            assert proc.poll() is None

    def test_a_head_not_complete_in_header_timeout_is_cut(self, tmp_path):
        port = free_port()
        with _serve(tmp_path, port, 1024, 1024, header_timeout="1s"):
            wait_http(f"http://127.0.0.1:{port}/-/healthy")
            slow = _partial_heads(port, 5)
            trickle = socket.create_connection(("127.0.0.1", port), timeout=5)
            trickle.sendall(b"GET /metrics HTTP/1.1\r\n")
            kept = socket.create_connection(("127.0.0.1", port), timeout=5)
            kept.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
            assert kept.recv(100).startswith(b"HTTP/1.1 200")
            kept.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: ")  # the next head, never ended
            deadline = time.monotonic() + 15  # bounded wait; the cut is what is asserted
            trickle_cut = False
            while time.monotonic() < deadline and not trickle_cut:
                try:  # one header line every 0.2 s keeps it busy, never complete
                    trickle.sendall(b"X: y\r\n")
                except OSError:
                    trickle_cut = True
                time.sleep(0.2)
            assert trickle_cut
            assert _closed_by_server(slow) == 5
            assert _closed_by_server([kept]) == 1  # kept alive, then slow: cut too
            for sock in slow + [trickle, kept]:
                sock.close()


class TestGuardUnit:
    async def test_at_the_cap_the_oldest_waiting_connection_makes_room(self):
        from aiohttp import web

        from exporter.web.guard import GuardedSite

        async def hello(request):
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        site = GuardedSite(runner, "127.0.0.1", 0, header_timeout=30, max_connections=4)
        await site.start()
        port = runner.addresses[0][1]
        try:
            waiting = []
            for _ in range(10):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET / HTTP/1.1\r\n")
                waiting.append((reader, writer))
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 5)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
            writer.close()
            assert len(site.guard.open) <= 4
            ends = [await asyncio.wait_for(r.read(), 5) for r, _ in waiting[:7]]
            assert ends == [b""] * 7  # the oldest ones were cut without an answer
            for _, w in waiting:
                w.close()
        finally:
            await runner.cleanup()
