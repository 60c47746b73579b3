"""Case 3: latency of window start and stop over the fleet, against one plain concurrent round."""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.common import (
    CaseResult,
    Row,
    cpu_seconds,
    ratio,
    reaped_children_cpu_seconds,
    rss_mb,
)
from bench.fleet import NginxFleet
from bench.procs import ExporterProcess

# Stop latency targets (median seconds) by fleet size (issue 15: under 0.5 s at 1000).
STOP_TARGETS = {100: 0.5, 1000: 0.5}
RSS_GROWTH_LIMIT = 0.15  # RSS after the last stopped window vs before the first
# The exporter's live tracks grow until they span live_window (~5 MB at 1000 targets over the
# default 60 s, points packed), windows or not: RSS "before the first" is taken once they are
# full. A shorter
# live_window than the default keeps that warm-up short (and the baseline, if anything, lower).
LIVE_WINDOW = 20.0
CONCURRENCY = 64  # the exporter's default scrape_concurrency, for the baseline too


async def plain_round(session: aiohttp.ClientSession, urls: list[str]) -> float:
    """Seconds to fetch every URL once, concurrently, reading the whole (gzip) body."""

    async def fetch(url: str) -> int:
        async with session.get(url, headers={"Accept-Encoding": "gzip"}) as response:
            return len(await response.read())

    started = time.perf_counter()
    sizes = await asyncio.gather(*(fetch(u) for u in urls))
    assert all(sizes), "a fleet page came back empty"
    return time.perf_counter() - started


async def baseline(urls: list[str], repeats: int) -> float:
    """Median of `repeats` plain rounds on a warm session (what a stop must at least do)."""
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:
        await plain_round(session, urls)
        return statistics.median([await plain_round(session, urls) for _ in range(repeats)])


async def markers(base: str, fleet: NginxFleet, n: int, repeats: int, pid: int | None = None,
                  warmup: float = 0.0) -> dict:
    """Time start and stop of `repeats` windows over all targets; counters grow in between.

    With `pid`, the exporter's RSS before the first window (after `warmup` seconds of scrape
    rounds) and after each stop (memory flat across windows: a stopped window keeps no answer).
    """
    starts, stops, statuses, rss, stop_cpu = [], [], [], [], []
    if pid is not None:
        await asyncio.sleep(warmup)
        rss.append(rss_mb(pid))
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for r in range(repeats):
            window = f"bench-{n}-{r}-{time.time_ns()}"
            t0 = time.perf_counter()
            async with session.post(f"{base}/api/v1/windows", json={"id": window}) as response:
                await response.read()
                if response.status != 201:
                    raise RuntimeError(f"window start answered {response.status}")
            starts.append(time.perf_counter() - t0)
            fleet.advance()  # traffic flows during the window
            cpu0 = _server_cpu(pid)
            t0 = time.perf_counter()
            async with session.post(f"{base}/api/v1/windows/{window}/stop") as response:
                raw = await response.read()
            # The marker's latency is the last byte of its answer; parsing that JSON (~0.2 s
            # for 1000 targets' 5 MB) is the client's own cost.
            stops.append(time.perf_counter() - t0)
            cpu1 = _server_cpu(pid)
            if cpu0 is not None and cpu1 is not None:
                # The server's and its (waited-for) child's, the periodic loop's included.
                stop_cpu.append((cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]))
            body = json.loads(raw)
            if response.status != 200:
                raise RuntimeError(f"window stop answered {response.status}: {body}")
            statuses.append(sum(1 for res in body["results"].values() if res["status"] == "ok"))
            if pid is not None:
                rss.append(rss_mb(pid))
    return {
        "rss_mb": rss,
        "start_s": starts,
        "stop_s": stops,
        "stop_cpu_s": stop_cpu,  # (server, its child) per stop
        "start_median_s": statistics.median(starts),
        "stop_median_s": statistics.median(stops),
        "ok_results_per_stop": statuses,
    }


def _server_cpu(pid: int | None) -> tuple[float, float] | None:
    """CPU seconds of the exporter and of its children it has waited for (a stop's child)."""
    if pid is None:
        return None
    return cpu_seconds(pid), reaped_children_cpu_seconds(pid)


def run(fleet: NginxFleet, *, sizes=(100, 1000), repeats=None, interval: float = 5.0,
        live_window: float = LIVE_WINDOW) -> CaseResult:
    """For each N: a baseline round in-process, then the exporter's markers over HTTP."""
    repeats = repeats or {100: 5, 1000: 50}
    result = CaseResult("markers")
    workdir = Path(tempfile.mkdtemp(prefix="bench-markers-"))
    try:
        for n in sizes:
            reps = repeats.get(n, 3)
            urls = fleet.urls(n)
            base_s = asyncio.run(baseline(urls, reps))
            exporter = ExporterProcess(fleet, n, workdir / f"exporter-{n}", interval=interval,
                                       live_window=f"{live_window:g}s")
            try:
                figures = asyncio.run(markers(exporter.base, fleet, n, reps, exporter.pid,
                                              warmup=live_window + interval))
            finally:
                exporter.stop()
            figures |= {"baseline_round_s": base_s, "repeats": reps}
            result.data[str(n)] = figures
            limit = STOP_TARGETS.get(n)
            stop = figures["stop_median_s"]
            server_cpu = statistics.median([c[0] for c in figures["stop_cpu_s"]] or [0.0])
            child_cpu = statistics.median([c[1] for c in figures["stop_cpu_s"]] or [0.0])
            name = "plain aiohttp round"
            result.rows += [
                Row("markers", f"N={n}: POST /api/v1/windows median", figures["start_median_s"],
                    "s", base_s, name, ratio(figures["start_median_s"], base_s)),
                Row("markers", f"N={n}: POST /api/v1/windows/ID/stop median", stop, "s",
                    base_s, name, ratio(stop, base_s),
                    f"< {limit:g} s" if limit else "",
                    stop < limit if limit else None),
                Row("markers", f"N={n}: stop cost per target", stop / n * 1e3, "ms",
                    base_s / n * 1e3, "plain round per target", ratio(stop, base_s)),
                # A stop's answer is made by a child on the other core while the server
                # scrapes (`exporter/server/stop.py`): CPU beside the wall time it takes.
                Row("markers", f"N={n}: stop CPU of the server, median", server_cpu, "s",
                    stop, "the stop's wall time", ratio(server_cpu, stop)),
                Row("markers", f"N={n}: stop CPU of its child, median", child_cpu, "s",
                    stop, "the stop's wall time", ratio(child_cpu, stop)),
                Row("markers", f"N={n}: RSS after {reps} stopped windows", figures["rss_mb"][-1],
                    "MB", figures["rss_mb"][0], "RSS before the first, live tracks full",
                    ratio(figures["rss_mb"][-1], figures["rss_mb"][0]),
                    f"<= {1 + RSS_GROWTH_LIMIT:g}x",
                    figures["rss_mb"][-1] <= (1 + RSS_GROWTH_LIMIT) * figures["rss_mb"][0]),
                Row("markers", f"N={n}: ok results in each stop", min(figures[
                    "ok_results_per_stop"]), "targets", n, "targets", None, "= N",
                    min(figures["ok_results_per_stop"]) == n),
            ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return result
