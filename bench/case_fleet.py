"""Case 2: the exporter scraping N servers at 5 s, against a real Prometheus on the same fleet.

Every contender (the exporter on its default loop, the exporter on asyncio's loop, Prometheus
keeping only the spec-decode series, Prometheus keeping everything, VictoriaMetrics keeping only
the spec-decode series) is started once per N and
then paused (SIGSTOP); each rotation resumes one at a time and measures it alone for `seconds`,
so the contenders take turns under the same load on the host. Figures are medians over the
rotations; ratios are to the spec-only Prometheus and VictoriaMetrics measured in the same run.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import CaseResult, Row, ratio, wait_until
from bench.fleet import NginxFleet
from bench.procs import (
    EXPORTER_AGENT,
    PROMETHEUS_AGENT,
    VICTORIA_AGENT,
    ExporterProcess,
    PrometheusProcess,
    VictoriaProcess,
    find_prometheus,
    find_victoria,
    measure,
)

CPU_TARGET_PCT = 30.0
RSS_TARGET_MB = 150.0
RATIO_GOAL = 0.25  # CPU per target-scrape, exporter / spec-only Prometheus (issue 15)
VICTORIA_GOAL = 0.5  # CPU per target-scrape, exporter / spec-only VictoriaMetrics (issue 28)
SETTLE_S = 1.0  # after a resume, before measuring: the missed beats fire at once


def _start(name: str, fleet: NginxFleet, n: int, workdir: Path, interval: float,
           baseline_tree: Path | None = None):
    """One contender, started, warmed (every target scraped once) and paused."""
    if name.startswith("exporter"):
        loop = "asyncio" if name == "exporter-asyncio" else None
        tree = baseline_tree if name == "exporter-baseline" else None
        proc = ExporterProcess(fleet, n, workdir / name, interval=interval, event_loop=loop,
                               tree=tree)
        time.sleep(0.5)  # ready means the first round is done; let it settle
    elif name == "victoria-spec":
        proc = VictoriaProcess(fleet, n, workdir / name, interval=interval)
        _warm(fleet, n, VICTORIA_AGENT, interval, name, proc)
    else:
        keep = "all" if name == "prometheus-all" else "spec"
        proc = PrometheusProcess(fleet, n, workdir / name, interval=interval, keep=keep)
        # Discovery hands targets over after ~5 s, then each target starts at its own offset
        # in the interval: warm once every target has been scraped (the other Prometheus is
        # paused, so the agent's count is this one's).
        _warm(fleet, n, PROMETHEUS_AGENT, interval, name, proc)
    proc.pause()
    return proc


def _warm(fleet: NginxFleet, n: int, agent: str, interval: float, name: str, proc) -> None:
    """Wait until every target was scraped once by `agent` (the others are paused)."""
    already = fleet.requests_by(agent)
    wait_until(lambda: fleet.requests_by(agent) - already >= n,
               30 + 2 * interval, f"{name} first scrapes", proc.child.proc)


def contenders(have_prometheus: bool, keep: tuple[str, ...], loops: bool,
               have_victoria: bool = False, baseline: bool = False) -> list[str]:
    """Who is measured, in rotation order."""
    names = ["exporter"] + (["exporter-baseline"] if baseline else []) + (
        ["exporter-asyncio"] if loops else [])
    if have_prometheus:
        names += [f"prometheus-{k}" for k in keep]
    if have_victoria:
        names.append("victoria-spec")
    return names


def _agent(name: str) -> str:
    if name.startswith("exporter"):
        return EXPORTER_AGENT
    return VICTORIA_AGENT if name.startswith("victoria") else PROMETHEUS_AGENT


def run(fleet: NginxFleet, *, sizes=(100, 1000), seconds: float = 15.0, interval: float = 5.0,
        keep: tuple[str, ...] = ("spec", "all"), rotations: int = 3, loops: bool = True,
        compare_at: tuple[int, ...] | None = None,
        baseline_tree: Path | None = None, plain: bool = False) -> CaseResult:
    """For each N: every contender measured alone, `rotations` times in turn.

    Prometheus and the asyncio-loop exporter run only at the sizes in `compare_at` (default:
    every size); the others are the exporter alone, for the scale curve. `baseline_tree`: a
    checkout of another commit whose exporter joins the rotation there ("exporter-baseline").
    `plain`: the pages served plain to every client, as vLLM serves /metrics ("fleet-plain").
    """
    compare_at = sizes if compare_at is None else compare_at
    result = CaseResult("fleet-plain" if plain else "fleet")
    fleet.set_gzip(not plain)
    try:
        _run(result, fleet, sizes, seconds, interval, keep, rotations, loops, compare_at,
             baseline_tree)
    finally:
        fleet.set_gzip(True)
    return result


def _run(result: CaseResult, fleet: NginxFleet, sizes, seconds: float, interval: float,
         keep: tuple[str, ...], rotations: int, loops: bool, compare_at: tuple[int, ...],
         baseline_tree: Path | None) -> None:
    have_prometheus = find_prometheus() is not None
    have_victoria = find_victoria() is not None
    result.data = {"interval_s": interval, "measured_s": seconds, "rotations": rotations,
                   "page_bytes": fleet.page_bytes, "page_series": fleet.page_series,
                   "prometheus_keep": list(keep), "points": {},
                   "encoding": "gzip" if fleet.gzip else "plain"}
    if not have_prometheus:
        result.data["prometheus"] = "prometheus not found: apt-get install -y prometheus"
    if not have_victoria:
        result.data["victoria"] = "victoria-metrics not found: apt-get install -y victoria-metrics"
    workdir = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    try:
        for n in sizes:
            names = contenders(have_prometheus and n in compare_at, keep, loops and n in compare_at,
                               have_victoria and n in compare_at,
                               baseline_tree is not None and n in compare_at)
            procs = {}
            samples: dict[str, list[dict]] = {name: [] for name in names}
            try:
                for name in names:
                    procs[name] = _start(name, fleet, n, workdir / str(n), interval,
                                         baseline_tree)
                for _ in range(rotations):
                    for name in names:
                        proc = procs[name]
                        proc.resume()
                        time.sleep(SETTLE_S)
                        samples[name].append(
                            measure(proc.pid, fleet, _agent(name), seconds).figures(n, interval))
                        proc.pause()
            finally:
                for proc in procs.values():
                    proc.stop()
            point = {name: _median_figures(runs) for name, runs in samples.items()}
            result.data["points"][str(n)] = point
            result.rows += _rows(result.name, n, point)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _median_figures(runs: list[dict]) -> dict:
    """Each figure's median over the rotations (peak RSS: the largest), and the raw runs."""
    out: dict = {"runs": runs}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        if not values:
            out[key] = None
        elif key == "peak_rss_mb":
            out[key] = max(values)
        else:
            out[key] = statistics.median(values)
    return out


def _rows(case: str, n: int, point: dict) -> list[Row]:
    ex = point["exporter"]
    spec = point.get("prometheus-spec") or {}
    everything = point.get("prometheus-all") or {}
    asyncio_loop = point.get("exporter-asyncio") or {}
    per = "cpu_ms_per_target_scrape"
    to_spec = ratio(ex[per], spec.get(per))
    rows = [
        Row(case, f"N={n}: CPU ms per target-scrape (median of {len(ex['runs'])})", ex[per],
            "ms", spec.get(per), "Prometheus, spec-decode series kept", to_spec,
            f"<= {RATIO_GOAL:g}x" if spec else "",
            None if to_spec is None else to_spec <= RATIO_GOAL),
    ]
    victoria = point.get("victoria-spec") or {}
    if victoria:
        to_vm = ratio(ex[per], victoria.get(per))
        rows.append(Row(case, f"N={n}: CPU ms per target-scrape vs VictoriaMetrics", ex[per],
                        "ms", victoria.get(per), "VictoriaMetrics, spec-decode series kept",
                        to_vm, f"<= {VICTORIA_GOAL:g}x",
                        None if to_vm is None else to_vm <= VICTORIA_GOAL))
        rows.append(Row(case, f"N={n}: peak RSS vs VictoriaMetrics", ex["peak_rss_mb"], "MB",
                        victoria.get("peak_rss_mb"), "VictoriaMetrics, spec",
                        ratio(ex["peak_rss_mb"], victoria.get("peak_rss_mb")), "< 1x",
                        ex["peak_rss_mb"] < (victoria.get("peak_rss_mb") or 0)))
    baseline = point.get("exporter-baseline") or {}
    if baseline:
        rows.append(Row(case, f"N={n}: CPU ms per target-scrape vs the baseline commit",
                        ex[per], "ms", baseline.get(per), "exporter at the baseline commit",
                        ratio(ex[per], baseline.get(per))))
        rows.append(Row(case, f"N={n}: peak RSS vs the baseline commit", ex["peak_rss_mb"],
                        "MB", baseline.get("peak_rss_mb"), "exporter at the baseline commit",
                        ratio(ex["peak_rss_mb"], baseline.get("peak_rss_mb"))))
    if everything:
        rows.append(Row(case, f"N={n}: CPU ms per target-scrape vs Prometheus keeping all",
                        ex[per], "ms", everything.get(per), "Prometheus, every series kept",
                        ratio(ex[per], everything.get(per))))
    if asyncio_loop:
        rows.append(Row(case, f"N={n}: CPU ms per target-scrape, uvloop vs asyncio's loop",
                        ex[per], "ms", asyncio_loop.get(per), "exporter on asyncio's loop",
                        ratio(ex[per], asyncio_loop.get(per))))
    rows += [
        Row(case, f"N={n}: % of one core", ex["core_pct"], "%", spec.get("core_pct"),
            "Prometheus, spec" if spec else "", ratio(ex["core_pct"], spec.get("core_pct")),
            f"< {CPU_TARGET_PCT:g}%" if n >= 1000 else "",
            ex["core_pct"] is not None and ex["core_pct"] < CPU_TARGET_PCT if n >= 1000 else None),
        Row(case, f"N={n}: peak RSS", ex["peak_rss_mb"], "MB", spec.get("peak_rss_mb"),
            "Prometheus, spec" if spec else "", ratio(ex["peak_rss_mb"], spec.get("peak_rss_mb")),
            f"< {RSS_TARGET_MB:g} MB" if n == 1000 else "",
            ex["peak_rss_mb"] < RSS_TARGET_MB if n == 1000 else None),
        Row(case, f"N={n}: target-scrapes answered per span (exporter)", ex["scrapes"],
            "scrapes", ex["expected_scrapes"], "expected",
            ratio(ex["scrapes"], ex["expected_scrapes"]), ">= 0.9x expected",
            ex["scrapes"] >= 0.9 * ex["expected_scrapes"]),
    ]
    return rows
