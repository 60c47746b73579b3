"""The shared test helpers and the suite's gates: a port handed to a server started next cannot
be taken first; the markers select what they say."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from pathlib import Path

from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        return int(ports.read().split()[0])


def test_free_ports_lie_below_the_ephemeral_range_and_never_repeat():
    # A port inside the ephemeral range can become any outgoing connection's local port
    # before the server binds it; two equal ports would make two servers collide.
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < _ephemeral_low() for port in ports)


def test_a_free_port_can_be_bound_and_listened_on():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert sock.getsockname()[1] == port


def _collected(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "--co", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 5), done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]


class TestGates:
    """The suite's gates: the soak runs only when asked for, markers are strict, and no test
    module overwrites its marks."""

    def test_the_soak_runs_only_when_minus_m_names_it(self):
        soak = "tests/faults/test_soak.py"
        assert _collected(soak) == []
        assert _collected("-m", "not e2e", soak) == []
        assert len(_collected("-m", "soak", soak)) >= 1

    def test_a_mistyped_marker_fails_the_run(self, tmp_path):
        mistyped = tmp_path / "test_mistyped.py"
        mistyped.write_text("import pytest\n\n\n@pytest.mark.ee2e\ndef test_x():\n    pass\n")
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "--co", "-p",
                               "no:cacheprovider", "--rootdir", str(ROOT), "-c",
                               str(ROOT / "pyproject.toml"), str(mistyped)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "'ee2e' not found in `markers`" in done.stdout

    def test_no_test_module_assigns_pytestmark_twice(self):
        twice = []
        for path in sorted((ROOT / "tests").rglob("test_*.py")):
            tree = ast.parse(path.read_text())
            marks = [node for node in tree.body if isinstance(node, ast.Assign)
                     and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)]
            if len(marks) > 1:
                twice.append(str(path.relative_to(ROOT)))
        assert twice == []
