"""What a newcomer trips on, through the real CLI: missing commands, silent no-results, SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from clitools import CLI, fake_add, fake_vllm, free_port, http, process, wait_http, write_config

pytestmark = pytest.mark.e2e  # every test runs the real CLI in a subprocess


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=90, **kwargs)


@contextmanager
def _served(tmp_path: Path, name: str) -> Iterator[tuple[int, str]]:
    """One fake-vllm (k=2) as target `name` of a served exporter: (fake-vllm's port, the
    exporter's host:port)."""
    port = free_port()
    with fake_vllm("--k", "2") as vllm:
        config = write_config(tmp_path / "c.yaml", port,
                              [{"name": name, "url": f"http://127.0.0.1:{vllm}/metrics"}])
        with process(CLI + ["serve", "--config", str(config)]):
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            yield vllm, f"127.0.0.1:{port}"


class TestRun:
    def test_a_missing_command_is_said_on_stderr_and_records_no_window(self, tmp_path):
        port = free_port()
        config = write_config(tmp_path / "c.yaml", port, [])
        with process(CLI + ["serve", "--config", str(config)]):
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            done = _cli("run", "--exporter", f"127.0.0.1:{port}", "--id", "r", "--",
                        "no-such-command-here")
            status, _ = http("GET", f"http://127.0.0.1:{port}/api/v1/windows/r")
        assert done.returncode == 127
        assert done.stdout == ""
        assert "cannot run 'no-such-command-here'" in done.stderr
        assert status == 404

    def test_require_window_refuses_to_run_the_command_without_one(self, tmp_path):
        marker = tmp_path / "ran"
        done = _cli("run", "--exporter", f"127.0.0.1:{free_port()}", "--require-window", "--",
                    sys.executable, "-c", f"open({str(marker)!r}, 'w')")
        assert done.returncode == 1
        assert "unreachable" in done.stderr and "--require-window" in done.stderr
        assert not marker.exists()
        # Without the flag the benchmark still runs, as before.
        done = _cli("run", "--exporter", f"127.0.0.1:{free_port()}", "--",
                    sys.executable, "-c", f"open({str(marker)!r}, 'w')")
        assert done.returncode == 0 and marker.exists()


class TestMeasure:
    def test_every_target_down_says_no_result_on_stderr(self, tmp_path):
        done = _cli("measure", "--target", f"127.0.0.1:{free_port()}", "--work-dir",
                    str(tmp_path), "--", sys.executable, "-c", "pass")
        assert done.returncode == 0  # the command's own code
        assert "no result" in done.stderr
        assert "measure has no result for any target" in done.stderr


class TestFakeVllm:
    def test_banner_without_spec_decode_prints_no_k(self):
        port = free_port()
        with process(CLI + ["fake-vllm", "--port", str(port), "--no-spec-decode"]) as fake:
            wait_http(f"http://127.0.0.1:{port}/metrics")
            banner = fake.stdout.readline()
        assert "k=" not in banner and "no spec decode" in banner


class TestDemo:
    def test_sigterm_cleans_up_like_ctrl_c(self, tmp_path):
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        port = free_port()
        with process(CLI + ["demo", "--port", str(port)],
                     env={"TMPDIR": str(tmp)}) as demo:
            wait_http(f"http://127.0.0.1:{port}/-/ready", deadline=60)
            assert list(tmp.iterdir()) != []
            demo.send_signal(signal.SIGTERM)
            assert demo.wait(timeout=60) == 0
        assert list(tmp.iterdir()) == []


class TestConfigErrors:
    def test_a_bad_listen_flag_is_blamed_on_the_flag(self, tmp_path):
        config = write_config(tmp_path / "c.yaml", free_port(), [])
        done = _cli("serve", "--config", str(config), "--listen", "nonsense")
        assert done.returncode == 1
        assert done.stderr.splitlines() == ["--listen: must be host:port, not 'nonsense'"]

    def test_a_near_miss_key_gets_did_you_mean(self, tmp_path):
        path = tmp_path / "c.yaml"
        path.write_text('scrape_intervall: 5s\ntargets:\n  - {name: a, urll: "http://x/m"}\n')
        done = _cli("check-config", str(path))
        assert done.returncode == 1
        assert "scrape_intervall: unknown key; did you mean scrape_interval?" in done.stdout
        assert "targets.0.urll: unknown key; did you mean url?" in done.stdout
        path.write_text("zzz: 1\ntargets: []\n")
        far = _cli("check-config", str(path), "--allow-empty")
        assert "zzz: unknown key\n" in far.stdout and "did you mean" not in far.stdout


class TestHostPortTargets:
    def test_a_config_names_servers_by_host_port_alone(self, tmp_path):
        port = free_port()
        with fake_vllm("--k", "2") as bare, fake_vllm("--k", "3") as by_url:
            path = tmp_path / "c.yaml"
            path.write_text(f"listen: 127.0.0.1:{port}\nscrape_interval: 250ms\n"
                            f"output_dir: {tmp_path / 'out'}\ntargets:\n"
                            f"  - 127.0.0.1:{bare}\n  - {{name: b, url: 127.0.0.1:{by_url}}}\n")
            checked = _cli("check-config", str(path))
            with process(CLI + ["serve", "--config", str(path)]):
                wait_http(f"http://127.0.0.1:{port}/-/ready")
                status, body = http("GET", f"http://127.0.0.1:{port}/api/v1/targets")
        assert checked.returncode == 0, checked.stdout
        assert status == 200
        assert [(t["name"], t["url"], t["up"]) for t in body["targets"]] == [
            (f"127.0.0.1:{bare}", f"http://127.0.0.1:{bare}/metrics", True),
            ("b", f"http://127.0.0.1:{by_url}/metrics", True)]


class TestReusedWorkDir:
    def test_each_measure_gets_a_fresh_timestamped_folder_and_keeps_the_last(self, tmp_path):
        with fake_vllm() as first, fake_vllm() as second:
            one = _cli("measure", "--target", f"127.0.0.1:{first}", "--work-dir", str(tmp_path),
                       "--interval", "0.2", "--", sys.executable, "-c", "pass")
            two = _cli("measure", "--target", f"127.0.0.1:{second}", "--work-dir",
                       str(tmp_path), "--interval", "0.2", "--", sys.executable, "-c", "pass")
        assert one.returncode == 0 and two.returncode == 0
        assert not (tmp_path / "performances").exists()
        runs = sorted(tmp_path.iterdir())
        assert len(runs) == 2 and all(re.fullmatch(r"\d{8}_\d{6}(_\d+)?", r.name) for r in runs)
        files = {r.name: sorted(p.name for p in (r / "performances").iterdir()) for r in runs}
        assert sorted(files.values()) == sorted([[f"spec_decode_127.0.0.1_{first}.json"],
                                                 [f"spec_decode_127.0.0.1_{second}.json"]])
        for done, port in ((one, first), (two, second)):
            (where,) = [line for line in done.stdout.splitlines() if "results in" in line]
            folder = Path(where.rsplit(" ", 1)[1])
            assert (folder / f"spec_decode_127.0.0.1_{port}.json").is_file()

    def test_compare_refuses_a_folder_of_two_windows(self, tmp_path):
        def result(first: float, last: float) -> dict:
            return {"status": "ok", "data": {"num_drafts": 10, "draft_tokens": 20,
                                             "accepted_tokens": 12, "acceptance_rate": 60.0,
                                             "acceptance_length": 2.2,
                                             "per_position_acceptance_rates": {"0": 0.6}},
                    "first_scrape_at": first, "last_scrape_at": last}

        mixed, single = tmp_path / "mixed" / "performances", tmp_path / "one" / "performances"
        for folder, spans in ((mixed, [(0, 100), (200, 300)]), (single, [(0, 100), (1, 99)])):
            folder.mkdir(parents=True)
            for i, (first, last) in enumerate(spans):
                (folder / f"spec_decode_h_{i}.json").write_text(json.dumps(result(first, last)))
        refused = _cli("compare", str(mixed.parent), str(single.parent))
        assert refused.returncode == 2
        assert "its files come from different windows" in refused.stderr
        assert _cli("compare", str(single.parent), str(single.parent)).returncode == 0


class TestExporterWithoutScheme:
    def test_host_port_means_http_for_compare_advise_and_the_client(self, tmp_path):
        from exporter.client import ExporterClient

        with _served(tmp_path, "a") as (vllm, exporter):
            client = ExporterClient(exporter)
            for window_id in ("w1", "w2"):
                client.start(window_id)
                fake_add(vllm, 10, 20, [8, 4])
                client.stop(window_id)
            compared = _cli("compare", "w1", "w2", "--exporter", exporter)
            advised = _cli("advise", "w2", "--exporter", exporter, "--json")
        assert client.url == f"http://{exporter}"
        assert compared.returncode == 0, compared.stderr
        assert f"window w1 on http://{exporter}" in compared.stdout
        assert advised.returncode == 0, advised.stderr
        assert json.loads(advised.stdout)["window"] == f"window w2 on http://{exporter}"

    def test_an_unreachable_exporter_is_said_with_the_readme_exit_codes(self):
        dead = f"127.0.0.1:{free_port()}"
        compared = _cli("compare", "w1", "w2", "--exporter", dead)
        advised = _cli("advise", "w1", "--exporter", dead)
        for done in (compared, advised):
            assert "unknown url type" not in done.stderr
            assert f"exporter http://{dead} unreachable" in done.stderr, done.stderr
        assert compared.returncode == 2  # cannot be compared: never a gate's 1
        assert advised.returncode == 1  # the exporter unreachable

    def test_a_scheme_other_than_http_is_refused_by_name(self):
        from exporter.client import ClientError, ExporterClient

        with pytest.raises(ClientError, match="'ftp://h:1': give host:port or http"):
            ExporterClient("ftp://h:1")
        done = _cli("window", "start", "--exporter", "ftp://h:1")
        assert done.returncode == 1
        assert "give host:port or http(s)://host:port" in done.stderr


class TestJsonLogs:
    def test_every_field_is_a_key_of_its_own_in_serve_logs(self, tmp_path):
        port, dead = free_port(), free_port()
        config = write_config(tmp_path / "c.yaml", port, [
            {"name": "gone", "url": f"http://127.0.0.1:{dead}/metrics"}])
        with process(CLI + ["serve", "--config", str(config), "--log-format", "json"]) as serve:
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(timeout=30) == 0
            lines = serve.stderr.read().splitlines()
        logged = [json.loads(line) for line in lines]  # every line is JSON
        starting = next(e for e in logged if e["event"] == "starting")
        assert starting["listen"] == f"http://127.0.0.1:{port}/" and starting["targets"] == 1
        down = next(e for e in logged if e["event"] == "target down")
        assert down["target"] == "gone" and down["url"] == f"http://127.0.0.1:{dead}/metrics"
        assert down["level"] == "warning" and "refused" in down["error"]

    def test_the_cli_messages_are_json_lines_too(self, tmp_path):
        dead = free_port()
        done = _cli("run", "--exporter", f"127.0.0.1:{dead}", "--log-format", "json", "--",
                    sys.executable, "-c", "pass")
        (line,) = done.stderr.splitlines()
        said = json.loads(line)
        assert said["exporter"] == f"http://127.0.0.1:{dead}" and said["level"] == "warning"
        assert said["msg"].startswith("no window recorded: ")
        assert said["error"].startswith(f"exporter http://127.0.0.1:{dead} unreachable")
        config = tmp_path / "c.yaml"
        config.write_text("listen: 19420\ntargets: []\n")
        refused = _cli("serve", "--config", str(config), "--log-format", "json")
        (problem,) = [json.loads(line) for line in refused.stderr.splitlines()]
        assert refused.returncode == 1
        assert problem["level"] == "error" and problem["key"] == "listen"
        assert problem["file"] == str(config)


class TestSmallerOnes:
    def test_a_failed_serve_leaves_no_lock_and_says_where_results_go(self, tmp_path):
        import socket

        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            (tmp_path / "c.yaml").write_text(f"listen: 127.0.0.1:{port}\ntargets: []\n")
            done = _cli("serve", "--config", "c.yaml", cwd=tmp_path)
        assert done.returncode == 2 and "address already in use" in done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]  # no outputs/ left
        checked = _cli("check-config", "c.yaml", "--allow-empty", cwd=tmp_path)
        assert (f"results in {tmp_path / 'outputs'} (output_dir, relative to the working "
                "directory)") in checked.stdout

    def test_a_second_stop_says_when_the_first_was_and_that_nothing_was_written(
            self, tmp_path):
        with _served(tmp_path, "a") as (vllm, exporter):
            assert _cli("window", "start", "--exporter", exporter, "--id", "w").returncode == 0
            fake_add(vllm, 10, 20, [8, 4])
            first = _cli("window", "stop", "--exporter", exporter, "w")
            second = _cli("window", "stop", "--exporter", exporter, "w")
            _, state = http("GET", f"http://{exporter}/api/v1/windows/w")
            unknown = _cli("window", "start", "--exporter", exporter, "--target", "nope")
        assert "results written to" in first.stderr
        assert second.returncode == 0 and second.stdout == first.stdout
        assert "results written to" not in second.stderr
        assert (f"window w was already stopped at {state['stopped_at_iso']}: nothing written "
                "now; its results are in ") in second.stderr
        assert 'unknown target "nope"; known: a' in unknown.stderr
        assert "(new)" not in unknown.stderr

    def test_window_start_help_says_what_bounds_its_window(self):
        start = _cli("window", "start", "--help")
        run = _cli("run", "--help")
        assert "command's start" not in start.stdout
        assert "this start and the `window stop` of its id" in " ".join(start.stdout.split())
        assert "the command's start and exit" in " ".join(run.stdout.split())

    def test_demo_into_a_closed_pipe_ends_quietly(self, tmp_path):
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        demo = subprocess.Popen(CLI + ["demo", "--port", str(free_port()), "--duration", "30"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=os.environ | {"TMPDIR": str(tmp)})
        demo.stdout.readline()  # `| head -1`: read one line, then leave
        demo.stdout.close()
        with demo.stderr:
            err = demo.stderr.read().decode()
        assert demo.wait(timeout=60) == 0
        assert "Traceback" not in err and "BrokenPipeError" not in err, err
        assert list(tmp.iterdir()) == []  # cleaned up as at Ctrl-C


class TestTargetNamesInReports:
    def test_windows_and_folders_name_a_target_alike_and_aisbench_files_meet_it(
            self, tmp_path):
        with _served(tmp_path, "eagle") as (vllm, exporter):
            assert _cli("window", "start", "--exporter", exporter, "--id", "w").returncode == 0
            fake_add(vllm, 100, 200, [60, 30])
            assert _cli("window", "stop", "--exporter", exporter, "w").returncode == 0
            on_exporter = _cli("advise", "w", "--exporter", exporter, "--json")
        folder = _cli("advise", str(tmp_path / "out" / "w"), "--json")
        assert on_exporter.returncode == 0 and folder.returncode == 0, folder.stderr
        assert list(json.loads(on_exporter.stdout)["results"]) == ["eagle"]
        assert list(json.loads(folder.stdout)["results"]) == ["eagle"]
        # AISBench's own file for the same server (named by host:port) meets it by name.
        ours = json.loads((tmp_path / "out" / "w" / "performances" /
                           f"spec_decode_127.0.0.1_{vllm}.json").read_text())
        theirs = tmp_path / "aisbench" / "performances"
        theirs.mkdir(parents=True)
        (theirs / f"spec_decode_127.0.0.1_{vllm}.json").write_text(json.dumps(
            {k: ours[k] for k in ("status", "url", "error", "data", "raw")}))
        compared = _cli("compare", str(theirs.parent), str(tmp_path / "out" / "w"), "--json")
        assert compared.returncode == 0, compared.stderr
        body = json.loads(compared.stdout)
        assert list(body["targets"]) == ["eagle"]
        assert body["only_in_a"] == [] and body["only_in_b"] == []
