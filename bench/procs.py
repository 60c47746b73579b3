"""The exporter and Prometheus as child processes over a fleet, with their CPU read from /proc."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    Child,
    Skip,
    cpu_seconds,
    find_binary,
    free_port,
    http_status,
    peak_rss_mb,
    wait_until,
)
from bench.fleet import NginxFleet
from exporter.config.model import validate_config

EXPORTER_AGENT = "specdec-exporter/"
PROMETHEUS_AGENT = "Prometheus/"
PROMETHEUS_CANDIDATES = ("prometheus", "/usr/bin/prometheus")
VICTORIA_AGENT = "vm_promscrape"
VICTORIA_CANDIDATES = ("victoria-metrics", "/usr/bin/victoria-metrics")
SPEC_ONLY = [{"source_labels": ["__name__"], "regex": "vllm:spec_decode_.*", "action": "keep"}]


def find_victoria() -> str | None:
    """The single-node victoria-metrics binary (Debian's package), or None."""
    return find_binary(*VICTORIA_CANDIDATES)


def find_prometheus() -> str | None:
    """The prometheus binary, or None."""
    return find_binary(*PROMETHEUS_CANDIDATES)


def exporter_config(fleet: NginxFleet, n: int, workdir: Path, *, interval: float, port: int,
                    **extra) -> dict:
    """An exporter config over the first n targets of the fleet (validated)."""
    config = {
        "listen": f"127.0.0.1:{port}",
        "scrape_interval": f"{interval:g}s",
        "scrape_timeout": f"{min(3.0, interval):g}s",
        "output_dir": str(workdir / "outputs"),
        "targets": [{"name": f"t{i}", "url": url} for i, url in enumerate(fleet.urls(n))],
        **extra,
    }
    validate_config(config)
    return config


class _ServingProcess:
    """A child process serving HTTP on `self.base`, started and waited for until ready."""

    base: str
    child: Child

    def _launch(self, cmd: list[str], log: Path, what: str, timeout: float,
                env: dict | None = None, ready: str = "/-/ready", cwd: Path | None = None) -> None:
        self.child = Child(cmd, log, env=env, cwd=cwd)
        try:
            wait_until(lambda: http_status(self.base + ready) == 200, timeout, what,
                       self.child.proc)
        except RuntimeError as exc:
            self.child.stop()
            raise RuntimeError(f"{exc}\n{self.child.tail()}") from None

    @property
    def pid(self) -> int:
        """The child's pid."""
        return self.child.pid

    def pause(self) -> None:
        """SIGSTOP: the process keeps its memory and connections but uses no CPU."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM and wait (resumed first: a stopped process cannot act on SIGTERM)."""
        with contextlib.suppress(OSError):
            self.resume()
        self.child.stop()


class ExporterProcess(_ServingProcess):
    """`python -m exporter serve --config FILE` over n fleet targets; ready after one round.

    `tree`: another checkout whose exporter/ is run instead (a baseline commit's code, in the
    same run); `-m` looks in the working directory first, so the child starts there.
    """

    def __init__(self, fleet: NginxFleet, n: int, workdir: Path, *, interval: float = 5.0,
                 event_loop: str | None = None, tree: Path | None = None, **extra):
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        path = workdir / "exporter.yaml"
        # JSON is YAML: no dumper needed.
        path.write_text(json.dumps(
            exporter_config(fleet, n, workdir, interval=interval, port=self.port, **extra)
        ))
        env = {k: v for k, v in os.environ.items() if k not in ("SPECDEC_TOKEN",)}
        env["PYTHONUNBUFFERED"] = "1"
        if event_loop:  # "asyncio" opts out of uvloop (exporter/server/eventloop.py)
            env["SPECDEC_EVENT_LOOP"] = event_loop
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        self._launch([sys.executable, "-m", "exporter", "serve", "--config", str(path)],
                     workdir / "exporter.log", "exporter ready", 60 + n * 0.05, env=env,
                     cwd=tree)


class PrometheusProcess(_ServingProcess):
    """A real Prometheus scraping n fleet targets at `interval`; TSDB in workdir."""

    def __init__(self, fleet: NginxFleet, n: int, workdir: Path, *, interval: float = 5.0,
                 keep: str = "spec"):
        binary = find_prometheus()
        if binary is None:
            raise Skip("prometheus not found: apt-get install -y prometheus")
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        job: dict = {
            "job_name": "fleet",
            "static_configs": [{"targets": fleet.host_ports(n)}],
        }
        if keep == "spec":
            # Same job as the exporter: keep only the spec-decode series (all are still parsed).
            job["metric_relabel_configs"] = SPEC_ONLY
        config = {
            "global": {"scrape_interval": f"{interval:g}s",
                       "scrape_timeout": f"{min(3.0, interval):g}s"},
            "scrape_configs": [job],
        }
        path = workdir / "prometheus.yml"
        path.write_text(json.dumps(config))
        self._launch(
            [binary, f"--config.file={path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            workdir / "prometheus.log", "prometheus ready", 60)


class VictoriaProcess(_ServingProcess):
    """Single-node VictoriaMetrics scraping n fleet targets itself (-promscrape.config).

    Set up as a user keeping only the spec-decode series would: the same scrape job as the
    spec-only Prometheus, metric_relabel_configs keeping vllm:spec_decode_*.
    """

    def __init__(self, fleet: NginxFleet, n: int, workdir: Path, *, interval: float = 5.0):
        binary = find_victoria()
        if binary is None:
            raise Skip("victoria-metrics not found: apt-get install -y victoria-metrics")
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": f"{interval:g}s",
                       "scrape_timeout": f"{min(3.0, interval):g}s"},
            "scrape_configs": [{"job_name": "fleet",
                                "static_configs": [{"targets": fleet.host_ports(n)}],
                                "metric_relabel_configs": SPEC_ONLY}],
        }
        path = workdir / "scrape.yml"
        path.write_text(json.dumps(config))
        self._launch(
            [binary, f"-promscrape.config={path}", f"-storageDataPath={workdir / 'data'}",
             f"-httpListenAddr=127.0.0.1:{self.port}", "-loggerLevel=ERROR"],
            workdir / "victoria.log", "victoria-metrics ready", 60, ready="/health")


@dataclass
class CpuSample:
    """CPU and scrapes of one process over a measured span."""

    seconds: float
    cpu_s: float
    scrapes: int
    peak_rss_mb: float

    def figures(self, n: int, interval: float) -> dict:
        """Derived figures: per target-scrape, per round, share of one core."""
        per_scrape = self.cpu_s / self.scrapes if self.scrapes else None
        rounds = self.scrapes / n if n else 0.0
        # Share of a core in steady state: CPU per round over the interval (a span that is not
        # a whole number of intervals would otherwise skew it).
        core_pct = 100 * self.cpu_s / (rounds * interval) if rounds else None
        return {
            "seconds": self.seconds,
            "cpu_s": self.cpu_s,
            "scrapes": self.scrapes,
            "expected_scrapes": n * int(self.seconds / interval + 1e-6),
            "rounds": rounds,
            "cpu_ms_per_target_scrape": per_scrape * 1e3 if per_scrape is not None else None,
            "cpu_s_per_round": per_scrape * n if per_scrape is not None else None,
            "core_pct": core_pct,
            "core_pct_of_span": 100 * self.cpu_s / self.seconds,
            "peak_rss_mb": self.peak_rss_mb,
        }


def measure(pid: int, fleet: NginxFleet, agent: str, seconds: float) -> CpuSample:
    """CPU seconds of pid and the scrapes nginx answered for agent, over `seconds` from now."""
    cpu0, scrapes0, t0 = cpu_seconds(pid), fleet.requests_by(agent), time.monotonic()
    deadline = t0 + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))
    cpu1, scrapes1, t1 = cpu_seconds(pid), fleet.requests_by(agent), time.monotonic()
    return CpuSample(t1 - t0, cpu1 - cpu0, scrapes1 - scrapes0, peak_rss_mb(pid))
