"""The collapse alerts against a real Prometheus: two fake vLLM servers behind the exporter and
its recording proxies, one of them collapsing mid-run.

Prometheus evaluates deploy/prometheus/rules.yml rendered with its windows shortened (5m to 10s,
6h to 60s, every group each second, the two alerts' `for:` 3s); the expressions and thresholds
are the shipped file's. The test reads ALERTS from Prometheus's API: SpecDecAcceptanceCollapse
and SpecDecAcceptanceSplit fire for the collapsing server and for no other.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import free_port, tool

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus]

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "rules.yml"
ALERTS = ("SpecDecAcceptanceCollapse", "SpecDecAcceptanceSplit")
SHORTER = {"[5m]": "[10s]", "[6h]": "[60s]"}
FAKES = {"steady": "11", "collapsing": "12"}  # name: seed
# 300 drafts a second: 3,000 in the 10s window, past the collapse alert's 1,000.
FAKE_ARGS = ["--k", "3", "--acceptance", "0.8", "--drafts-per-second", "300",
             "--per-request-spec-decode-metrics", "summary"]
CLI = [sys.executable, "-m", "exporter"]


def render_rules(path: Path) -> Path:
    """rules.yml with the collapse windows shortened, every group evaluated each second."""
    doc = yaml.safe_load(RULES.read_text())
    replaced = dict.fromkeys(SHORTER, 0)
    for group in doc["groups"]:
        group.pop("interval", None)
        for rule in group["rules"]:
            for long, short in SHORTER.items():
                replaced[long] += rule["expr"].count(long)
                rule["expr"] = rule["expr"].replace(long, short)
            if rule.get("alert") in ALERTS:
                rule["for"] = "3s"
    assert all(replaced.values()), replaced  # the shipped windows are still 5m and 6h
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _get(url: str, body: dict | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def _wait(what: str, probe: Callable[[], Any], timeout: float, logs: Path) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as exc:  # not listening yet
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                      for p in sorted(logs.glob("*.log")))
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}\n{tails}")


@contextmanager
def _launch(name: str, cmd: list[str], work: Path) -> Iterator[subprocess.Popen]:
    """A subprocess logging to work/<name>.log, ended (and reaped) when the block exits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
    with (work / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def _traffic(proxies: dict[str, int]) -> Iterator[dict[str, list[int]]]:
    """Completions through each recording proxy, about 5 a second each, until the block exits."""
    statuses: dict[str, list[int]] = {name: [] for name in proxies}
    stop = threading.Event()

    def send() -> None:
        while not stop.wait(0.2):
            for name, port in proxies.items():
                status, _ = _get(f"http://127.0.0.1:{port}/v1/completions",
                                 {"model": "m", "prompt": "p", "max_tokens": 24})
                statuses[name].append(status)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield statuses
    finally:
        stop.set()
        thread.join(15)


class Prometheus:
    """Instant queries against one Prometheus."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> dict[str, float]:
        """target label -> value of each series of the result."""
        status, body = _get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        assert status == 200 and body["status"] == "success", body
        return {r["metric"].get("target", ""): float(r["value"][1])
                for r in body["data"]["result"]}

    def alerts(self, state: str | None = None) -> set[tuple[str, str]]:
        """(alertname, target) of the collapse alerts in ALERTS, pending or firing."""
        matcher = f', alertstate="{state}"' if state else ""
        status, body = _get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": f'ALERTS{{alertname=~"{"|".join(ALERTS)}"{matcher}}}'}))
        assert status == 200, body
        return {(r["metric"]["alertname"], r["metric"]["target"])
                for r in body["data"]["result"]}


def test_collapse_fires_for_the_collapsing_server_only(tmp_path):
    prometheus = tool("prometheus")
    ports = {name: free_port() for name in
             [*FAKES, *(f"proxy-{n}" for n in FAKES), "exporter", "prometheus"]}
    (tmp_path / "exporter.yaml").write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{ports['exporter']}",
        "scrape_interval": "1s", "scrape_timeout": "800ms",
        "output_dir": str(tmp_path / "results"),
        "targets": [{"name": name, "url": f"http://127.0.0.1:{ports[name]}/metrics",
                     "proxy": {"listen": f"127.0.0.1:{ports[f'proxy-{name}']}"}}
                    for name in FAKES],
    }))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(render_rules(tmp_path / "rules.yml"))],
        "scrape_configs": [{"job_name": "specdec-exporter", "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{ports['exporter']}"]}]}],
    }))
    prom = Prometheus(f"http://127.0.0.1:{ports['prometheus']}")
    with ExitStack() as stack:
        stack.enter_context(_launch("prometheus", [
            prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--log.level=warn"],
            tmp_path))
        for name, seed in FAKES.items():
            stack.enter_context(_launch(name, [*CLI, "fake-vllm", "--port", str(ports[name]),
                                               "--seed", seed, *FAKE_ARGS], tmp_path))
        stack.enter_context(_launch("exporter", [
            *CLI, "serve", "--config", str(tmp_path / "exporter.yaml")], tmp_path))
        for url in (f"http://127.0.0.1:{ports['exporter']}/-/ready", f"{prom.url}/-/ready"):
            _wait(url, lambda u=url: _get(u)[0] == 200, 30, tmp_path)
        sent = stack.enter_context(_traffic({n: ports[f"proxy-{n}"] for n in FAKES}))

        # Both healthy, with enough evidence and a baseline: no collapse alert, not even pending.
        healthy = (
            "specdec_target:drafts:increase5m >= 1000"
            " and specdec_target:requests:increase5m >= 20"
            " and specdec_target:acceptance_length:increase6h >= 2")
        _wait("both targets healthy with evidence", lambda: set(prom.query(healthy)) == set(FAKES),
              30, tmp_path)
        assert prom.alerts() == set()

        status, body = _get(f"http://127.0.0.1:{ports['collapsing']}/control/acceptance",
                            {"acceptance": 0.0})
        assert status == 200, body
        expected = {(alert, "collapsing") for alert in ALERTS}
        _wait("both alerts firing for the collapsing server",
              lambda: prom.alerts("firing") >= expected, 40, tmp_path)
        assert prom.alerts() == expected  # nothing for the steady server, pending or firing

        # What the alerts saw: nothing accepted at all, by the counters and by every request.
        assert prom.query("specdec_target:acceptance_length:rate5m")["collapsing"] == 1.0
        assert prom.query("specdec_target:acceptance_length:rate5m")["steady"] > 2
        shares = prom.query("specdec_target:requests_nothing_accepted_ratio:increase5m")
        assert shares["collapsing"] == 1.0 and shares["steady"] < 0.2, shares
    assert all(set(statuses) == {200} and len(statuses) >= 20 for statuses in sent.values()), {
        name: (len(s), set(s)) for name, s in sent.items()}
