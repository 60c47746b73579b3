"""Case: what saving the window book every round costs, against the round it follows.

In-process `make_app` over N fleet targets with one window open over all of them; every round
the counters grow, so every accumulator changed and the round's save writes all N rows (the
worst case: an idle target's row is not rewritten), each as its round part (nothing but values,
increases and times changed, so no whole row: `Accumulator.encode`). CPU is
`time.process_time()` of this process (nginx is another one), medians over the repeats, both
figures from the same run.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from aiohttp import web

from bench.common import CaseResult, Row, ratio
from bench.fleet import NginxFleet
from exporter.config.model import validate_config
from exporter.web.app import make_app
from exporter.web.handlers import SERVICE

SAVE_SHARE_TARGET = 0.05  # of a scrape round's CPU


async def _measure(fleet: NginxFleet, n: int, workdir: Path, repeats: int) -> dict:
    config = validate_config({
        "listen": "127.0.0.1:9400",  # not bound: the app is driven in-process
        "output_dir": str(workdir / "outputs"),
        "targets": [{"name": f"t{i}", "url": url} for i, url in enumerate(fleet.urls(n))],
    })
    app = make_app(config, scrape_loop=False)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        service = app[SERVICE]
        book = service.book
        await service.scheduler.round()  # connections warm
        await service.start_window("bench-save")
        rounds, saves, rows = [], [], []
        for _ in range(repeats):
            await asyncio.to_thread(fleet.advance)
            started = time.process_time()
            await service.scheduler.round()  # its own save included
            rounds.append(time.process_time() - started)
            # The same save again, alone: every accumulator marked changed, as the round left it.
            for window in book.open_windows():
                window.dirty.update(window.accumulators)
            rows.append(sum(len(w.dirty) for w in book.open_windows()))
            started = time.process_time()
            book.save_round()
            saves.append(time.process_time() - started)
        db = config.state_path
        return {
            "targets": n,
            "round_cpu_s": rounds,
            "save_cpu_s": saves,
            "rows_per_save": rows,
            "round_cpu_median_s": statistics.median(rounds),
            "save_cpu_median_s": statistics.median(saves),
            "db_bytes": db.stat().st_size + _size(db.with_name(db.name + "-wal")),
        }
    finally:
        await runner.cleanup()


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def run(fleet: NginxFleet, *, n: int = 1000, repeats: int = 5) -> CaseResult:
    """Time scrape rounds and the per-round save of a window over all N targets."""
    result = CaseResult("save")
    workdir = Path(tempfile.mkdtemp(prefix="bench-save-"))
    try:
        d = asyncio.run(_measure(fleet, n, workdir, repeats))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result.data = d
    share = ratio(d["save_cpu_median_s"], d["round_cpu_median_s"])
    result.rows = [
        Row("save", f"N={n}: CPU of one scrape round (its save included)",
            d["round_cpu_median_s"], "s"),
        Row("save", f"N={n}: CPU of the per-round save ({d['rows_per_save'][-1]} rows, "
            "one transaction)", d["save_cpu_median_s"], "s",
            baseline=d["round_cpu_median_s"], baseline_name="scrape round, same run",
            ratio=share, target=f"< {SAVE_SHARE_TARGET:.0%} of a round",
            met=share is not None and share < SAVE_SHARE_TARGET),
    ]
    return result
