"""How each simulated server's metrics routes answer: which honour `name[]`, which compress."""

from __future__ import annotations

import re
from enum import StrEnum


class NameFilter(StrEnum):
    """What a prometheus_client route does with `?name[]=...` (the `--name-filter` option)."""

    HONOUR = "honour"  # a plain registry: only the samples named, as `restricted_registry`
    EMPTY = "empty"  # a multiprocess registry: its collector has no names, so nothing matches
    IGNORE = "ignore"  # a server that serves the whole page whatever is asked


def restrict(page: bytes, names: set[str]) -> bytes:
    """The page with only the samples whose name is in `names`, each kept sample's family
    comments before it, as prometheus_client's `restricted_registry` renders it."""
    kept: list[bytes] = []
    comments: list[bytes] = []
    after_sample = False
    for line in page.splitlines(keepends=True):
        if line.startswith(b"#"):
            if after_sample:  # a new family begins
                comments, after_sample = [], False
            comments.append(line)
            continue
        after_sample = True
        if not line.strip():
            continue
        if re.split(rb"[{ ]", line, maxsplit=1)[0].decode("utf-8", "replace") in names:
            kept += comments
            comments = []
            kept.append(line)
    return b"".join(kept)


def answer(page: bytes, names: list[str], mode: NameFilter) -> bytes:
    """What a prometheus_client route in `mode` answers to `names` (the `name[]` values)."""
    if not names or mode is NameFilter.IGNORE:
        return page
    if mode is NameFilter.EMPTY:
        return b""
    return restrict(page, set(names))
