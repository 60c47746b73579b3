"""The cost of `window_scrape_interval`: N targets at `scrape_interval` 5 s, one window over all
of them open (scraped every `window_scrape_interval`) against none open, same exporter process.

`python -m bench.case_windowscrape [--n 1000] [--seconds 15] [--rotations 2]`. The spans with
and without the window alternate so both see the same load on the host; figures are medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.fleet import NginxFleet
from bench.procs import EXPORTER_AGENT, ExporterProcess, measure

SETTLE_S = 2.0  # after a window opens or closes, before measuring


def _post(base: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(base + path, data=json.dumps(body or {}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return dict(json.loads(answer.read()))


def run(n: int = 1000, seconds: float = 15.0, rotations: int = 2, interval: float = 5.0,
        window_interval: float = 1.0) -> dict:
    """% of one core and scrapes per second, no window open against one over every target."""
    fleet = NginxFleet(n)
    workdir = Path(tempfile.mkdtemp(prefix="bench-windowscrape-"))
    spans: dict[str, list[dict]] = {"closed": [], "open": []}
    try:
        proc = ExporterProcess(fleet, n, workdir, interval=interval,
                               window_scrape_interval=f"{window_interval:g}s")
        try:
            time.sleep(SETTLE_S)
            for r in range(rotations):
                spans["closed"].append(_span(proc.pid, fleet, seconds))
                window = _post(proc.base, "/api/v1/windows", {"id": f"bench-{r}"})
                time.sleep(SETTLE_S)
                spans["open"].append(_span(proc.pid, fleet, seconds))
                _post(proc.base, f"/api/v1/windows/{window['id']}/stop")
                time.sleep(SETTLE_S)
        finally:
            proc.stop()
    finally:
        fleet.close()
        shutil.rmtree(workdir, ignore_errors=True)
    medians = {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]}
               for name, runs in spans.items()}
    closed, opened = medians["closed"], medians["open"]
    return {"n": n, "scrape_interval_s": interval, "window_scrape_interval_s": window_interval,
            "seconds": seconds, "rotations": rotations, "spans": spans, "median": medians,
            "open_over_closed_cpu": opened["core_pct"] / closed["core_pct"]}


def _span(pid: int, fleet: NginxFleet, seconds: float) -> dict:
    sample = measure(pid, fleet, EXPORTER_AGENT, seconds)
    return {"core_pct": 100 * sample.cpu_s / sample.seconds,
            "scrapes_per_s": sample.scrapes / sample.seconds,
            "cpu_ms_per_scrape": 1000 * sample.cpu_s / sample.scrapes if sample.scrapes else 0.0,
            "peak_rss_mb": sample.peak_rss_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rotations", type=int, default=2)
    parser.add_argument("--window-interval", type=float, default=1.0)
    args = parser.parse_args()
    out = run(args.n, args.seconds, args.rotations, window_interval=args.window_interval)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
