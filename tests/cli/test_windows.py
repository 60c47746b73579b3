"""`window start` as a user meets it: a reused id, a retried start, the limits, what exit 3 means."""

from __future__ import annotations

import subprocess
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
