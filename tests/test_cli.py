"""The real CLI in subprocesses: durability across SIGKILL, window/run/measure, demo, serve."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from clitools import CLI, fake_add, fake_vllm, free_port, http, process, wait_http, write_config

from exporter.results import result_file_name


def _wait_scrapes(base: str, window_id: str, at_least: int, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        status, state = http("GET", f"{base}/api/v1/windows/{window_id}")
        if status == 200 and min(state["scrapes"].values(), default=0) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"window {window_id} did not reach {at_least} scrapes")


class TestDurability:
    @pytest.mark.parametrize("restart_server_while_down", [False, True])
    def test_sigkill_keeps_the_open_window(self, tmp_path, restart_server_while_down):
        with fake_vllm("--k", "2") as vllm:
            fake_add(vllm, 100, 200, [90, 80])  # before the window: must not count
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            config = write_config(tmp_path / "c.yaml", port,
                                  [{"name": "a", "url": f"http://127.0.0.1:{vllm}/metrics"}])
            serve = CLI + ["serve", "--config", str(config)]
            with process(serve) as first:
                wait_http(f"{base}/-/ready")
                started = subprocess.run(
                    CLI + ["window", "start", "--exporter", base, "--id", "k1"],
                    capture_output=True, text=True, timeout=30,
                )
                assert started.returncode == 0, started.stderr
                assert started.stdout.strip() == "k1"
                fake_add(vllm, 10, 20, [9, 5])
                _wait_scrapes(base, "k1", 4)  # saved after a round past the first 250 ms
                first.send_signal(signal.SIGKILL)
                first.wait(timeout=10)
            if restart_server_while_down:
                status, _ = http("POST", f"http://127.0.0.1:{vllm}/control/restart")
                assert status == 200
            fake_add(vllm, 5, 10, [4, 2])
            with process(serve):
                wait_http(f"{base}/-/ready")
                stopped = subprocess.run(
                    CLI + ["window", "stop", "--exporter", base, "k1", "--json"],
                    capture_output=True, text=True, timeout=30,
                )
        assert stopped.returncode == 0, stopped.stderr
        result = json.loads(stopped.stdout)["results"]["a"]
        assert result["status"] == "ok"
        assert result["data"]["num_drafts"] == 15
        assert result["data"]["draft_tokens"] == 30
        assert result["data"]["accepted_tokens"] == 20
        assert result["data"]["per_position_acceptance_rates"] == {
            "0": 13 / 15, "1": 7 / 15}
        if restart_server_while_down:
            assert result["resets"] == 1
            assert "while the exporter was down" in result["reset_note"]
        else:
            assert result["resets"] == 0


class TestServeSignals:
    def test_sigterm_saves_and_sighup_reloads(self, tmp_path):
        with fake_vllm() as vllm:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            target = {"name": "a", "url": f"http://127.0.0.1:{vllm}/metrics"}
            config = write_config(tmp_path / "c.yaml", port, [target])
            with process(CLI + ["serve", "--config", str(config)]) as serve:
                wait_http(f"{base}/-/ready")
                assert http("POST", f"{base}/api/v1/windows", {"id": "t1"})[0] == 201
                write_config(tmp_path / "c.yaml", port, [target, target | {"name": "b"}])
                serve.send_signal(signal.SIGHUP)
                end = time.monotonic() + 10
                while time.monotonic() < end:
                    names = [t["name"] for t in http("GET", f"{base}/api/v1/targets")[1]["targets"]]
                    if names == ["a", "b"]:
                        break
                    time.sleep(0.05)
                assert names == ["a", "b"]
                serve.send_signal(signal.SIGTERM)
                assert serve.wait(timeout=15) == 0
                log = serve.stderr.read()
            assert "window started id=t1" in log
            assert "GET /api/v1/targets" not in log  # access logs only at debug
            with process(CLI + ["serve", "--config", str(config)]):
                wait_http(f"{base}/-/ready")
                status, state = http("GET", f"{base}/api/v1/windows/t1")
        assert status == 200 and state["status"] == "open"

    def test_invalid_config_exits_1_naming_the_key(self, tmp_path):
        bad = tmp_path / "bad.yaml"
        bad.write_text("scrape_intervall: 5s\n")
        done = subprocess.run(CLI + ["serve", "--config", str(bad)], capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 1
        assert "scrape_intervall: unknown key" in done.stderr


class TestRun:
    def _exporter(self, tmp_path, vllm):
        port = free_port()
        config = write_config(tmp_path / "c.yaml", port,
                              [{"name": "a", "url": f"http://127.0.0.1:{vllm}/metrics"}])
        return port, CLI + ["serve", "--config", str(config)]

    def test_run_wraps_the_command_and_keeps_its_exit_code(self, tmp_path):
        with fake_vllm("--k", "2") as vllm:
            port, serve = self._exporter(tmp_path, vllm)
            with process(serve):
                wait_http(f"http://127.0.0.1:{port}/-/ready")
                bench = (
                    "import json,urllib.request,sys;"
                    f"r=urllib.request.Request('http://127.0.0.1:{vllm}/control/add',"
                    "data=json.dumps({'engine':0,'drafts':4,'draft_tokens':8,"
                    "'accepted_per_pos':[3,1]}).encode(),method='POST');"
                    "urllib.request.urlopen(r);sys.exit(3)"
                )
                done = subprocess.run(
                    CLI + ["run", "--exporter", f"http://127.0.0.1:{port}", "--name", "r",
                           "--", "python", "-c", bench],
                    capture_output=True, text=True, timeout=60,
                )
        assert done.returncode == 3
        assert f"[127.0.0.1:{vllm}]" in done.stdout
        assert "Acceptance rate (%)                           50.00" in done.stdout
        assert "Drafts                                        4" in done.stdout

    def test_run_without_exporter_still_runs_the_command(self, tmp_path):
        marker = tmp_path / "ran"
        done = subprocess.run(
            CLI + ["run", "--exporter", f"http://127.0.0.1:{free_port()}", "--",
                   "python", "-c", f"open({str(marker)!r}, 'w').write('x')"],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0
        assert marker.exists()
        assert "Status                                        N/A" in done.stdout
        assert "unreachable" in done.stdout

    def test_run_closes_the_window_on_ctrl_c(self, tmp_path):
        with fake_vllm("--k", "2") as vllm:
            port, serve = self._exporter(tmp_path, vllm)
            base = f"http://127.0.0.1:{port}"
            with process(serve):
                wait_http(f"{base}/-/ready")
                started = tmp_path / "started"
                command = f"open({str(started)!r}, 'w').close(); import time; time.sleep(60)"
                with process(CLI + ["run", "--exporter", base, "--id", "cc", "--",
                                    sys.executable, "-c", command]) as run:
                    # Ctrl-C once the command runs (so the window is open around it).
                    end = time.monotonic() + 30
                    while not started.exists():
                        assert time.monotonic() < end and run.poll() is None
                        time.sleep(0.05)
                    run.send_signal(signal.SIGINT)
                    code = run.wait(timeout=30)
                    out = run.stdout.read()
                status, state = http("GET", f"{base}/api/v1/windows/cc")
        assert code == 130
        assert state["stopped_at"] is not None
        assert "Speculative Decoding Metrics" in out


class TestMeasure:
    def test_measure_writes_aisbench_files_and_counts_a_restart(self, tmp_path):
        with fake_vllm("--k", "2") as vllm:
            fake_add(vllm, 50, 100, [50, 50])
            bench = (
                "import json,time,urllib.request as u\n"
                f"b='http://127.0.0.1:{vllm}/control/'\n"
                "def add(d,t,p):\n"
                " u.urlopen(u.Request(b+'add',data=json.dumps({'engine':0,'drafts':d,"
                "'draft_tokens':t,'accepted_per_pos':p}).encode(),method='POST'))\n"
                "add(10,20,[8,4]); time.sleep(0.6)\n"
                "u.urlopen(u.Request(b+'restart',method='POST'))\n"
                "add(6,12,[6,0]); time.sleep(0.6)\n"
            )
            done = subprocess.run(
                CLI + ["measure", "--target", f"127.0.0.1:{vllm}", "--work-dir", str(tmp_path),
                       "--interval", "0.2", "--", "python", "-c", bench],
                capture_output=True, text=True, timeout=60,
            )
        assert done.returncode == 0, done.stderr
        path = tmp_path / "performances" / result_file_name(f"127.0.0.1:{vllm}")
        result = json.loads(path.read_text())
        assert set(result) >= {"status", "url", "error", "data", "raw"}
        assert result["data"]["num_drafts"] == 16
        assert result["data"]["accepted_tokens"] == 18
        assert result["resets"] == 1
        assert f"[127.0.0.1:{vllm}]" in done.stdout

    def test_measure_reads_an_aisbench_model_config(self, tmp_path):
        with fake_vllm("--k", "1") as vllm:
            model_config = tmp_path / "vllm_api.py"
            model_config.write_text(
                "from ais_bench.benchmark.models import VLLMCustomAPIChat\n"
                "models = [dict(attr='service', type=VLLMCustomAPIChat, abbr='x',\n"
                f"    host_ip='127.0.0.1', host_port={vllm}, enable_ssl=False, max_out_len=512)]\n"
            )
            done = subprocess.run(
                CLI + ["measure", "--model-config", str(model_config), "--work-dir",
                       str(tmp_path), "--", "python", "-c", "raise SystemExit(7)"],
                capture_output=True, text=True, timeout=60,
            )
        assert done.returncode == 7  # the command's code, whatever the collection gave
        result = json.loads((tmp_path / "performances" /
                             result_file_name(f"127.0.0.1:{vllm}")).read_text())
        assert result["status"] == "na"
        assert result["error"] == "No spec decode activity detected during benchmark window"

    def test_measure_unreachable_target_never_changes_exit_code(self, tmp_path):
        port = free_port()
        done = subprocess.run(
            CLI + ["measure", "--target", f"127.0.0.1:{port}", "--work-dir", str(tmp_path),
                   "--", "python", "-c", "pass"],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0
        result = json.loads((tmp_path / "performances" /
                             result_file_name(f"127.0.0.1:{port}")).read_text())
        assert result["status"] == "na"
        assert "at window start" in result["error"] and "at window stop" in result["error"]


class TestDemo:
    def test_demo_prints_figures_and_passes_promtool(self, tmp_path, promtool):
        port = free_port()
        with process(CLI + ["demo", "--port", str(port), "--duration", "14",
                            "--output-dir", str(tmp_path)]) as demo:
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            end = time.monotonic() + 30
            while not list(tmp_path.glob("*/window.json")):
                assert time.monotonic() < end, "demo recorded no window"
                time.sleep(0.2)
            status, body = http("GET", f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            checked = subprocess.run([promtool, "check", "metrics"], input=body,
                                     capture_output=True, text=True, timeout=30)
            out, _ = demo.communicate(timeout=40)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.strip() == "" and checked.stderr.strip() == ""
        assert demo.returncode == 0
        assert out.count("Speculative Decoding Metrics") == 5  # four servers and `all`
        assert "No spec decode metrics found on server" in out
        assert "[all]" in out
        assert "llama-eagle-k3" in out  # live figures table
        assert 'specdec_acceptance_ratio{demo="true",target="llama-eagle-k3"}' in body
