"""`window start` and `run` as a user meets them: a reused id, a retried start, the limits, what
exit 3 means, a window bounded by the traffic."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from clitools import CLI, fake_vllm, free_port, http, process, wait_http, write_config


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=60)


@pytest.fixture
def exporter(tmp_path):
    """A served exporter with one live fake-vllm target; yields its host:port."""
    with fake_vllm() as vllm:
        port = free_port()
        config = write_config(tmp_path / "c.yaml", port,
                              [{"name": "live", "url": f"http://127.0.0.1:{vllm}/metrics"}],
                              max_open_windows=5)
        with process(CLI + ["serve", "--config", str(config)]):
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            yield f"127.0.0.1:{port}"


class TestReusedId:
    def test_a_stopped_id_is_refused_saying_how_to_reuse_it(self, exporter):
        assert _cli("window", "start", "--exporter", exporter, "--id", "x").returncode == 0
        assert _cli("window", "stop", "--exporter", exporter, "x", "--allow-na").returncode == 0
        again = _cli("window", "start", "--exporter", exporter, "--id", "x", "--name", "second")
        assert again.returncode == 1
        assert again.stdout == ""
        [line] = again.stderr.splitlines()
        assert "answered 409" in line and 'window "x" was stopped at 20' in line
        assert "start a new id, or DELETE /api/v1/windows/x first" in line
        status, body = http("POST", f"http://{exporter}/api/v1/windows", {"id": "x"})
        assert status == 409 and "was stopped at" in body["error"]

    def test_an_identical_start_of_an_open_window_is_a_retry(self, exporter):
        first = _cli("window", "start", "--exporter", exporter, "--id", "y", "--name", "n")
        retry = _cli("window", "start", "--exporter", exporter, "--id", "y", "--name", "n")
        assert (first.returncode, first.stdout, first.stderr) == (0, "y\n", "")
        assert (retry.returncode, retry.stdout) == (0, "y\n")
        assert "window y already open" in retry.stderr

    @pytest.mark.parametrize("change", [["--name", "other"], ["--label", "k=v"],
                                        ["--target", "nope"]])
    def test_another_start_of_an_open_id_is_refused(self, exporter, change):
        assert _cli("window", "start", "--exporter", exporter, "--id", "z", "--name",
                    "n").returncode == 0
        other = _cli("window", "start", "--exporter", exporter, "--id", "z", "--name", "n",
                     *change)
        assert other.returncode == 1
        assert len(other.stderr.splitlines()) == 1
        assert "answered 4" in other.stderr  # 409, or 400 for a target nobody configured


class TestLimits:
    @pytest.mark.parametrize("name", ["state.sqlite", "state.sqlite-wal", "state.sqlite-shm",
                                      "STATE.SQLITE", "exporter.lock"])
    def test_ids_naming_the_exporters_own_files_are_refused(self, exporter, name):
        status, body = http("POST", f"http://{exporter}/api/v1/windows", {"id": name})
        assert status == 400
        assert "names a file of the exporter's own" in body["error"]

    def test_fifty_concurrent_starts_open_at_most_the_limit(self, exporter):
        def start(i: int) -> int:
            return http("POST", f"http://{exporter}/api/v1/windows", {"id": f"w{i}"})[0]

        with ThreadPoolExecutor(50) as pool:
            statuses = list(pool.map(start, range(50)))
        assert statuses.count(201) == 5
        assert statuses.count(429) == 45
        status, listing = http("GET", f"http://{exporter}/api/v1/windows")
        assert status == 200
        windows = listing["windows"] if isinstance(listing, dict) else listing
        assert len([w for w in windows if w.get("stopped_at") is None]) == 5


class TestExit3:
    def test_every_target_failed_says_the_window_is_open_and_how_to_close_it(self, tmp_path):
        port = free_port()
        config = write_config(tmp_path / "c.yaml", port, [
            {"name": "dead", "url": f"http://127.0.0.1:{free_port()}/metrics"}])
        with process(CLI + ["serve", "--config", str(config)]):
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            done = _cli("window", "start", "--exporter", f"127.0.0.1:{port}", "--id", "d")
            status, state = http("GET", f"http://127.0.0.1:{port}/api/v1/windows/d")
        assert done.returncode == 3
        [line] = [ln for ln in done.stderr.splitlines() if "every target" in ln]
        assert "it stays open: close it with `specdec-exporter window stop --allow-na" in line
        assert status == 200 and state.get("stopped_at") is None


# An AISBench-style benchmark: plain HTTP, one warm-up request, then three measured ones, each
# streamed; it writes what each answer reported (vLLM's per-request object) to a file.
BENCH = r"""
import json, sys, time, urllib.request
from exporter.core.perrequest import SUM_KEYS, from_sse
base, out = sys.argv[1], sys.argv[2]
time.sleep(0.6)  # start-up: window scrapes run, no request yet
seen = []
for n in (40, 9, 23, 14):
    body = json.dumps({"model": "m", "stream": True, "max_tokens": n,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "a b"}]}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as answer:
        spec = from_sse(answer.read()).spec
    seen.append({k: spec[k] for k in SUM_KEYS})
open(out, "w").write(json.dumps(seen))
time.sleep(0.6)  # wind-down: no request, window scrapes run
"""


# AISBench's requests for two models behind one server, one model after the other: GET
# /v1/models twice, the warm-up, GET /v1/models (and /metrics: its host_port is the proxy),
# then the measured requests; it writes the measured answers' figures to a file.
TWO_MODELS = r"""
import json, sys, urllib.request
from exporter.core.perrequest import SUM_KEYS, from_json
base, out = sys.argv[1], sys.argv[2]
def get(path):
    with urllib.request.urlopen(base + path, timeout=10) as answer:
        assert answer.status == 200
def post(model, n):
    body = json.dumps({"model": model, "prompt": "a b", "max_tokens": n}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as answer:
        spec = from_json(answer.read()).spec
    return {k: spec[k] for k in SUM_KEYS}
seen = []
for model in ("a", "b"):
    get("/v1/models"); get("/v1/models")
    post(model, 45)
    get("/v1/models"); get("/metrics")
    seen += [post(model, n) for n in (12, 31, 20)]
open(out, "w").write(json.dumps(seen))
"""


def _traffic_run(tmp_path, window_id: str, client: str) -> tuple[subprocess.CompletedProcess,
                                                                  dict, list]:
    """`run --edges traffic --skip-requests 1` of `client` (a script given the proxy's URL and a
    file for what it saw) through a served exporter's proxy port over fake-vllm: the run, the
    window's GET answer and what the client saw."""
    with fake_vllm("--per-request-spec-decode-metrics", "summary") as vllm:
        port, proxy = free_port(), free_port()
        config = write_config(
            tmp_path / "c.yaml", port,
            [{"name": "v", "url": f"http://127.0.0.1:{vllm}/metrics",
              "proxy": {"listen": f"127.0.0.1:{proxy}"}}],
            scrape_interval="1s", scrape_timeout="500ms", window_scrape_interval="100ms")
        with process(CLI + ["serve", "--config", str(config)]):
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            seen = tmp_path / "seen.json"
            run = _cli("run", "--exporter", f"127.0.0.1:{port}", "--id", window_id,
                       "--edges", "traffic", "--skip-requests", "1", "--", sys.executable,
                       "-c", client, f"http://127.0.0.1:{proxy}", str(seen))
            assert run.returncode == 0, run.stderr
            status, answer = http("GET", f"http://127.0.0.1:{port}/api/v1/windows/{window_id}")
            assert status == 200
    return run, dict(answer), json.loads(seen.read_text())


def _assert_counted(answer: dict, measured: list) -> None:
    data = answer["results"]["v"]["data"]
    assert (data["num_drafts"], data["draft_tokens"], data["accepted_tokens"]) == (
        sum(m["num_spec_steps"] for m in measured),
        sum(m["num_draft_tokens"] for m in measured),
        sum(m["num_accepted_draft_tokens"] for m in measured))


@pytest.mark.e2e
class TestRunWithTrafficEdges:
    def test_the_readme_recipe_leaves_out_each_models_warm_up(self, tmp_path):
        run, answer, measured = _traffic_run(tmp_path, "two", TWO_MODELS)
        assert "2 request(s) skipped, 6 measured" in run.stderr
        _assert_counted(answer, measured)
        assert answer["per_request"]["targets"]["v"]["requests"] == 6

    def test_run_edges_traffic_skips_the_warm_up_exactly(self, tmp_path):
        run, answer, seen = _traffic_run(tmp_path, "tw", BENCH)
        assert "opens at request 2 through the exporter's proxy" in run.stderr
        assert "1 request(s) skipped, 3 measured" in run.stderr
        assert "closed by the last response" in run.stderr
        _assert_counted(answer, seen[1:])

    def test_skip_requests_without_traffic_edges_is_a_usage_error(self):
        run = _cli("run", "--exporter", "127.0.0.1:1", "--skip-requests", "1", "--", "true")
        assert run.returncode == 2
        assert "--skip-requests needs --edges traffic" in run.stderr
