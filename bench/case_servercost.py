"""Case: what one scrape costs the inference server (issue 45 part 2): the server process's
CPU per scrape above its idle baseline, our scraper (the filtered read, once proven; and the
full page, `name_filter: false`) against a default Prometheus scrape of the same server.

The server is a real vLLM (the tiny model of tests/realvllm/servers.py, n-gram speculation)
where its virtualenv is there (`.vllm-venv`, or `$VLLM_VENV`), else `specdec-exporter fake-vllm`
(say so: its costs are aiohttp's and the simulator's, not vLLM's). Spans alternate (idle,
GET /health, ours filtered, ours full, Prometheus) `rotations` times, each `seconds` long at
`rate` requests a second; CPU is the server process's threads' run time from
/proc/<pid>/task/*/schedstat; figures are medians.

`python -m bench.case_servercost [--seconds 15] [--rotations 3] [--rate 10]`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from bench.common import (
    CaseResult,
    Child,
    Row,
    Skip,
    free_port,
    http_status,
    ratio,
    wait_until,
)
from bench.procs import find_prometheus
from exporter.config.model import validate_config
from exporter.scrape.scraper import Scraper, make_session

RATIO_GOAL = 0.3  # server CPU per scrape, ours / a default Prometheus scrape's (issue 45)
_INTERVAL_COUNT = re.compile(
    r'^prometheus_target_interval_length_seconds_count\{interval="[^"]+"\} (\S+)$', re.M)


@contextlib.contextmanager
def _server(workdir: Path, real: bool) -> Iterator[tuple[str, int, str]]:
    """(kind, pid of the process that serves /metrics, base URL) of a running server: a real
    vLLM if `real` and it can run here, else fake-vllm."""
    try:
        from tests.realvllm import servers  # the real-vLLM launcher (the vllm branch's)
    except ImportError:
        servers = None
    if real and servers is not None and servers.unavailable() is None:
        model = servers.make_model()
        real = servers.RealVllm(model, free_port(), servers.ngram(3))
        try:
            real.start().wait_ready()
            assert real.proc is not None
            yield "vllm", real.proc.pid, real.base_url
        finally:
            real.stop()
        return
    port = free_port()
    child = Child([sys.executable, "-m", "exporter", "fake-vllm", "--port", str(port),
                   "--drafts-per-second", "0"], workdir / "fake-vllm.log")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_status(base + "/health") == 200, 30, "fake-vllm", child.proc)
        yield "fake-vllm", child.pid, base
    finally:
        child.stop()


class _Prometheus:
    """A default Prometheus (no relabelling, its own Accept headers) scraping one target."""

    def __init__(self, base: str, workdir: Path, interval: float):
        binary = find_prometheus()
        if binary is None:
            raise Skip("prometheus not found: apt-get install -y prometheus")
        self.port = free_port()
        target = base.removeprefix("http://")
        config = {"global": {"scrape_interval": f"{interval * 1000:g}ms",
                             "scrape_timeout": f"{interval * 1000:g}ms"},
                  "scrape_configs": [{"job_name": "server",
                                      "static_configs": [{"targets": [target]}]}]}
        path = workdir / "prometheus.yml"
        path.write_text(json.dumps(config))
        self.child = Child([binary, f"--config.file={path}",
                            f"--storage.tsdb.path={workdir / 'tsdb'}",
                            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                           workdir / "prometheus.log")
        wait_until(lambda: self.scrapes() >= 2, 60, "prometheus first scrapes", self.child.proc)
        self.pause()
        time.sleep(0.2)  # a scrape in flight at the pause lands before the count
        self.seen = self.counted()

    def counted(self) -> float:
        """`scrapes()` of a paused Prometheus (resumed for the question only)."""
        self.resume()
        try:
            return self.scrapes()
        finally:
            self.pause()

    def scrapes(self) -> float:
        """Scrapes of the target so far, by Prometheus's own count."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                        timeout=5) as answer:
                text = answer.read().decode()
        except OSError:
            return 0.0
        return sum(float(v) for v in _INTERVAL_COUNT.findall(text))

    def pause(self) -> None:
        """SIGSTOP: no scrape until resumed."""
        os.kill(self.child.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        os.kill(self.child.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Resumed (to act on SIGTERM), then stopped."""
        with contextlib.suppress(OSError):
            self.resume()
        self.child.stop()


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process's live threads in nanoseconds' resolution (schedstat), where
    /proc/<pid>/stat counts in 10 ms ticks: a scrape costs a few ms."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def _scraper_span(url: str, name_filter: bool, rate: float, seconds: float, pid: int) -> dict:
    """Our scraper at `rate` a second for `seconds` (after two scrapes that prove the filter):
    the server's CPU seconds and the scrapes made."""
    target = validate_config({"targets": [{"name": "s", "url": url,
                                           "name_filter": name_filter}]}).targets[0]

    async def go() -> dict:
        session = make_session(2)
        scraper = Scraper(session, max_bytes=64 * 1024 * 1024, concurrency=2)
        try:
            for _ in range(2):
                await scraper.scrape(target, 10)
            read = ""
            count, cpu0, start = 0, cpu_seconds(pid), time.monotonic()
            while time.monotonic() - start < seconds:
                result = await scraper.scrape(target, 10)
                if result.snapshot is None:
                    raise RuntimeError(f"scrape failed: {result.error}")
                read = result.snapshot.read
                count += 1
                await asyncio.sleep(max(0.0, start + count / rate - time.monotonic()))
            elapsed = time.monotonic() - start
            return {"cpu_s": cpu_seconds(pid) - cpu0, "seconds": elapsed, "scrapes": count,
                    "read": read, "page_bytes": result.size}
        finally:
            await scraper.close()
            await session.close()

    return asyncio.run(go())


def _health_span(base: str, rate: float, seconds: float, pid: int) -> dict:
    """GET /health at `rate` (vLLM's liveness probe, an empty answer): the HTTP floor."""

    async def go() -> dict:
        async with aiohttp.ClientSession() as session:
            count, cpu0, start = 0, cpu_seconds(pid), time.monotonic()
            while time.monotonic() - start < seconds:
                async with session.get(base + "/health") as answer:
                    await answer.read()
                count += 1
                await asyncio.sleep(max(0.0, start + count / rate - time.monotonic()))
            return {"cpu_s": cpu_seconds(pid) - cpu0, "seconds": time.monotonic() - start,
                    "scrapes": count}

    return asyncio.run(go())


def _idle_span(pid: int, seconds: float) -> dict:
    cpu0, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return {"cpu_s": cpu_seconds(pid) - cpu0, "seconds": time.monotonic() - start, "scrapes": 0}


def _prometheus_span(prom: _Prometheus, pid: int, seconds: float) -> dict:
    """Prometheus resumed for `seconds`: the server's CPU seconds and the scrapes it made."""
    before = prom.seen
    prom.resume()
    cpu0, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    prom.pause()
    time.sleep(0.2)  # a scrape in flight at the pause is answered (and counted) in the span
    cpu, elapsed = cpu_seconds(pid) - cpu0, time.monotonic() - start
    prom.seen = prom.counted()
    return {"cpu_s": cpu, "seconds": elapsed, "scrapes": prom.seen - before}


def run(*, seconds: float = 15.0, rotations: int = 3, rate: float = 10.0,
        real: bool = True) -> CaseResult:
    """Per contender, the server's CPU ms per scrape above idle (medians over rotations)."""
    result = CaseResult("servercost")
    workdir = Path(tempfile.mkdtemp(prefix="bench-servercost-"))
    spans: dict[str, list[dict]] = {"idle": [], "health": [], "ours-filtered": [],
                                    "ours-full": [], "prometheus": []}
    try:
        with _server(workdir, real) as (kind, pid, base):
            prom = _Prometheus(base, workdir, 1 / rate)
            try:
                for _ in range(rotations):
                    spans["idle"].append(_idle_span(pid, seconds))
                    spans["health"].append(_health_span(base, rate, seconds, pid))
                    spans["ours-filtered"].append(
                        _scraper_span(base + "/metrics", True, rate, seconds, pid))
                    spans["ours-full"].append(
                        _scraper_span(base + "/metrics", False, rate, seconds, pid))
                    spans["prometheus"].append(_prometheus_span(prom, pid, seconds))
            finally:
                prom.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    idle = statistics.median(s["cpu_s"] / s["seconds"] for s in spans["idle"])
    per_scrape = {
        name: statistics.median(1000 * (s["cpu_s"] - idle * s["seconds"]) / s["scrapes"]
                                for s in runs)
        for name, runs in spans.items() if name != "idle"
    }
    result.data = {"server": kind, "rate_per_s": rate, "seconds": seconds,
                   "rotations": rotations, "idle_core_pct": 100 * idle, "spans": spans,
                   "cpu_ms_per_scrape": per_scrape,
                   "reads": sorted({s["read"] for s in spans["ours-filtered"]})}
    prom_ms = per_scrape["prometheus"]
    to_prom = ratio(per_scrape["ours-filtered"], prom_ms)
    result.rows = [
        Row("servercost", f"{kind} server CPU ms per scrape, ours (read "
            f"{'/'.join(result.data['reads'])})", per_scrape["ours-filtered"], "ms", prom_ms,
            "a default Prometheus scrape", to_prom, f"<= {RATIO_GOAL:g}x",
            None if to_prom is None else to_prom <= RATIO_GOAL),
        Row("servercost", f"{kind} server CPU ms per scrape, ours with name_filter off",
            per_scrape["ours-full"], "ms", prom_ms, "a default Prometheus scrape",
            ratio(per_scrape["ours-full"], prom_ms)),
        Row("servercost", f"{kind} server CPU ms per scrape, ours over GET /health (the floor)",
            per_scrape["ours-filtered"], "ms", per_scrape["health"], "GET /health",
            ratio(per_scrape["ours-filtered"], per_scrape["health"])),
    ]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rotations", type=int, default=3)
    parser.add_argument("--rate", type=float, default=10.0)
    args = parser.parse_args()
    out = run(seconds=args.seconds, rotations=args.rotations, rate=args.rate)
    print(json.dumps(out.to_dict(), indent=1))


if __name__ == "__main__":
    main()
