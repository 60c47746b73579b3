"""The web tests' shared fixture: an exporter whose target has a recording proxy port."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from conftest import ExporterUnderTest, free_port


@pytest.fixture
def proxied(exporter: Any, aiohttp_server: Any) -> Any:
    """Factory: `await proxied(app)` -> (exporter, port): `app` (a fake-vllm's) served on
    loopback as target `v`, whose proxy port is `port`, with one round scraped."""

    async def make(app: web.Application) -> tuple[ExporterUnderTest, int]:
        upstream = await aiohttp_server(app)
        port = free_port()
        under = await exporter({"targets": [{
            "name": "v", "url": str(upstream.make_url("/metrics")),
            "proxy": {"listen": f"127.0.0.1:{port}"}}]})
        await under.round()
        return under, port

    return make
