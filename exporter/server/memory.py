"""Free heap memory given back to the system after a stop's short-lived allocations: glibc
keeps freed heap pages until `malloc_trim`. Elsewhere (musl, macOS) both are no-ops."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def libc_function(name: str) -> Callable[..., int] | None:
    """A function of the C library, or None where it has none (looked up once a name)."""
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):
        return None
    return function


# mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 256 * 1024
TRIM_THRESHOLD = 64 * 1024 * 1024


def keep_big_blocks_apart() -> bool:
    """Big blocks in their own mappings, which go back to the system when freed; False where
    the C library cannot. Fixing the mmap threshold fixes the trim threshold too: set high, as
    trimming every scrape would regrow the heap; a stop gives it back itself."""
    mallopt = libc_function("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def give_back_free_memory() -> bool:
    """Return freed heap pages to the system (a few ms); False where the C library cannot."""
    trim = libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True
