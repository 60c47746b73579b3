"""Helpers for tests that run the real CLI in subprocesses on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from conftest import free_port  # noqa: F401  (re-exported for the CLI tests)

CLI = [sys.executable, "-m", "exporter"]


def http(method: str, url: str, body: dict | None = None, token: str | None = None):
    """(status, parsed JSON or text) of one request; never raises for HTTP errors."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")  # urllib's default is a form's
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def wait_http(url: str, deadline: float = 20.0, status: int = 200) -> None:
    """Poll until `url` answers `status`, or fail after `deadline` seconds."""
    end = time.monotonic() + deadline
    last = None
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == status:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{url} not answering {status} within {deadline}s: {last}")


@contextmanager
def process(args: list[str], **kwargs):
    """A subprocess that is always ended (and reaped) when the block exits."""
    env = os.environ | kwargs.pop("env", {})
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


@contextmanager
def fake_vllm(*extra: str):
    """A `specdec-exporter fake-vllm` subprocess with no background traffic; yields its port."""
    port = free_port()
    with process(CLI + ["fake-vllm", "--port", str(port), "--drafts-per-second", "0", *extra]):
        wait_http(f"http://127.0.0.1:{port}/metrics")
        yield port


def fake_add(port: int, drafts: int, draft_tokens: int, per_pos: list[int], engine: int = 0):
    status, body = http("POST", f"http://127.0.0.1:{port}/control/add", {
        "engine": engine, "drafts": drafts, "draft_tokens": draft_tokens,
        "accepted_per_pos": per_pos,
    })
    assert status == 200, body


def write_config(path: Path, port: int, targets: list[dict], **extra) -> Path:
    config = {"listen": f"127.0.0.1:{port}", "scrape_interval": "250ms",
              "scrape_timeout": "250ms", "output_dir": str(path.parent / "out"),
              "targets": targets} | extra
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def serve_over(work_dir: Path, vllm: int) -> tuple[int, list[str]]:
    """An exporter on a free port over one target `a`, the fake-vllm at port `vllm`: its port,
    and the command serving it (its config written in `work_dir`)."""
    port = free_port()
    config = write_config(work_dir / "c.yaml", port,
                          [{"name": "a", "url": f"http://127.0.0.1:{vllm}/metrics"}])
    return port, CLI + ["serve", "--config", str(config)]


def measured(work_dir: Path) -> Path:
    """The `performances` folder of the one `measure` run under `work_dir` (its timestamped
    folder, as AISBench names its runs)."""
    runs = [p for p in work_dir.iterdir() if p.is_dir() and p.name[:8].isdigit()]
    assert len(runs) == 1, runs
    return runs[0] / "performances"
