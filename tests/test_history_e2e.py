"""`history` against real stores: Debian's prometheus and victoria-metrics scraping fake-vllm.

One fake server is restarted inside the range (its counters start again from zero). The
history window's integer counts must equal the reset-safe increase worked out here, by hand,
from the raw samples the store itself returns.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import free_port, tool

pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "exporter"]
FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
NAMES = {
    "num_drafts": "vllm:spec_decode_num_drafts_total",
    "num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        body: bytes = answer.read()
        return body


def _wait(what: str, probe, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if probe():
                return
        except OSError:
            pass
        time.sleep(0.25)
    pytest.fail(f"{what} not ready after {timeout:.0f} s")


def _fake(port: int, work: Path, seed: str) -> subprocess.Popen[bytes]:
    with open(work / f"fake-{port}-{time.monotonic_ns()}.log", "wb") as log:
        proc = subprocess.Popen([*CLI, "fake-vllm", "--port", str(port), "--k", "3",
                                 "--drafts-per-second", "40", "--seed", seed],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    _wait(f"fake-vllm {port}", lambda: bool(_get(f"http://127.0.0.1:{port}/metrics")))
    return proc


def _store(kind: str, port: int, targets: list[str], work: Path) -> subprocess.Popen[bytes]:
    config = work / f"{kind}.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": targets}]}],
    }))
    if kind == "prometheus":
        cmd = [tool("prometheus"), f"--config.file={config}",
               f"--storage.tsdb.path={work / 'tsdb'}",
               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    else:
        # No latency offset: an instant query at `to` must see the samples up to `to`.
        cmd = [tool("victoria-metrics", "apt-get install victoria-metrics"),
               f"-promscrape.config={config}", f"-storageDataPath={work / 'vm'}",
               f"-httpListenAddr=127.0.0.1:{port}", "-search.latencyOffset=0s",
               "-search.disableCache", "-loggerLevel=ERROR"]
    with open(work / f"{kind}.log", "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


Samples = list[tuple[float, float]]


def _raw(store: str, frm: float, to: float) -> dict[str, dict[str, list[Samples]]]:
    """Per instance, per field, each `_total` series' raw samples in [frm, to]."""
    span = f"{round((to - frm) * 1000) + 1}ms"
    out: dict[str, dict[str, list[Samples]]] = {}
    for fld, name in NAMES.items():
        query = urllib.parse.urlencode({"query": f"{name}[{span}]", "time": f"{to:.3f}"})
        doc = json.loads(_get(f"{store}/api/v1/query?{query}"))
        for item in doc["data"]["result"]:
            samples = [(float(t), float(v)) for t, v in item["values"] if frm <= float(t) <= to]
            out.setdefault(item["metric"]["instance"], {}).setdefault(fld, []).append(samples)
    return out


def _by_hand(series: list[list[tuple[float, float]]]) -> tuple[int, int]:
    """Reset-safe increase summed over series, and how many times a counter went down."""
    total, resets = 0.0, 0
    for every in series:
        # VictoriaMetrics returns staleness markers (NaN) where Prometheus drops them; the
        # exporter skips an unusable scrape and the next usable one bridges it.
        samples = [s for s in every if not math.isnan(s[1])]
        for (_, before), (_, now) in zip(samples, samples[1:], strict=False):
            if now < before:
                total, resets = total + now, resets + 1
            else:
                total += now - before
    return int(total), resets


def _samples_of(store: str, instance: str, after: float) -> int:
    query = urllib.parse.urlencode({"query": f'{NAMES["num_drafts"]}{{instance="{instance}"}}[1h]'})
    doc = json.loads(_get(f"{store}/api/v1/query?{query}"))
    return sum(sum(1 for t, _ in r["values"] if float(t) > after) for r in doc["data"]["result"])


@pytest.mark.parametrize("kind", ["prometheus", "victoria-metrics"])
def test_history_counts_equal_raw_reset_safe_increase(kind: str, tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    instances = [f"127.0.0.1:{p}" for p in ports]
    store_port = free_port()
    store = f"http://127.0.0.1:{store_port}"
    procs = [_fake(ports[0], tmp_path, "1"), _fake(ports[1], tmp_path, "2")]
    procs.append(_store(kind, store_port, instances, tmp_path))
    try:
        start = time.time()
        _wait(f"{kind} samples", lambda: _samples_of(store, instances[0], start) >= 3)
        frm = time.time()
        _wait("samples after from", lambda: _samples_of(store, instances[0], frm) >= 3)
        # The restart: counters start again from zero, inside [frm, to].
        procs[0].send_signal(signal.SIGTERM)
        procs[0].wait(timeout=30)
        restarted = time.time()
        procs[0] = _fake(ports[0], tmp_path, "3")
        _wait("samples after the restart", lambda: _samples_of(store, instances[0], restarted) >= 3)
        to = time.time()
        if kind == "victoria-metrics":
            _get(f"{store}/internal/force_flush")
        out = tmp_path / "out"
        done = subprocess.run([*CLI, "history", "--prometheus", store, "--from", str(frm),
                               "--to", str(to), "--match", '{job="vllm"}', "--json",
                               "--output-dir", str(out)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        raw = _raw(store, frm, to)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert answer["source"] == "prometheus"
    assert answer["query"] == store
    assert sorted(answer["results"]) == sorted(instances)
    for instance in instances:
        result = answer["results"][instance]
        resets = 0
        for fld in FIELDS:
            expected, went_down = _by_hand(raw[instance][fld])
            assert result["increase"][fld] == expected, (instance, fld)
            resets = max(resets, went_down)
        history = result["history"]
        times = sorted({t for s in raw[instance]["num_drafts"] for t, _ in s})
        assert history["first_sample"] == times[0]
        assert history["last_sample"] == times[-1]
        assert history["first_sample_iso"] in result["coverage_note"]
        if instance == instances[0]:
            assert resets == 1
            assert "restart" in (result["reset_note"] or "")
        else:
            assert resets == 0
    files = json.loads((out / "window.json").read_text())
    assert files["results"] == answer["results"]
    assert len(list((out / "performances").glob("spec_decode_*.json"))) == 2


def test_history_says_when_the_store_is_down(tmp_path: Path) -> None:
    done = subprocess.run([*CLI, "history", "--prometheus", f"http://127.0.0.1:{free_port()}",
                           "--from=-30m", "--to", "now"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "is not reachable" in done.stderr
