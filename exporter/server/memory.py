"""Free heap memory given back to the system after a bulk of short-lived allocations.

A stop over 1000 targets builds its answer in a child process (`isolate`), but the server
still holds its 5 MB text, the state row made from it and the stop's scrape round for a moment.
glibc keeps freed heap pages until `malloc_trim` asks it to give them back, and keeps big
blocks on the heap once a big one was freed (`keep_big_blocks_apart`). Elsewhere (musl,
macOS) both are no-ops.
"""

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
    """Blocks of 256 KiB and more in their own mappings, which go back to the system when
    freed; False where the C library cannot.

    glibc maps big blocks apart at first, but raises that threshold up to the biggest block
    freed (up to 32 MB): after the first stop, its 5 MB texts came from the heap, where the
    objects the loop allocated meanwhile kept them from going back. A fixed threshold kept
    RSS ~14 MB lower over 15 stopped 1000-target windows (bench markers, same run). Fixing it
    also fixes glibc's trim threshold, which then would trim the heap's top at every 256 KiB
    free and grow it again on the next scrape (~20% more CPU a round, in-process A/B): the
    trim threshold is set high instead, and a stop gives the heap back itself
    (`give_back_free_memory`).
    """
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
