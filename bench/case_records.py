"""Case: what a window's per-request records cost in memory, against the window without them.

In-process `make_app` with one window open over one target; the recording proxy's hand-off
(`WindowBook.record`) is called a million times with answers whose figures vary (every length
and rate bucket a vLLM with k=7 can fill), and no scrape in between (the worst case: finish
times are let go only at a scrape). RSS of this process before and after, the time a record
costs, and what the window's saved row weighs then. `python -m bench.case_records [--n N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import tempfile
import time
from pathlib import Path

from aiohttp import web

from bench.common import CaseResult, Row, rss_mb
from exporter.config.model import validate_config
from exporter.core.perrequest import RequestStats
from exporter.web.app import make_app
from exporter.web.handlers import SERVICE

RSS_LIMIT_MB = 10.0  # for a million records in one window
K = 7


def _answers(count: int) -> list[RequestStats]:
    """`count` distinct answers' figures (ids, tokens and acceptance all vary)."""
    rng = random.Random(7)
    out = []
    for i in range(count):
        steps = rng.randint(1, 200)
        hist = [rng.randint(0, steps) for _ in range(K + 1)]
        hist[0] += steps - sum(hist) if sum(hist) < steps else 0
        accepted = sum(j * n for j, n in enumerate(hist))
        spec = {"num_spec_steps": sum(hist), "num_draft_tokens": K * sum(hist),
                "num_accepted_draft_tokens": accepted, "acceptance_histogram": hist}
        out.append(RequestStats(f"cmpl-{i:08d}", "m", rng.randint(1, 4000),
                                rng.randint(1, 2000), spec))
    return out


async def _measure(n: int, workdir: Path) -> dict:
    config = validate_config({"listen": "127.0.0.1:9400", "output_dir": str(workdir),
                              "targets": [{"name": "v", "url": "http://127.0.0.1:9/metrics"}]})
    app = make_app(config, scrape_loop=False)
    runner = web.AppRunner(app)
    await runner.setup()
    service = app[SERVICE]
    try:
        await service.start_window("bench-records")
        answers = _answers(4096)  # made before the first RSS reading, reused below
        gc.collect()
        before = rss_mb(os.getpid())
        started = time.perf_counter()
        for i in range(n):
            service.book.record("v", answers[i % len(answers)])
        seconds = time.perf_counter() - started
        gc.collect()
        after = rss_mb(os.getpid())
        (window,) = service.book.open_windows()
        row = len(json.dumps(window.to_dict()))
        requests = window.state()["per_request"]["aggregate"]["requests"]
    finally:
        await runner.cleanup()
    return {"records": n, "counted": requests, "rss_before_mb": before, "rss_after_mb": after,
            "rss_growth_mb": after - before, "us_per_record": 1e6 * seconds / n,
            "row_kib": row / 1024}


def run(n: int = 1_000_000) -> CaseResult:
    """RSS growth over `n` records in one window, with the cost of one record."""
    with tempfile.TemporaryDirectory(prefix="bench-records-") as tmp:
        figures = asyncio.run(_measure(n, Path(tmp)))
    growth = figures["rss_growth_mb"]
    result = CaseResult("records", data=figures)
    result.rows = [
        Row("records", f"{n:,} records in one window: RSS growth", growth, "MB",
            target=f"< {RSS_LIMIT_MB:g} MB" if n >= 1_000_000 else "",
            met=growth < RSS_LIMIT_MB if n >= 1_000_000 else None),
        Row("records", "one record (WindowBook.record)", figures["us_per_record"], "µs"),
        Row("records", "the open window's saved row after them", figures["row_kib"], "KiB"),
    ]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="records in the window")
    args = parser.parse_args()
    result = run(args.n)
    print(json.dumps(result.data, indent=2))
    for row in result.rows:
        print(f"{row.figure}: {row.value:.3f} {row.unit} {row.target} "
              f"{'' if row.met is None else ('met' if row.met else 'MISSED')}")


if __name__ == "__main__":
    main()
