"""Free heap memory given back to the system after a bulk of short-lived allocations.

A stop over 1000 targets allocates ~70 MB for a moment (the answer's objects, its JSON texts,
the state row) and frees it all when the answer is out. glibc keeps freed heap pages (and
each thread's arena: the texts are encoded in a worker thread) until `malloc_trim` asks it to
give them back: without it, RSS stays ~40-50 MB higher after the first stop over 1000 targets.
Elsewhere (musl, macOS) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def malloc_trim_of_libc() -> Callable[[int], int] | None:
    """The C library's malloc_trim, or None where it has none (looked up once)."""
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    return trim


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
    name = ctypes.util.find_library("c")
    try:
        mallopt: Callable[[int, int], int] = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def give_back_free_memory() -> bool:
    """Return freed heap pages to the system (a few ms); False where the C library cannot."""
    trim = malloc_trim_of_libc()
    if trim is None:
        return False
    trim(0)
    return True
