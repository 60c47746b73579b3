"""Case 4: rendering our /metrics over N targets x 8 positions, and event-loop lag meanwhile."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from bench.common import CaseResult, Row, percentile, ratio, time_call
from bench.fleet import NginxFleet
from exporter.api import SERVICE, WRITER
from exporter.app import make_app
from exporter.config import validate_config
from exporter.exposition import MetricsWriter

RENDER_TARGET_S = 0.020  # issue 15
LAG_TARGET_S = 0.050  # issue 15
PROBE_SLEEP_S = 0.010


def samples_in(body: bytes) -> int:
    """Sample lines of an exposition."""
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def plain_gauge_registry(samples: int, per_target: int = 8) -> CollectorRegistry:
    """prometheus_client's own way: one Gauge with (target, position) labels, `samples` children."""
    registry = CollectorRegistry(auto_describe=False)
    gauge = Gauge("bench_gauge", "Baseline gauge.", ["target", "position"], registry=registry)
    for i in range(samples):
        gauge.labels(f"t{i // per_target}", str(i % per_target)).set(i * 0.5)
    return registry


async def _lag_probe(stop: asyncio.Event, lags: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        started = loop.time()
        await asyncio.sleep(PROBE_SLEEP_S)
        lags.append(max(0.0, loop.time() - started - PROBE_SLEEP_S))


async def _measure(fleet: NginxFleet, n: int, workdir: Path, *, repeats: int,
                   lag_seconds: float, interval: float) -> dict:
    config = validate_config({
        "listen": "127.0.0.1:9400",  # not bound: the app is driven in-process
        "scrape_interval": f"{interval:g}s",
        "scrape_timeout": f"{min(3.0, interval):g}s",
        "output_dir": str(workdir / "outputs"),
        "targets": [{"name": f"t{i}", "url": url} for i, url in enumerate(fleet.urls(n))],
    })
    app = make_app(config, scrape_loop=False)
    runner = web.AppRunner(app)
    await runner.setup()  # runs the cleanup context: the scraper's session
    try:
        service, writer = app[SERVICE], app[WRITER]
        started = time.perf_counter()
        await service.scrape_round()
        first_round = time.perf_counter() - started
        fleet.advance()  # counters grow, so the live ratio gauges exist
        await service.scrape_round()
        body = writer.render()
        samples = samples_in(body)
        # Cold: a fresh writer, as right after a scrape round replaced every target's state.
        render_s = time_call(lambda: MetricsWriter(service.view, process_metrics=False).render(),
                             repeats=repeats, min_seconds=0.0)
        # Warm: nothing scraped since the last render (a second Prometheus, an HA pair).
        warm_s = time_call(writer.render, repeats=repeats, min_seconds=0.0)
        base_registry = plain_gauge_registry(samples)
        base_s = time_call(lambda: generate_latest(base_registry), repeats=repeats,
                           min_seconds=0.0)

        # Loop lag: first the scrape loop alone, then with Prometheus rendering us every second.
        lags: list[float] = []
        stop = asyncio.Event()
        probe = asyncio.create_task(_lag_probe(stop, lags))
        loop_task = asyncio.create_task(service.run())
        await asyncio.sleep(lag_seconds / 2)
        scrape_only = list(lags)
        renders: list[float] = []
        deadline = time.monotonic() + lag_seconds / 2
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            # Off the loop: the page writing is the bench's work, not the exporter's stall.
            await asyncio.to_thread(fleet.advance, 20)
            t0 = time.perf_counter()
            writer.render()
            renders.append(time.perf_counter() - t0)
        stop.set()
        await probe
        with_renders = lags[len(scrape_only):]
        loop_task.cancel()
        try:
            await loop_task
        except asyncio.CancelledError:
            pass
        return {
            "targets": n,
            "samples": samples,
            "bytes": len(body),
            "first_round_s": first_round,
            "render_median_s": render_s,
            "render_warm_median_s": warm_s,
            "baseline_render_median_s": base_s,
            "lag_seconds": lag_seconds,
            "lag_scrape_only": _lag_stats(scrape_only),
            "lag_with_renders": _lag_stats(with_renders),
            "lag_max_s": max(lags, default=0.0),
            "lag_p99_s": percentile(lags, 99),
            "renders_during_lag_s": renders,
        }
    finally:
        await runner.cleanup()


def _lag_stats(lags: list[float]) -> dict:
    return {
        "probes": len(lags),
        "max_s": max(lags, default=0.0),
        "p99_s": percentile(lags, 99),
        "median_s": statistics.median(lags) if lags else 0.0,
    }


def run(fleet: NginxFleet, *, n: int = 1000, repeats: int = 7, lag_seconds: float = 12.0,
        interval: float = 5.0) -> CaseResult:
    """Build the state from real scrapes of the fleet, then time renders and loop lag."""
    result = CaseResult("exposition")
    workdir = Path(tempfile.mkdtemp(prefix="bench-exposition-"))
    try:
        d = asyncio.run(_measure(fleet, n, workdir, repeats=repeats, lag_seconds=lag_seconds,
                                 interval=interval))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result.data = d
    render, base = d["render_median_s"], d["baseline_render_median_s"]
    name = "prometheus_client Gauge"
    result.rows = [
        Row("exposition", f"render /metrics, {n} targets x 8 positions ({d['samples']} samples)",
            render * 1e3, "ms", base * 1e3, name, ratio(render, base),
            f"< {RENDER_TARGET_S * 1e3:g} ms", render < RENDER_TARGET_S),
        Row("exposition", "render /metrics again, nothing scraped since (cached lines)",
            d["render_warm_median_s"] * 1e3, "ms", base * 1e3, name,
            ratio(d["render_warm_median_s"], base)),
        Row("exposition", f"loop lag max, scrape loop alone ({n} targets)",
            d["lag_scrape_only"]["max_s"] * 1e3, "ms", None, "", None,
            f"< {LAG_TARGET_S * 1e3:g} ms", d["lag_scrape_only"]["max_s"] < LAG_TARGET_S),
        Row("exposition", "loop lag p99, scrape loop alone", d["lag_scrape_only"]["p99_s"] * 1e3,
            "ms"),
        Row("exposition", "loop lag max, scrape loop + /metrics render every 1 s",
            d["lag_with_renders"]["max_s"] * 1e3, "ms", None, "", None,
            f"< {LAG_TARGET_S * 1e3:g} ms", d["lag_with_renders"]["max_s"] < LAG_TARGET_S),
        Row("exposition", "loop lag p99, scrape loop + renders",
            d["lag_with_renders"]["p99_s"] * 1e3, "ms"),
    ]
    return result
