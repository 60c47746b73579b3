"""Case 2: the exporter scraping N servers at 5 s, against a real Prometheus on the same fleet."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from bench.common import CaseResult, Row, ratio, wait_until
from bench.fleet import NginxFleet
from bench.procs import (
    EXPORTER_AGENT,
    PROMETHEUS_AGENT,
    ExporterProcess,
    PrometheusProcess,
    find_prometheus,
    measure,
)

CPU_TARGET_PCT = 30.0
RSS_TARGET_MB = 150.0


def run(fleet: NginxFleet, *, sizes=(100, 250, 500, 1000), seconds: float = 20.0,
        interval: float = 5.0, keep: str = "spec") -> CaseResult:
    """For each N: the exporter, then Prometheus, each measured for `seconds` after warm-up."""
    result = CaseResult("fleet")
    have_prometheus = find_prometheus() is not None
    result.data = {"interval_s": interval, "measured_s": seconds, "page_bytes": fleet.page_bytes,
                   "prometheus_keep": keep, "points": {}}
    if not have_prometheus:
        result.data["prometheus"] = "prometheus not found: apt-get install -y prometheus"
    workdir = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    try:
        for n in sizes:
            point = {}
            exporter = ExporterProcess(fleet, n, workdir / f"exporter-{n}", interval=interval)
            try:
                time.sleep(0.5)  # ready means the first round is done; let it settle
                point["exporter"] = measure(exporter.pid, fleet, EXPORTER_AGENT, seconds).figures(
                    n, interval
                )
            finally:
                exporter.stop()
            if have_prometheus:
                prom = PrometheusProcess(fleet, n, workdir / f"prometheus-{n}",
                                         interval=interval, keep=keep)
                try:
                    # Discovery hands targets over after ~5 s, then each target starts at its own
                    # offset in the interval: measure once every target has been scraped.
                    already = fleet.requests_by(PROMETHEUS_AGENT)
                    wait_until(
                        lambda a=already, n=n: fleet.requests_by(PROMETHEUS_AGENT) - a >= n,
                        30 + 2 * interval, "prometheus first scrapes", prom.child.proc,
                    )
                    time.sleep(0.2)
                    point["prometheus"] = measure(
                        prom.pid, fleet, PROMETHEUS_AGENT, seconds
                    ).figures(n, interval)
                finally:
                    prom.stop()
            result.data["points"][str(n)] = point
            result.rows += _rows(n, point)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _rows(n: int, point: dict) -> list[Row]:
    ex, prom = point["exporter"], point.get("prometheus") or {}
    base = "Prometheus"
    per_scrape = ratio(ex["cpu_ms_per_target_scrape"], prom.get("cpu_ms_per_target_scrape"))
    rows = [
        Row("fleet", f"N={n}: CPU ms per target-scrape", ex["cpu_ms_per_target_scrape"], "ms",
            prom.get("cpu_ms_per_target_scrape"), base, per_scrape, "<= 1x Prometheus",
            None if per_scrape is None else per_scrape <= 1.0),
        Row("fleet", f"N={n}: CPU s per scrape round", ex["cpu_s_per_round"], "s",
            prom.get("cpu_s_per_round"), base, ratio(ex["cpu_s_per_round"],
                                                     prom.get("cpu_s_per_round"))),
        Row("fleet", f"N={n}: % of one core", ex["core_pct"], "%", prom.get("core_pct"), base,
            ratio(ex["core_pct"], prom.get("core_pct")),
            f"< {CPU_TARGET_PCT:g}%" if n >= 1000 else "",
            ex["core_pct"] is not None and ex["core_pct"] < CPU_TARGET_PCT if n >= 1000 else None),
        Row("fleet", f"N={n}: peak RSS", ex["peak_rss_mb"], "MB", prom.get("peak_rss_mb"), base,
            ratio(ex["peak_rss_mb"], prom.get("peak_rss_mb")),
            f"< {RSS_TARGET_MB:g} MB" if n >= 1000 else "",
            ex["peak_rss_mb"] < RSS_TARGET_MB if n >= 1000 else None),
        Row("fleet", f"N={n}: target-scrapes answered (exporter)", ex["scrapes"], "scrapes",
            ex["expected_scrapes"], "expected",
            ratio(ex["scrapes"], ex["expected_scrapes"]), ">= 0.9x expected",
            ex["scrapes"] >= 0.9 * ex["expected_scrapes"]),
    ]
    return rows

