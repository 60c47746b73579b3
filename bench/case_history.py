"""Event-loop lag while `POST /api/v1/windows/history` counts 2 h x 10 targets at 1 s, against
the same exporter's loop with no history being counted (the baseline), spans alternating.

`python -m bench.case_history [--targets 10] [--hours 2] [--rotations 3] [--in-thread]`. The
store is `python -m http.server` in its own process serving a Prometheus-shaped answer from
files (it ignores the query string): its work is never on the measured loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.common import CaseResult, Row, free_port, percentile
from exporter.config.model import validate_config
from exporter.web.app import make_app

LAG_TARGET_S = 0.050  # issue 43
PROBE_SLEEP_S = 0.010
START = 1_700_000_000.0
FIELDS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
          "vllm:spec_decode_num_accepted_tokens_total")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def write_store(folder: Path, targets: int, seconds: int, k: int = 3) -> int:
    """The store's files: every series of `targets` k=`k` servers over `seconds` at 1 s.
    Returns the samples in the answer."""
    result = []
    for t in range(targets):
        labels = {"job": "vllm", "instance": f"10.0.0.{t}:8000", "model_name": "m"}
        drafts = [i * 40 for i in range(seconds + 1)]
        series = [(FIELDS[0], {}, drafts), (FIELDS[1], {}, [d * k for d in drafts]),
                  (FIELDS[2], {}, [d * 2 for d in drafts])]
        series += [(PER_POS, {"position": str(p)}, [d * (k - p) // k for d in drafts])
                   for p in range(k)]
        for name, more, values in series:
            result.append({"metric": {"__name__": name, **labels, **more},
                           "values": [[START + i, str(v)] for i, v in enumerate(values)]})
    api = folder / "api" / "v1"
    api.mkdir(parents=True)
    (api / "query").write_text(json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": result}}))
    (api / "series").write_text(json.dumps({"status": "success", "data": [
        {"__name__": "up", "job": "vllm", "instance": f"10.0.0.{t}:8000"}
        for t in range(targets)]}))
    return sum(len(s["values"]) for s in result)


async def _probe(stop: asyncio.Event, lags: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        started = loop.time()
        await asyncio.sleep(PROBE_SLEEP_S)
        lags.append(max(0.0, loop.time() - started - PROBE_SLEEP_S))


async def _span(work, lags: list[float]) -> float:
    """Probe the loop while `work()` runs; its seconds."""
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(stop, lags))
    started = time.perf_counter()
    try:
        await work()
    finally:
        stop.set()
        await probe
    return time.perf_counter() - started


async def _measure(store: str, seconds: int, rotations: int, workdir: Path) -> dict:
    config = validate_config({"targets": [], "output_dir": str(workdir / "out"),
                              "history": {"prometheus": store}})
    runner = web.AppRunner(make_app(config, scrape_loop=False), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}"
    spans: dict[str, list[dict]] = {"baseline": [], "history": []}
    took: list[float] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            for r in range(rotations):
                async def history(r: int = r) -> None:
                    async with session.post(f"{base}/api/v1/windows/history", json={
                            "from": START, "to": START + seconds, "id": f"bench-{r}"}) as got:
                        body = await got.json()
                        assert got.status == 201, body
                        assert len(body["results"]) > 0

                for name in ("baseline", "history"):
                    lags: list[float] = []
                    if name == "history":
                        took.append(await _span(history, lags))
                    else:  # as long as the last history took (the first: a guess)
                        await _span(lambda: asyncio.sleep(took[-1] if took else 8.0), lags)
                    spans[name].append({"max_s": max(lags), "p99_s": percentile(lags, 99)})
    finally:
        await runner.cleanup()
    # The host is shared: each figure is the median over the spans of one kind.
    return {"history_seconds": took, "spans": spans,
            **{f"lag_{name}": {key: statistics.median(s[key] for s in v)
                               for key in ("max_s", "p99_s")} for name, v in spans.items()}}


def run(*, targets: int = 10, hours: float = 2.0, rotations: int = 3,
        in_thread: bool = False) -> CaseResult:
    """Loop lag with and without a history window being counted, same process and run."""
    result = CaseResult("history")
    seconds = int(hours * 3600)
    workdir = Path(tempfile.mkdtemp(prefix="bench-history-"))
    port = free_port()
    samples = write_store(workdir / "store", targets, seconds)
    store = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                              str(port), "--directory", str(workdir / "store")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if in_thread:
        os.environ["SPECDEC_STOP_IN_CHILD"] = "0"
    try:
        _wait_for(f"http://127.0.0.1:{port}/api/v1/series")
        d = asyncio.run(_measure(f"http://127.0.0.1:{port}", seconds, rotations, workdir))
    finally:
        os.environ.pop("SPECDEC_STOP_IN_CHILD", None)
        store.kill()
        store.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    d |= {"targets": targets, "seconds": seconds, "samples": samples, "in_thread": in_thread}
    result.data = d
    what = f"{targets} targets x {hours:g} h at 1 s, {samples:,} samples"
    how = "in a thread" if in_thread else "in the stop's forked worker"
    hist, base = d["lag_history"], d["lag_baseline"]
    result.rows = [
        Row("history", f"loop lag max (median of {rotations} spans) while a history window is "
            f"counted {how} ({what})",
            hist["max_s"] * 1e3, "ms", base["max_s"] * 1e3, "same loop, nothing counted",
            None, f"< {LAG_TARGET_S * 1e3:g} ms", hist["max_s"] < LAG_TARGET_S),
        Row("history", "loop lag p99 (median of spans) while it is counted", hist["p99_s"] * 1e3,
            "ms",
            base["p99_s"] * 1e3, "same loop, nothing counted"),
        Row("history", "POST /api/v1/windows/history, median",
            statistics.median(d["history_seconds"]), "s"),
    ]
    return result


def _wait_for(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--rotations", type=int, default=3)
    parser.add_argument("--in-thread", action="store_true",
                        help="SPECDEC_STOP_IN_CHILD=0: the fallback without a forked worker")
    args = parser.parse_args()
    result = run(targets=args.targets, hours=args.hours, rotations=args.rotations,
                 in_thread=args.in_thread)
    for row in result.rows:
        print(f"{row.figure}: {row.value:.3g} {row.unit} (baseline {row.baseline}) "
              f"{'' if row.met is None else ('met' if row.met else 'NOT MET')}")
    print(json.dumps(result.data, indent=2))


if __name__ == "__main__":
    main()
