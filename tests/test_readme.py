"""README's commands, run as written (ports moved to free ones so parallel runs do not clash)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import free_port

ROOT = Path(__file__).resolve().parent.parent


def _block_after(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def _on_path(tmp_path: Path) -> dict:
    """An environment where `specdec-exporter` is this interpreter running this tree."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "specdec-exporter"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m exporter "$@"\n')
    script.chmod(0o755)
    return os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}",
                         "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}


def _run_as_written(tmp_path: Path, heading: str, config_name: str,
                    ports: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """The section's shell block, run in `tmp_path` beside a copy of config/`config_name`, with
    each of `ports` moved to a free one in both; the finished run, and each port's new number."""
    block = _block_after(heading)
    config = (ROOT / "config" / config_name).read_text()
    moved = {port: str(free_port()) for port in ports}
    for old, new in moved.items():
        block, config = block.replace(old, new), config.replace(old, new)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / config_name).write_text(config)
    proc = subprocess.Popen(["bash", "-c", block], cwd=tmp_path, env=_on_path(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), moved


@pytest.mark.e2e
class TestAISBenchFlow:
    def test_the_flow_prints_numbers_as_written(self, tmp_path):
        done, ports = _run_as_written(tmp_path, "## The AISBench flow", "demo.yaml",
                                      ("9400", "8100", "8101", "8102"))
        out, err = done.stdout, done.stderr
        assert done.returncode == 0, err
        eagle, mtp, none = (f"127.0.0.1:{ports[p]}" for p in ("8100", "8101", "8102"))
        blocks = out.split("========== Speculative Decoding Metrics  [")
        titles = [b.split("]", 1)[0] for b in blocks[1:]]
        assert titles == [eagle, mtp, none, "all"]
        assert re.search(r"Acceptance rate \(%\) +\d+\.\d\d\n", blocks[1])
        assert "Status                                        N/A" in blocks[3]
        assert re.search(r"results written to \S+/outputs/w-", err)


def _shown_output(heading: str) -> str:
    """The plain code block the README shows as a section's printed output (its second block)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    return section.split("```")[3].strip("\n")


@pytest.mark.e2e
class TestProxyRun:
    def test_the_proxy_run_prints_what_the_readme_shows(self, tmp_path):
        heading = "## Per-request acceptance"
        done, _ = _run_as_written(tmp_path, heading, "proxy.yaml", ("9410", "9510", "8110"))
        out = done.stdout
        assert done.returncode == 0, done.stderr
        shown = _shown_output(heading).splitlines()
        printed = out.splitlines()[-len(shown):]  # after fake-vllm's banner and the AISBench block
        # The figures differ run to run (fake-vllm draws acceptance); the lines' labels,
        # the request counts and the cross-check with the counters do not.
        assert [line[:46] for line in printed] == [line[:46] for line in shown]
        assert printed[1].split()[-3:] == ["4", "/", "4"]
        assert printed[-1].endswith(" yes")
        assert re.fullmatch(r"Acceptance histogram \(steps by accepted\) +(\d+:\d+ ?){4}",
                            printed[5])


class TestDocsMatchTheRepo:
    def test_docker_run_mounts_files_that_exist(self):
        text = (ROOT / "docs" / "deploy.md").read_text()
        mounts = re.findall(r'-v "\$PWD/([^:"]+):', text)
        assert mounts, "deploy.md shows a docker run with a mounted file"
        for path in mounts:
            assert (ROOT / path).is_file(), path

    def test_design_names_every_package_and_module(self):
        # docs/design.md's package map names each package and, in its package's rows, each module.
        text = (ROOT / "docs" / "design.md").read_text()
        rows = [line.split("|") for line in text.splitlines() if line.startswith("| `")]
        named: dict[str, str] = {}
        for row in rows:
            named[row[1].strip().strip("`")] = named.get(row[1].strip().strip("`"), "") + row[2]
        missing = []
        for package in sorted(p for p in (ROOT / "exporter").iterdir()
                              if p.is_dir() and (p / "__init__.py").is_file()):
            for sub in [package, *(d for d in package.iterdir() if (d / "__init__.py").is_file())]:
                key = sub.relative_to(ROOT / "exporter").as_posix()
                modules = [p.stem for p in sub.glob("*.py") if not p.stem.startswith("__")]
                missing += [f"{key}/{m}" for m in modules if f"`{m}`" not in named.get(key, "")]
        assert "fakevllm" in named and "web/pages" in named
        assert missing == []
        assert "`client`" in text

    def test_docs_name_files_that_exist(self):
        # After a move, a path in the README or docs/ (the library table's included) still holds.
        text = "".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
        paths = set(re.findall(r"`((?:exporter|tests)/[\w/]+\.py)`", text))
        assert len(paths) >= 10
        assert [p for p in sorted(paths) if not (ROOT / p).is_file()] == []

    def test_api_lists_every_http_error(self):
        text = (ROOT / "docs" / "api.md").read_text()
        errors = text[text.index("Errors are"):].split("\n\n", 1)[0]
        for status in ("400", "401", "403", "404", "409", "413", "415", "429", "503"):
            assert status in errors, status

    def test_output_dir_says_it_is_relative_to_the_working_directory(self):
        text = (ROOT / "config" / "exporter.yaml").read_text()
        before = text.split("\noutput_dir:", 1)[0].rsplit("\n", 3)
        assert "relative to the working directory" in " ".join(before)

    def test_reliability_opens_with_what_an_operator_does(self):
        text = (ROOT / "docs" / "reliability.md").read_text()
        first_section = text.split("\n## ", 2)[1]
        assert first_section.startswith("When something fails")
        assert "| what you do |" in first_section

    def test_reliability_names_tests_that_exist(self):
        # Every `test_x.py::Class::test` the table names is there (renames leave no dead rows).
        text = (ROOT / "docs" / "reliability.md").read_text()
        named, current, missing = 0, None, []
        for file, path in re.findall(r"`((?:\w+/)*test_\w+\.py)?((?:::\w+)+)?(?:\[[^`]*\])?`",
                                     text):
            current = file or current
            if not file and not path:
                continue
            source = ROOT / "tests" / current.removeprefix("tests/")
            if not source.is_file():
                missing.append(current)
                continue
            for name in path.strip(":").split("::") if path else ():
                named += 1
                if not re.search(rf"(?:def|class) {name}\b", source.read_text()):
                    missing.append(f"{current}::{name}")
        assert named > 50 and missing == []
