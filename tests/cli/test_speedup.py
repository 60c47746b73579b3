"""`compare A B` where A ran without speculative decoding and B with it: the paired speed-up
from the proxy's timings, its interval, the `--fail-if-slower` gate's exit codes, and `advise`
taking the measured step cost; through fake-vllm servers whose steps take time."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from clitools import CLI, fake_vllm, free_port, http, process, wait_http, write_config

REQUESTS = 12
STEP = ("--step-ms", "4", "--enable-per-request-metrics")


def _ask(proxy: int, i: int, tag: str | None = None) -> None:
    stream = i % 2 == 0
    body = {"model": "fake/llama-3-8b", "prompt": "a b c", "max_tokens": 24, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(f"http://127.0.0.1:{proxy}/v1/completions",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"}
                                     | ({"X-Specdec-Tag": tag} if tag else {}))
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120)


@dataclass(frozen=True)
class Served:
    url: str
    out: Path  # each window's result folder: performances/ and window.json


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    """An exporter over a no-spec and a spec fake-vllm, a timed window of each (and one with
    no request): its URL."""
    tmp = tmp_path_factory.mktemp("speedup")
    with fake_vllm("--no-spec-decode", *STEP) as nospec, fake_vllm(
            "--k", "3", "--acceptance", "0.8", "--per-request-spec-decode-metrics", "summary",
            *STEP) as spec:
        port, proxies = free_port(), {"nospec": free_port(), "spec": free_port()}
        targets = [{"name": name, "url": f"http://127.0.0.1:{server}/metrics",
                    "proxy": {"listen": f"127.0.0.1:{proxies[name]}"}}
                   for name, server in (("nospec", nospec), ("spec", spec))]
        config = write_config(tmp / "c.yaml", port, targets)
        with process(CLI + ["serve", "--config", str(config)]):
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/-/ready")
            for window, target in (("a", "nospec"), ("b", "spec"), ("idle", "spec")):
                status, _ = http("POST", f"{url}/api/v1/windows",
                                 {"id": window, "targets": [target]})
                assert status == 201
                for i in range(REQUESTS if window != "idle" else 0):
                    _ask(proxies[target], i)
                status, _ = http("POST", f"{url}/api/v1/windows/{window}/stop", {})
                assert status == 200
            for window, target in (("ca", "nospec"), ("cb", "spec")):
                _loaded_window(url, window, proxies[target])
            yield Served(url, tmp / "out")


def _loaded_window(url: str, window: str, proxy: int) -> None:
    """A window at two concurrency levels: SEQUENTIAL requests one at a time (band 1), then
    BURST at once (bands 2-3 and up, too few each for an interval); all tagged `bench`."""
    status, _ = http("POST", f"{url}/api/v1/windows", {"id": window, "targets": [
        "nospec" if window == "ca" else "spec"]})
    assert status == 201
    for i in range(SEQUENTIAL):
        _ask(proxy, i, "bench")
    threads = [threading.Thread(target=_ask, args=(proxy, i, "bench")) for i in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    status, _ = http("POST", f"{url}/api/v1/windows/{window}/stop", {})
    assert status == 200


SEQUENTIAL, BURST = 14, 8


@pytest.mark.e2e
class TestSpeedupByBand:
    def test_per_concurrency_band_and_tag_with_too_few_saying_so(self, windows):
        done = _cli("compare", "ca", "cb", "--exporter", windows.url, "--json",
                    "--fail-if-slower")
        assert done.returncode == 0, done.stderr
        speed = json.loads(done.stdout)["speedup"]
        bands = speed["by"]["concurrency"]
        single = bands["1"]
        assert min(single["a_timed"], single["b_timed"]) >= SEQUENTIAL - 1
        headline = next(r for r in single["rows"] if (r["figure"], r["stat"]) == (
            "tokens_per_second", "mean"))
        assert headline["speedup"]["low"] > 1 and headline["verdict"] == "faster"
        busy = {band: entry for band, entry in bands.items() if band != "1"}
        assert busy  # BURST requests at once meet others in flight in both windows
        for entry in busy.values():  # fewer than BURST requests each: no interval
            assert entry["rows"] == [] and "too few timed requests" in entry["note"]
        tag = speed["by"]["tag"]
        assert list(tag) == ["bench"]
        assert tag["bench"]["a_timed"] == speed["aggregate"]["a_timed"] == SEQUENTIAL + BURST
        gate = json.loads(done.stdout)["speed_gate"]
        assert [c["target"] for c in gate["checks"]] == ["all"]  # not per band or tag

    def test_the_console_lists_each_band_and_tag(self, windows):
        done = _cli("compare", "ca", "cb", "--exporter", windows.url)
        assert done.returncode == 0, done.stderr
        assert "[concurrency 1]  timed answers" in done.stdout
        assert "[tag bench]  timed answers" in done.stdout
        assert "too few timed requests" in done.stdout

    def test_advise_measures_the_step_cost_per_band_when_both_carry_it(self, windows):
        done = _cli("advise", "cb", "--baseline", "ca", "--exporter", windows.url, "--json")
        assert done.returncode == 0, done.stderr
        body = json.loads(done.stdout)
        measured = body["measured_cost"]
        assert list(measured["by_concurrency"]) == ["1"]  # the only band with enough in both
        assert measured["source"].startswith("per concurrency band (1)")
        assert body["draft_costs"] == [measured["by_concurrency"]["1"]["value"]]
        text = _cli("advise", "cb", "--baseline", "ca", "--exporter", windows.url).stdout
        assert "costs used: per concurrency band" in text and "concurrency 1: c = " in text


@pytest.mark.e2e
class TestPairedSpeedup:
    def test_b_is_faster_with_an_interval_and_the_gate_passes(self, windows):
        done = _cli("compare", "a", "b", "--exporter", windows.url, "--json", "--fail-if-slower")
        assert done.returncode == 0, done.stderr
        body = json.loads(done.stdout)
        entry = body["speedup"]["aggregate"]
        assert (entry["a_timed"], entry["b_timed"]) == (REQUESTS, REQUESTS)
        rows = {(r["figure"], r["stat"]): r for r in entry["rows"]}
        headline = rows["tokens_per_second", "mean"]
        assert headline["speedup"]["low"] > 1 and headline["verdict"] == "faster"
        assert headline["speedup"]["value"] == pytest.approx(headline["b"] / headline["a"])
        assert rows["tpot_ms", "p50"]["speedup"]["value"] > 1
        assert ("itl_ms", "p50") in rows  # the streamed answers' chunk gaps
        assert body["speed_gate"]["tripped"] is False

    def test_the_gate_trips_when_b_falls_short_of_the_ratio_or_is_slower(self, windows):
        done = _cli("compare", "a", "b", "--exporter", windows.url, "--fail-if-slower=50")
        assert done.returncode == 1, done.stderr
        assert "FAIL --fail-if-slower 50 [all]" in done.stdout
        done = _cli("compare", "b", "a", "--exporter", windows.url, "--fail-if-slower")
        assert done.returncode == 1, done.stderr
        assert "FAIL --fail-if-slower 1 [all]" in done.stdout

    def test_the_console_shows_the_speedup_table(self, windows):
        done = _cli("compare", "a", "b", "--exporter", windows.url)
        assert done.returncode == 0, done.stderr
        assert "Paired speed-up (A without speculative decoding, B with it)" in done.stdout
        line = next(x for x in done.stdout.splitlines() if x.startswith("tokens_per_second mean"))
        assert line.rstrip().endswith("faster")

    @pytest.mark.parametrize("args", [("a", "idle", "--fail-if-slower"),
                                      ("a", "b", "--fail-if-slower=0"),
                                      ("a", "b", "--fail-if-slower=fast")])
    def test_no_timings_or_a_bad_ratio_is_a_usage_error(self, windows, args):
        done = _cli("compare", *args, "--exporter", windows.url)
        assert done.returncode == 2, done.stdout


@pytest.mark.e2e
class TestAdviseMeasuredCost:
    def test_the_baseline_window_gives_the_draft_cost_used_instead_of_assumed_ones(
            self, windows):
        done = _cli("advise", "b", "--baseline", "a", "--exporter", windows.url, "--json")
        assert done.returncode == 0, done.stderr
        body = json.loads(done.stdout)
        measured = body["measured_cost"]
        assert measured["value"] >= 0 and body["draft_costs"] == [measured["value"]]
        assert measured["step_ratio"] == pytest.approx(
            measured["tpot_ms"] * measured["acceptance_length"] / measured["baseline_tpot_ms"])
        text = _cli("advise", "b", "--baseline", "a", "--exporter", windows.url).stdout
        assert "draft cost measured: c = " in text

    def test_a_baseline_without_timings_falls_back_to_the_assumed_costs(self, windows):
        done = _cli("advise", "b", "--baseline", "idle", "--exporter", windows.url, "--json")
        body = json.loads(done.stdout)
        assert "no timed requests" in body["measured_cost"]["error"]
        assert body["draft_costs"] == [0.0, 0.05, 0.1, 0.25]

    def test_ranking_k_by_acceptance_rate_is_refused_saying_why(self, windows):
        done = _cli("advise", "b", "--exporter", windows.url, "--rank-by", "acceptance_rate")
        assert done.returncode == 2
        assert "falls as k grows" in done.stderr


@pytest.mark.e2e
class TestResultFolders:
    def test_window_folders_carry_their_timings_to_compare(self, windows):
        done = _cli("compare", str(windows.out / "a"), str(windows.out / "b"), "--json",
                    "--fail-if-slower")
        assert done.returncode == 0, done.stderr
        entry = json.loads(done.stdout)["speedup"]["aggregate"]
        assert (entry["a_timed"], entry["b_timed"]) == (REQUESTS, REQUESTS)
