"""exporter/server/memory.py: freed heap pages given back where the C library can (glibc)."""

from __future__ import annotations

import ctypes.util
import platform
import subprocess
import sys

import pytest

from exporter.server import memory


@pytest.fixture(autouse=True)
def _fresh_lookup():
    memory.libc_function.cache_clear()
    yield
    memory.libc_function.cache_clear()


@pytest.mark.may_skip_in_ci("malloc_trim is glibc's: musl and macOS have none")
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_gives_memory_back():
    garbage = [bytes(100_000) for _ in range(200)]  # 20 MB on the heap, then freed
    del garbage
    assert memory.give_back_free_memory() is True


def test_without_the_call_it_does_nothing(monkeypatch):
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libnot-a-c-library.so.0")
    assert memory.give_back_free_memory() is False


@pytest.mark.e2e
@pytest.mark.may_skip_in_ci("mallopt is glibc's: musl and macOS have none")
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_keeps_big_blocks_in_their_own_mappings():
    # Checked in children: the setting is for the whole process. After a 4 MB block is freed,
    # glibc's own threshold would put 300 KB blocks on the heap; with ours, never.
    code = (
        "import sys; from exporter.server import memory\n"
        "ok = memory.keep_big_blocks_apart() if sys.argv[1] == 'set' else True\n"
        "def heap():\n"
        "    for line in open('/proc/self/maps'):\n"
        "        if line.rstrip().endswith('[heap]'):\n"
        "            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "            return hi - lo\n"
        "    return 0\n"
        "del bytearray(4_000_000)[:]\n"
        "before = heap()\n"
        "blocks = [bytearray(300_000) for _ in range(50)]\n"
        "print(ok, heap() - before > 10_000_000)\n"
    )

    def run(mode: str) -> list[str]:
        return subprocess.run([sys.executable, "-c", code, mode], capture_output=True,
                              text=True, check=True).stdout.split()

    assert run("default") == ["True", "True"]  # the heap grew by the 15 MB
    assert run("set") == ["True", "False"]  # mapped apart: the heap did not


def test_without_mallopt_it_says_so(monkeypatch):
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libnot-a-c-library.so.0")
    assert memory.keep_big_blocks_apart() is False
