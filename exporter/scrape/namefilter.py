"""Asking a target for only the samples we read (`?name[]=`), proven against its full page.

prometheus_client's own app (vLLM's `/metrics/`, SGLang's `/metrics`) renders only the samples
named, a fraction of the page's cost to the server; vLLM's `/metrics` (its instrumentator),
llama.cpp and TensorRT-LLM ignore the filter, and a multiprocess registry answers it with
nothing. So a target is read filtered only once a filtered answer was seen to hold every family
we read that its full page holds, and nothing else; that is proven again after a restart.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from yarl import URL

from exporter.core.counting import counter_increase
from exporter.core.snapshot import Snapshot

_Plan = TypeVar("_Plan")


def filtered_urls(url: URL, names: Collection[str]) -> Iterator[URL]:
    """Where a filtered answer may be had, most likely first: vLLM serves prometheus_client's
    app under the path with a trailing slash, others on the path itself."""
    query = [*url.query.items(), *(("name[]", name) for name in names)]
    if not url.path.endswith("/"):
        yield url.with_path(url.path + "/").with_query(query)
    yield url.with_query(query)


def _sample_name(line: bytes) -> bytes:
    end = len(line)
    for stop in (b"{", b" ", b"\t"):
        at = line.find(stop, 0, end)
        if at >= 0:
            end = at
    return line[:end]


def _needles(names: Collection[str]) -> set[bytes]:
    """Line starts that find every one of `names`: the names grouped by their first 10
    characters, each group by its common prefix (a page is searched once per group, not
    twice per name)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name[:10], []).append(name)
    return {b"\n" + os.path.commonprefix(group).encode() for group in groups.values()}


def present(page: bytes, names: Collection[str]) -> frozenset[str]:
    """Which of `names` have a sample line on `page`."""
    wanted = {name.encode() for name in names}
    found = set()
    page = b"\n" + page if not page.startswith(b"\n") else page
    for needle in _needles(names):
        at = page.find(needle)
        while at >= 0:
            end = page.find(b"\n", at + 1)
            name = _sample_name(page[at + 1: end if end >= 0 else len(page)])
            if name in wanted:
                found.add(name.decode())
            at = page.find(needle, at + 1)
    return frozenset(found)


def honoured(answer: bytes, wanted: frozenset[str], names: Collection[str]) -> bool:
    """Whether `answer` to a filter of `names` is filtered and lacks none of `wanted` (what the
    full page holds of them): no sample of another name, every wanted one there."""
    asked = {name.encode() for name in names}
    for line in answer.split(b"\n"):
        if line and not line.startswith(b"#") and _sample_name(line.strip()) not in asked:
            return False  # the filter was ignored: a sample we did not ask for
    return wanted <= present(answer, wanted)


def families(snapshot: Snapshot) -> frozenset[str]:
    """The families a snapshot holds, as far as reading it goes: its counters' fields, whether
    it has `_created` samples or a running-requests reading, its gauges."""
    found = {key.field.value for key in snapshot.values}
    if snapshot.created:
        found.add("_created")
    if snapshot.running is not None:
        found.add("running")
    return frozenset(found | set(snapshot.gauges))


def restarted(before: Snapshot | None, now: Snapshot) -> bool:
    """Whether `now` shows a restart since `before`: a counter gone down or a new `_created`."""
    if before is None:
        return False
    last, last_created, created = before.values, before.created, now.created
    for key, value in now.values.items():
        old = last.get(key)
        if old is not None and counter_increase(
                old, last_created.get(key), value, created.get(key))[1]:
            return True
    return False


@dataclass(slots=True)
class Reading(Generic[_Plan]):
    """How one target is read: `filtered` (the request that asks for our samples only) once
    proven, the families its proof saw, and the last page read, to see a restart by."""

    filtered: _Plan | None = None  # the scraper's plan of the filtered request
    families: frozenset[str] = frozenset()
    last: Snapshot | None = None
    proven: bool = False

    def keeps(self, snapshot: Snapshot) -> bool:
        """Whether a filtered `snapshot` may stand: no restart, no family the proof saw lost."""
        return self.families <= families(snapshot) and not restarted(self.last, snapshot)

    def due(self, snapshot: Snapshot) -> bool:
        """Whether a full page read calls for a proof: none yet, or a restart since the last."""
        return not self.proven or restarted(self.last, snapshot)

    def reset(self) -> None:
        """Read the full page again, and prove the filter again on it."""
        self.filtered, self.families, self.proven = None, frozenset(), False
