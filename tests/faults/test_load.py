"""200 clients on /metrics and the API while 200 targets are scraped every second.

`LOAD_SECONDS` sets the length (default 10 s in the default run; 30 s is the full one).
Only outcomes are asserted (every request answered, every target up, windows consistent):
loop lag, RSS and scrape counts depend on the machine, so they are printed as figures here
and measured against baselines in `bench/`, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from exporter.config.model import validate_config
from exporter.web.app import make_app
from exporter.web.handlers import SERVICE
from faults.checks import samples, value
from faults.servers import Counters, RawTarget

pytestmark = pytest.mark.e2e

TARGETS = 200
CLIENTS = int(os.environ.get("LOAD_CLIENTS", "200"))
SECONDS = float(os.environ.get("LOAD_SECONDS", "10"))


class GrowingTarget(RawTarget):
    """Every scrape finds more drafts: traffic that never stops, never resets."""

    async def _mode_ok(self, writer, path):
        self.counters.add(1, 3, [1, 1, 0])
        await super()._mode_ok(writer, path)


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def probe_lag(stop: asyncio.Event, lags: list[float], tick: float = 0.01) -> None:
    """How late the loop wakes a task that asked to sleep `tick`: the loop's lag."""
    while not stop.is_set():
        started = time.monotonic()
        await asyncio.sleep(tick)
        lags.append(time.monotonic() - started - tick)


class TestLoad:
    async def test_200_clients_200_targets(self, aiohttp_server, tmp_path, record_property):
        targets = [await GrowingTarget(Counters(k=3)).start() for _ in range(TARGETS)]
        config = validate_config({
            "scrape_interval": "1s", "scrape_timeout": "1s", "output_dir": str(tmp_path / "out"),
            "max_open_windows": 1000,
            "targets": [{"name": f"t{n}", "url": t.url, "labels": {"shard": str(n % 7)}}
                        for n, t in enumerate(targets)],
        })
        app = make_app(config, scrape_loop=True)
        server = await aiohttp_server(app)
        service = app[SERVICE]
        base = f"http://127.0.0.1:{server.port}"
        while not service.view().ready:
            await asyncio.sleep(0.05)
        await asyncio.sleep(2)  # a few rounds: steady state before measuring memory
        rss_before = rss_kib()
        errors_before = {n: s.errors_total for n, s in service.view().targets.items()}
        stop, lags = asyncio.Event(), []
        probe = asyncio.create_task(probe_lag(stop, lags))
        rounds_before = sum(t.requests for t in targets)
        load = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).with_name("loadclient.py")), base, str(SECONDS),
            str(CLIENTS), str(TARGETS), stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(load.communicate(), SECONDS + 90)
        stop.set()
        await probe
        rss_after = rss_kib()
        stats = json.loads(out)
        lags.sort()
        figures = {
            "seconds": SECONDS, "requests": stats["requests"], "windows": stats["windows"],
            "na_timeouts": stats["na_timeouts"],
            "client_p50_s": round(stats["p50"], 3), "client_p99_s": round(stats["p99"], 3),
            "loop_lag_p50_ms": round(1000 * lags[len(lags) // 2], 1),
            "loop_lag_p99_ms": round(1000 * lags[int(len(lags) * 0.99)], 1),
            "loop_lag_max_ms": round(1000 * lags[-1], 1),
            "rss_before_mib": round(rss_before / 1024, 1),
            "rss_after_mib": round(rss_after / 1024, 1),
            "target_scrapes": sum(t.requests for t in targets) - rounds_before,
        }

        print(f"\nload figures: {json.dumps(figures)}")
        assert stats["error_count"] == 0, stats["errors"]
        assert stats["windows"] + stats["na_timeouts"] > 0 and stats["requests"] > 0
        assert figures["target_scrapes"] > 0
        # Once the load is gone, every target is up again within a few rounds (a scrape that
        # missed its timeout under load is an honest up=0 until the next round).
        client = await server_client(base)
        for _ in range(20):
            found = samples(await (await client.get("/metrics")).text())
            if all(value(found, "specdec_target_up", target=f"t{n}") == 1
                   for n in range(TARGETS)):
                break
            await asyncio.sleep(0.5)
        failed = {n: (s.errors_total - errors_before[n], s.last_error)
                  for n, s in service.view().targets.items() if s.errors_total != errors_before[n]}
        figures["scrape_errors"] = sum(f[0] for f in failed.values())
        print(f"load scrape errors: {figures['scrape_errors']} {list(failed.items())[:3]}")
        for n in range(TARGETS):
            assert value(found, "specdec_target_up", target=f"t{n}") == 1
        assert value(found, "specdec_windows_open") == 0
        record_property("load", figures)
        for target in targets:
            await target.stop()


async def server_client(base: str):
    import aiohttp

    class _Once:
        async def get(self, path):
            async with aiohttp.ClientSession() as session:
                async with session.get(base + path) as response:
                    body = await response.read()

            class _R:
                async def text(self):
                    return body.decode()

            return _R()

    return _Once()
