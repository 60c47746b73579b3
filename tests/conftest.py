"""Shared fixtures: real fake-vLLM servers on loopback and a real exporter app over them."""

from __future__ import annotations

import functools
import os
import random
import shutil
import socket
from dataclasses import dataclass

import pytest
from aiohttp.test_utils import TestClient, TestServer

from exporter.config.model import validate_config
from exporter.fakevllm import FakeServer, NameFilter, make_fake_app
from exporter.server.service import ExporterService
from exporter.web.app import make_app
from exporter.web.handlers import SERVICE


class Clock:
    """A settable clock for the exporter: rounds happen when the test says, at the time it says."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


_HANDED_OUT: set[int] = set()


@functools.cache
def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, for a server started next. It lies below the kernel's
    ephemeral range: a port from inside it can be handed, between this call and the server's
    bind, to any process's outgoing connection as its local port."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10000, low) if low > 11000 else 0
        if port in _HANDED_OUT:  # two calls before either server binds must not agree
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = sock.getsockname()[1]
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "may_skip_in_ci(reason): this test's skip is expected in CI too; the reason says why",
    )


def pytest_collection_modifyitems(config, items):
    """The 10-minute soak runs only when `-m` names it: any other -m, or none, leaves it out."""
    if "soak" in (config.option.markexpr or ""):
        return
    soak = [item for item in items if item.get_closest_marker("soak") is not None]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if item.get_closest_marker("soak") is None]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skip is a failure, unless the test is marked `may_skip_in_ci(why)`.

    A tool the suite needs and CI forgot to install would otherwise pass as a quiet "s".
    """
    outcome = yield
    report = outcome.get_result()
    if (
        os.environ.get("CI") == "true"
        and report.skipped
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("may_skip_in_ci") is None
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI=true (install what it needs in scripts/test.sh): {reason}"
        )


@dataclass
class FakeTarget:
    """A fake vLLM server running on a loopback port, with its counters at hand."""

    server: FakeServer
    http: TestServer

    @property
    def url(self) -> str:
        return str(self.http.make_url("/metrics"))

    @property
    def host_port(self) -> str:
        return f"{self.http.host}:{self.http.port}"

    async def stop(self) -> None:
        await self.http.close()


@pytest.fixture
def fake_vllm(aiohttp_server):
    """Factory: `await fake_vllm(k=3, engines=2)` -> a running FakeTarget, no traffic of its own
    (`name_filter=NameFilter.EMPTY` or `IGNORE` for a server that does not honour `name[]`)."""

    async def make(name_filter: NameFilter = NameFilter.HONOUR, **kwargs) -> FakeTarget:
        server = FakeServer(**kwargs)
        http = await aiohttp_server(make_fake_app(server, name_filter=name_filter))
        return FakeTarget(server, http)

    return make


@dataclass
class ExporterUnderTest:
    """A real exporter app on a real port; tests trigger scrape rounds instead of sleeping."""

    client: TestClient
    service: ExporterService

    async def round(self) -> None:
        await self.service.scheduler.round()

    async def start(self, **body) -> dict:
        """POST a window start; its answer (201 or 200)."""
        response = await self.client.post("/api/v1/windows", json=body)
        assert response.status in (200, 201), await response.text()
        return await response.json()

    async def stop(self, window_id: str) -> dict:
        """POST a window stop; its answer."""
        response = await self.client.post(f"/api/v1/windows/{window_id}/stop")
        assert response.status == 200, await response.text()
        return await response.json()


@pytest.fixture
def exporter(aiohttp_client, tmp_path, monkeypatch):
    """Factory: `await exporter({"targets": [...]})` -> ExporterUnderTest, scrape loop off."""
    # A reloaded config without output_dir means ./outputs, where the state database then
    # moves: inside this test's directory, never the repository.
    monkeypatch.chdir(tmp_path)

    async def make(config: dict, *, config_path=None, clock=None,
                   state_connect=None) -> ExporterUnderTest:
        data = {"output_dir": str(tmp_path / "out")} | config
        kwargs = {"config_path": config_path, "scrape_loop": False}
        if clock is not None:
            kwargs["clock"] = clock
        if state_connect is not None:
            kwargs["state_connect"] = state_connect
        app = make_app(validate_config(data), **kwargs)
        client = await aiohttp_client(app)
        return ExporterUnderTest(client, app[SERVICE])

    return make


def tool(name: str, install: str = "apt-get install prometheus") -> str:
    """Path of a program a test needs: a skip saying how to install it when absent, a failure
    under CI=true (scripts/test.sh installs every one)."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} missing in CI: scripts/test.sh installs it ({install})")
        pytest.skip(f"{name} not installed ({install})")
    return path


@pytest.fixture
def promtool() -> str:
    """Path of promtool (Debian's prometheus package)."""
    return tool("promtool")


@pytest.fixture
def prometheus() -> str:
    """Path of the prometheus server binary (Debian's prometheus package)."""
    return tool("prometheus")


@pytest.fixture
def unused_tcp_port():
    """A loopback port that refuses connections for the whole test.

    The socket stays bound (not listening), so a server a test starts later cannot be given
    the same port by the OS, which would turn a "down" target into a live one.
    """
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()
