"""exporter/memory.py: freed heap pages given back where the C library can (glibc)."""

from __future__ import annotations

import ctypes.util
import platform

import pytest

from exporter import memory


@pytest.fixture(autouse=True)
def _fresh_lookup():
    memory.malloc_trim_of_libc.cache_clear()
    yield
    memory.malloc_trim_of_libc.cache_clear()


@pytest.mark.may_skip_in_ci("malloc_trim is glibc's: musl and macOS have none")
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_gives_memory_back():
    garbage = [bytes(100_000) for _ in range(200)]  # 20 MB on the heap, then freed
    del garbage
    assert memory.give_back_free_memory() is True


def test_without_the_call_it_does_nothing(monkeypatch):
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libnot-a-c-library.so.0")
    assert memory.give_back_free_memory() is False
