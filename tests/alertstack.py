"""A real Prometheus evaluating the collapse alerts over an exporter, for tests on loopback.

`render_rules` writes deploy/prometheus/rules.yml with the collapse windows shortened (5m and 6h
to a few seconds, every group evaluated each second, the two alerts' `for:` shortened); the
expressions and thresholds stay the shipped file's, but for `minimums`: the minimum counts of
drafts and requests in the short window, for servers slower than production's floor.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import http as request

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "rules.yml"
ALERTS = ("SpecDecAcceptanceCollapse", "SpecDecAcceptanceSplit")
_MINIMUM = re.compile(r"(specdec_target:(drafts|requests):increase5m >= )(\d+)")


def render_rules(path: Path, short: int, long: int, hold: str = "3s",
                 minimums: dict[str, int] | None = None) -> Path:
    """rules.yml with 5m as `short` seconds, 6h as `long`, the collapse alerts' `for:` `hold`,
    and the minimum `drafts` and `requests` of the short window replaced by `minimums`'."""
    doc = yaml.safe_load(RULES.read_text())
    windows = {"[5m]": f"[{short}s]", "[6h]": f"[{long}s]"}
    replaced = dict.fromkeys(windows, 0) | {"minimums": 0}
    for group in doc["groups"]:
        group.pop("interval", None)
        for rule in group["rules"]:
            for window, shorter in windows.items():
                replaced[window] += rule["expr"].count(window)
                rule["expr"] = rule["expr"].replace(window, shorter)
            if rule.get("alert") not in ALERTS:
                continue
            rule["for"] = hold
            if minimums:
                rule["expr"], n = _MINIMUM.subn(
                    lambda m: f"{m.group(1)}{minimums[m.group(2)]}", rule["expr"])
                replaced["minimums"] += n
    assert all(replaced[w] for w in windows), replaced  # the shipped windows are 5m and 6h
    assert replaced["minimums"] == (2 if minimums else 0), replaced  # one in each alert
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def http(url: str, body: dict | None = None) -> tuple[int, Any]:
    """(status, JSON or text) of a GET, or of a POST of `body`; never raises for a status."""
    return request("POST" if body is not None else "GET", url, body)


def wait(what: str, probe: Callable[[], Any], timeout: float, logs: Path,
         show: Callable[[], object] | None = None) -> Any:
    """Poll `probe` until truthy; fail after `timeout` seconds with the logs' tails (and what
    `show` returns then)."""
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
    seen = f"\n{show()!r}" if show is not None else ""
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}{seen}\n{tails}")


@contextmanager
def launch(name: str, cmd: list[str], work: Path) -> Iterator[subprocess.Popen]:
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
def repeating(send: Callable[[], None], pause: float) -> Iterator[list[str]]:
    """Call `send` in a thread, `pause` seconds apart, until the block exits; yields the
    connection errors it met (the thread carries on after one)."""
    stop = threading.Event()
    errors: list[str] = []

    def loop() -> None:
        while not stop.wait(pause):
            try:
                send()
            except OSError as exc:  # urllib's URLError and timeouts are OSErrors
                errors.append(repr(exc))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        stop.set()
        thread.join(150)


class Prometheus:
    """One real Prometheus scraping one exporter each second with rendered rules."""

    def __init__(self, binary: str, port: int, work: Path) -> None:
        self.binary, self.port, self.work = binary, port, work
        self.url = f"http://127.0.0.1:{port}"

    @contextmanager
    def running(self, exporter_port: int, rules: Path) -> Iterator[Prometheus]:
        """Prometheus started over the exporter, until the block exits."""
        config = self.work / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "specdec-exporter", "honor_labels": True,
                                "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}],
        }))
        with launch("prometheus", [
                self.binary, f"--config.file={config}",
                f"--storage.tsdb.path={self.work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"], self.work):
            wait("prometheus /-/ready", lambda: http(f"{self.url}/-/ready")[0] == 200, 30,
                 self.work)
            yield self

    def query(self, expr: str) -> dict[str, float]:
        """target label -> value of each series of the result."""
        status, body = http(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        assert status == 200 and body["status"] == "success", body
        return {r["metric"].get("target", ""): float(r["value"][1])
                for r in body["data"]["result"]}

    def alerts(self, state: str | None = None) -> set[tuple[str, str]]:
        """(alertname, target) of the collapse alerts in ALERTS, pending or firing."""
        matcher = f', alertstate="{state}"' if state else ""
        status, body = http(f"{self.url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": f'ALERTS{{alertname=~"{"|".join(ALERTS)}"{matcher}}}'}))
        assert status == 200, body
        return {(r["metric"]["alertname"], r["metric"]["target"])
                for r in body["data"]["result"]}
