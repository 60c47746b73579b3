"""`python -m bench.profile [N]`: cProfile the exporter in-process where the suite finds it slow.

Profiles, over an nginx fleet of N targets (default 1000): one scrape round, one window stop,
one /metrics render; and lists the event-loop callbacks that ran longer than 50 ms.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import logging
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

from bench.fleet import NginxFleet
from exporter.config.model import validate_config
from exporter.web.app import make_app
from exporter.web.handlers import SERVICE, WRITER

TOP = 18


def _report(title: str, profile: cProfile.Profile, seconds: float) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(TOP)
    print(f"\n===== {title}: {seconds:.3f}s wall =====")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])


async def _run(fleet: NginxFleet, n: int, workdir: Path) -> None:
    config = validate_config({
        "scrape_interval": "5s",
        "output_dir": str(workdir / "outputs"),
        "targets": [{"name": f"t{i}", "url": url} for i, url in enumerate(fleet.urls(n))],
    })
    app = make_app(config, scrape_loop=False)
    runner = web.AppRunner(app)
    await runner.setup()
    service, writer = app[SERVICE], app[WRITER]
    try:
        await service.scheduler.round()  # warm connections
        fleet.advance()
        for title, make in (
            ("scrape round", service.scheduler.round),
            ("window start", lambda: service.start_window("prof")),
        ):
            profile = cProfile.Profile()
            started = time.perf_counter()
            profile.enable()
            await make()
            profile.disable()
            _report(title, profile, time.perf_counter() - started)
        fleet.advance()
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        await service.stop_window("prof")
        profile.disable()
        _report("window stop", profile, time.perf_counter() - started)

        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        writer.render()
        profile.disable()
        _report("/metrics render", profile, time.perf_counter() - started)

        # Which single callbacks hold the loop: asyncio's debug mode logs those over 50 ms.
        loop = asyncio.get_running_loop()
        loop.slow_callback_duration = 0.05
        loop.set_debug(True)
        print("\n===== callbacks over 50 ms during one scrape round =====", flush=True)
        await service.scheduler.round()
        loop.set_debug(False)
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Start a fleet, profile, print."""
    argv = sys.argv[1:] if argv is None else argv
    n = int(argv[0]) if argv else 1000
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    workdir = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    try:
        with NginxFleet(n) as fleet:
            asyncio.run(_run(fleet, n, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
