"""Shared pieces of the cases: result rows, timing, /proc accounting, child processes, ports."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Skip(Exception):
    """A case cannot run here (a missing tool); the message says what to install."""


@dataclass
class Row:
    """One line of the table: a figure, the baseline it is compared with, and the target."""

    case: str
    figure: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    ratio: float | None = None  # value / baseline unless the figure says otherwise
    target: str = ""
    met: bool | None = None  # None: no target for this figure


@dataclass
class CaseResult:
    """What one case gives: table rows, raw figures for the JSON, or why it was skipped."""

    name: str
    rows: list[Row] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    skipped: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """JSON form."""
        return {
            "name": self.name,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 2),
            "rows": [asdict(r) for r in self.rows],
            "data": self.data,
        }


def find_binary(*candidates: str) -> str | None:
    """The first of `candidates` (names on PATH or absolute paths) that exists, or None."""
    for name in candidates:
        if path := shutil.which(name):
            return path
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def time_call(fn: Callable[[], object], *, repeats: int, min_seconds: float = 0.02) -> float:
    """Median seconds of one call of fn; short calls are looped so a repeat lasts min_seconds.

    With min_seconds=0 (slow calls) every repeat is one call and nothing is spent warming up.
    """
    if min_seconds <= 0:
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - started)
        return statistics.median(samples)
    fn()  # warm caches and lazy imports
    started = time.perf_counter()
    fn()
    once = max(time.perf_counter() - started, 1e-9)
    loops = max(1, min(10_000, int(min_seconds / once)))
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter() - started) / loops)
    return statistics.median(samples)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    # After the command name: state is field 3, utime 14 and stime 15 (1-based, man 5 proc).
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def reaped_children_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the process's children it has waited for (a stop's child:
    cutime and cstime, fields 16 and 17 of /proc/<pid>/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[13]) + int(fields[14])) / CLK_TCK


def peak_rss_mb(pid: int) -> float:
    """Peak resident set size (VmHWM) in MB, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_mb(pid: int) -> float:
    """Resident set size now (VmRSS) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on host right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def http_status(url: str, timeout: float = 1.0) -> int | None:
    """GET url: the status, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def wait_until(check: Callable[[], bool], timeout: float, what: str, proc=None) -> None:
    """Poll check every 50 ms; RuntimeError after timeout or when proc exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with code {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not ready after {timeout:g}s")


class Child:
    """A child process with its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, argv: list[str], log_path: Path, env: dict | None = None,
                 cwd: Path | None = None):
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            cwd=cwd,
        )

    @property
    def pid(self) -> int:
        """The child's pid."""
        return self.proc.pid

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the child (only this pid) and close its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode

    def tail(self, lines: int = 20) -> str:
        """The end of the child's output, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
