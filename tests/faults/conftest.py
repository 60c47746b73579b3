"""The fault cases' shared fixtures: a raw /metrics target, and an exporter over it alone."""

from __future__ import annotations

import pytest

from faults.servers import Counters, RawTarget


@pytest.fixture
async def target():
    server = await RawTarget(Counters(k=2)).start()
    yield server
    await server.stop()


@pytest.fixture
async def exp(exporter, target):
    return await exporter({"targets": [{"name": "a", "url": target.url}]})
