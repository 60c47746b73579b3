"""The real CLI in subprocesses: durability across SIGKILL, window/run/measure, demo, serve."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clitools import (
    CLI,
    fake_add,
    fake_vllm,
    free_port,
    http,
    measured,
    process,
    serve_over,
    wait_http,
    write_config,
)

from exporter.core.aisbench import result_file_name
from exporter.state.schema import SCHEMA_VERSION
from exporter.state.store import StateStore

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


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
            port, serve = serve_over(tmp_path, vllm)
            base = f"http://127.0.0.1:{port}"
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
    def test_run_wraps_the_command_and_keeps_its_exit_code(self, tmp_path):
        with fake_vllm("--k", "2") as vllm:
            port, serve = serve_over(tmp_path, vllm)
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

    def test_run_without_exporter_still_runs_the_command_and_says_so_once(self, tmp_path):
        marker = tmp_path / "ran"
        port = free_port()
        done = subprocess.run(
            CLI + ["run", "--exporter", f"127.0.0.1:{port}", "--",
                   "python", "-c", f"open({str(marker)!r}, 'w').write('x')"],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0
        assert marker.exists()
        # No block pretending to be a server's: one line on stderr, naming the exporter.
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert line.startswith("specdec-exporter: no window recorded: exporter "
                               f"http://127.0.0.1:{port} unreachable: ")
        assert line.endswith("running the command anyway (--require-window to refuse)")

    def test_run_closes_the_window_on_ctrl_c(self, tmp_path):
        with fake_vllm("--k", "2") as vllm:
            port, serve = serve_over(tmp_path, vllm)
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
        path = measured(tmp_path) / result_file_name(f"127.0.0.1:{vllm}")
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
        result = json.loads((measured(tmp_path) /
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
        result = json.loads((measured(tmp_path) /
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


class TestListen:
    def test_listen_flag_beats_the_config(self, tmp_path):
        configured, flag = free_port(), free_port()
        config = write_config(tmp_path / "c.yaml", configured, [])
        with process(CLI + ["serve", "--config", str(config), "--listen",
                            f"127.0.0.1:{flag}"]):
            wait_http(f"http://127.0.0.1:{flag}/-/healthy")
            assert http("GET", f"http://127.0.0.1:{flag}/-/healthy")[0] == 200

    @pytest.mark.parametrize("command", ["serve", "fake-vllm", "demo"])
    def test_port_in_use_is_one_line_and_exit_2(self, tmp_path, command):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            args = {
                "serve": ["serve", "--config",
                          str(write_config(tmp_path / "c.yaml", free_port(), [])),
                          "--listen", f"127.0.0.1:{port}"],
                "fake-vllm": ["fake-vllm", "--port", str(port)],
                "demo": ["demo", "--port", str(port), "--duration", "1"],
            }[command]
            done = subprocess.run(CLI + args + ["--log-level", "error"], capture_output=True,
                                  text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            f"specdec-exporter: cannot listen on 127.0.0.1:{port}: address already in use; "
            f"stop what listens there, or choose another address with "
            f"{'--listen HOST:PORT' if command == 'serve' else '--port P'}"
        ]

    def test_demo_removes_its_temporary_folder(self, tmp_path):
        # The demo's temporary folder is made under $TMPDIR: here, a folder of our own.
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        done = subprocess.run(CLI + ["demo", "--port", str(free_port()), "--duration", "6"],
                              capture_output=True, text=True, timeout=90,
                              env=os.environ | {"TMPDIR": str(tmp)})
        assert done.returncode == 0, done.stderr
        assert f"results in {tmp}/specdec-demo-" in done.stdout
        assert "Speculative Decoding Metrics" in done.stdout
        assert list(tmp.iterdir()) == []


class TestLogOptions:
    @pytest.mark.parametrize("where", ["before", "after"])
    def test_log_level_on_either_side_of_the_command(self, tmp_path, where):
        port = free_port()
        config = write_config(tmp_path / "c.yaml", port, [])
        for level, shown in (("error", False), ("debug", True)):
            flags = ["--log-level", level, "--log-format", "json"]
            args = (flags + ["serve", "--config", str(config)] if where == "before"
                    else ["serve", "--config", str(config)] + flags)
            with process(CLI + args) as serve:
                wait_http(f"http://127.0.0.1:{port}/-/ready")
                serve.send_signal(signal.SIGTERM)
                assert serve.wait(timeout=30) == 0
                err = serve.stderr.read()
            logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
            assert any(entry["msg"].startswith("starting version=")
                       for entry in logged) is shown


class TestOneOwner:
    def test_taken_port_prints_only_the_error_line(self, tmp_path):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            config = write_config(tmp_path / "c.yaml", port, [])
            done = subprocess.run(CLI + ["serve", "--config", str(config)],
                                  capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            f"specdec-exporter: cannot listen on 127.0.0.1:{port}: address already in use; "
            "stop what listens there, or choose another address with --listen HOST:PORT"
        ]

    def test_a_newer_state_database_is_refused_in_one_line_and_kept(self, tmp_path):
        path = tmp_path / "out" / "state.sqlite"
        StateStore(path).close()
        with sqlite3.connect(path) as db:
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        db.close()
        original = path.read_bytes()
        config = write_config(tmp_path / "c.yaml", free_port(), [])
        done = subprocess.run(CLI + ["serve", "--config", str(config)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            f"specdec-exporter: state database {path} has schema version {SCHEMA_VERSION + 1}, "
            f"newer than this exporter's {SCHEMA_VERSION}: run the newer exporter, or set "
            "another state_db"
        ]
        assert path.read_bytes() == original and not list(path.parent.glob("*.corrupt-*"))

    def test_second_exporter_on_one_output_dir_refuses_naming_the_holder(self, tmp_path):
        first_port = free_port()
        config = write_config(tmp_path / "c.yaml", first_port, [])
        with process(CLI + ["serve", "--config", str(config)]) as first:
            wait_http(f"http://127.0.0.1:{first_port}/-/ready")
            done = subprocess.run(CLI + ["serve", "--config", str(config), "--listen",
                                         f"127.0.0.1:{free_port()}"],
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 1
            out = tmp_path / "out"
            assert done.stderr.splitlines() == [
                f"specdec-exporter: {out} is in use by another exporter (pid {first.pid}); "
                "stop it, or give this one another output_dir"
            ]
            assert http("GET", f"http://127.0.0.1:{first_port}/-/ready")[0] == 200
        # Once the holder has stopped, the folder is free again.
        with process(CLI + ["serve", "--config", str(config)]):
            wait_http(f"http://127.0.0.1:{first_port}/-/ready")


class TestHelp:
    def test_every_option_of_every_command_says_what_it_does(self):
        from exporter.cli.main import build_parser

        def parsers(parser, path):
            yield path, parser
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    for name, sub in action.choices.items():
                        yield from parsers(sub, f"{path} {name}")

        missing = []
        for path, parser in parsers(build_parser(), "specdec-exporter"):
            assert parser.format_help()  # a stray % in a help text breaks --help
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    continue
                if not action.help or len(action.help.split()) < 3:
                    missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        assert missing == []

    @pytest.mark.parametrize("command", ["run", "measure"])
    def test_run_and_measure_say_the_command_goes_after_dashes(self, command):
        done = subprocess.run(CLI + [command, "--help"], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0
        assert "-- CMD" in done.stdout and "after --" in done.stdout

    def test_fake_vllm_says_what_acceptance_means(self):
        done = subprocess.run(CLI + ["fake-vllm", "--help"], capture_output=True, text=True,
                              timeout=30)
        assert "chance that the first draft token is accepted" in " ".join(done.stdout.split())


class TestCheckConfig:
    def test_every_problem_in_one_run(self):
        done = subprocess.run(CLI + ["check-config", "tests/testdata/config/"
                                     "invalid-four-kinds.yaml"],
                              capture_output=True, text=True, timeout=30, cwd=ROOT)
        assert done.returncode == 1
        assert done.stdout.splitlines() == [
            "listen: must be host:port, not 'nohost'",
            "bogus: unknown key",
            "scrape_timeout: must not be longer than scrape_interval (5s > 1s)",
            'targets.1.name: duplicate target name "a" (also targets.0)',
        ]

    def test_yaml_syntax_error_has_line_and_column(self, tmp_path):
        bad = tmp_path / "bad.yaml"
        bad.write_text("listen: '127.0.0.1:9400'\ntargets: [\n  {url: x\n")
        done = subprocess.run(CLI + ["check-config", str(bad)], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 1
        assert re.fullmatch(r"\(yaml\): invalid YAML at line 4, column 1: .+\n", done.stdout)

    def test_missing_file_names_its_path(self, tmp_path):
        missing = tmp_path / "nope" / "exporter.yaml"
        done = subprocess.run(CLI + ["check-config", str(missing)], capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 1
        assert done.stdout == f"(file): cannot read {missing}: No such file or directory\n"


class TestProductionPath:
    def test_serve_does_not_import_the_simulator(self, tmp_path):
        # Everything `serve` imports, up to a built app; the simulator must not be among it.
        probe = (
            "import sys\n"
            "from exporter.cli.main import build_parser\n"
            "from exporter.cli.serving import cmd_serve\n"
            "from exporter.web.app import make_app\n"
            "from exporter.config.model import load_config\n"
            "import exporter.web.handlers, exporter.web.pages.landing, exporter.web.exposition, "
            "exporter.core.stopanswer\n"
            f"make_app(load_config({str(ROOT / 'config' / 'exporter.yaml')!r}))\n"
            "print(sorted(m for m in sys.modules if m.startswith('exporter.')))\n"
        )
        done = subprocess.run([*CLI[:1], "-c", probe], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        loaded = eval(done.stdout)  # a printed list of module names
        assert "exporter.web.app" in loaded and "exporter.core.dialects" in loaded
        assert [m for m in loaded if m.startswith("exporter.fakevllm")] == []


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=60, **kwargs)


class TestLoudFailures:
    def test_window_commands_name_failed_targets_and_exit_3(self, tmp_path):
        dead = free_port()
        with fake_vllm("--k", "2") as vllm:
            port = free_port()
            base = f"127.0.0.1:{port}"  # no scheme: http:// is meant
            config = write_config(tmp_path / "c.yaml", port, [
                {"name": "live", "url": f"http://127.0.0.1:{vllm}/metrics"},
                {"name": "dead", "url": f"http://127.0.0.1:{dead}/metrics"}])
            with process(CLI + ["serve", "--config", str(config)]):
                wait_http(f"http://{base}/-/ready")
                both = _cli("window", "start", "--exporter", base, "--id", "both")
                only_dead = _cli("window", "start", "--exporter", base, "--id", "d",
                                 "--target", "dead")
                allowed = _cli("window", "start", "--exporter", base, "--id", "d2",
                               "--target", "dead", "--allow-na")
                fake_add(vllm, 10, 20, [8, 4])
                stop_both = _cli("window", "stop", "--exporter", base, "both")
                stop_dead = _cli("window", "stop", "--exporter", base, "d")
                stop_allowed = _cli("window", "stop", "--exporter", base, "d2", "--allow-na")
        assert (both.returncode, both.stdout) == (0, "both\n")
        assert both.stderr.count("failed at window start") == 1
        assert "target dead failed at window start: " in both.stderr
        assert (only_dead.returncode, only_dead.stdout) == (3, "d\n")
        assert "every target of window d failed at start" in only_dead.stderr
        assert (allowed.returncode, allowed.stdout) == (0, "d2\n")
        assert stop_both.returncode == 0
        assert "target dead: no result: Failed to fetch metrics" in stop_both.stderr
        assert "target live" not in stop_both.stderr
        assert f"results written to {(tmp_path / 'out' / 'both').resolve()}" in stop_both.stderr
        assert stop_dead.returncode == 3
        assert "window d has no result for any target" in stop_dead.stderr
        assert stop_allowed.returncode == 0

    def test_run_says_when_the_window_has_no_result_and_keeps_the_code(self, tmp_path):
        dead = free_port()
        port = free_port()
        config = write_config(tmp_path / "c.yaml", port,
                              [{"name": "dead", "url": f"http://127.0.0.1:{dead}/metrics"}])
        with process(CLI + ["serve", "--config", str(config)]):
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            done = _cli("run", "--exporter", f"127.0.0.1:{port}", "--id", "r1", "--",
                        sys.executable, "-c", "raise SystemExit(5)")
        assert done.returncode == 5
        assert "window r1 started" in done.stderr
        assert "target dead failed at window start" in done.stderr
        assert "window r1 has no result" in done.stderr
        assert "results written to" in done.stderr

    def test_run_without_a_command_is_a_usage_error_and_records_nothing(self, tmp_path):
        port = free_port()
        config = write_config(tmp_path / "c.yaml", port, [])
        with process(CLI + ["serve", "--config", str(config)]):
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            done = _cli("run", "--exporter", f"http://127.0.0.1:{port}", "--")
            status, listed = http("GET", f"http://127.0.0.1:{port}/api/v1/windows")
        assert done.returncode == 2
        assert "give the command to run after --" in done.stderr
        assert status == 200 and listed["windows"] == []

    @pytest.mark.parametrize("targets", [[], ["--target", "not a target"],
                                         ["--target", "host:port"]])
    def test_measure_without_usable_target_is_a_usage_error_before_cmd(self, tmp_path,
                                                                        targets):
        marker = tmp_path / "ran"
        done = _cli("measure", *targets, "--work-dir", str(tmp_path), "--",
                    sys.executable, "-c", f"open({str(marker)!r}, 'w')")
        assert done.returncode == 2
        assert "usage:" in done.stderr and "--target" in done.stderr
        assert not marker.exists()

    def test_serve_logs_auth_and_a_clean_sigterm(self, tmp_path):
        port = free_port()
        config = write_config(tmp_path / "c.yaml", port, [])
        with process(CLI + ["serve", "--config", str(config)],
                     env={"SPECDEC_TOKEN": "s3cret"}) as serve:
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(timeout=30) == 0
            err = serve.stderr.read()
        assert "auth on: every POST needs the token of token_env=SPECDEC_TOKEN" in err
        assert "s3cret" not in err
        assert "shutting down: saving open windows count=0" in err
        assert err.rstrip().endswith("stopped: open windows saved")
