"""What memory keeps of a stopped window: a list item, and the last one's gauge counts (the
answer stays in the state database)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.core.snapshot import Counts, PackedCounts, pack_counts, unpack_counts

# What a list item shows of the aggregate (`api.window_summary`, the landing page's table).
AGGREGATE_FIGURES = ("acceptance_rate", "acceptance_length", "num_drafts", "draft_tokens",
                     "accepted_tokens")


@dataclass(frozen=True)
class StoppedWindow:
    """A stopped window as the window lists show it; its answer is read from the store."""

    id: str
    name: str
    targets: Sequence[str]
    labels: Mapping[str, str]
    started_at: float
    stopped_at: float
    aggregate: Mapping[str, Any] | None  # status and AGGREGATE_FIGURES only

    @property
    def is_open(self) -> bool:
        """Never: only a stopped window is kept this way."""
        return False

    def state(self) -> dict[str, Any]:
        """The stop answer's keys a list item reads, without results or advice."""
        return {
            "id": self.id, "name": self.name, "targets": list(self.targets),
            "labels": dict(self.labels), "started_at": self.started_at,
            "stopped_at": self.stopped_at, "aggregate": self.aggregate,
        }

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> StoppedWindow:
        """From a stop answer, or the same fields of a stored window."""
        return cls(
            id=fields["id"], name=fields["name"],
            # Interned, and the tuple shared between windows over the same targets.
            targets=_shared_targets(tuple(sys.intern(name) for name in fields["targets"])),
            labels=dict(fields["labels"]), started_at=fields["started_at"],
            stopped_at=fields["stopped_at"], aggregate=brief_aggregate(fields.get("aggregate")),
        )


@functools.lru_cache(maxsize=16)
def _shared_targets(targets: tuple[str, ...]) -> tuple[str, ...]:
    """One tuple for equal tuples of target names (a few kept for windows over other sets)."""
    return targets


def brief_aggregate(aggregate: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The aggregate RESULT's status and the few figures a list shows."""
    if not aggregate:
        return None
    data = aggregate.get("data")
    return {
        "status": aggregate.get("status"),
        "data": {k: data.get(k) for k in AGGREGATE_FIGURES} if data else None,
    }


@dataclass(frozen=True)
class LastWindow:
    """The last stopped window as the `specdec_last_window_*` gauges read it."""

    id: str
    name: str
    stopped_at: float
    increases: Mapping[str, Counts]

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> LastWindow:
        """From a stop answer: its targets with status ok and an increase."""
        return cls.of_kept({**answer, "increases": PackedIncreases.of_results(answer["results"])})

    @classmethod
    def of_kept(cls, kept: Mapping[str, Any]) -> LastWindow:
        """From what a stop keeps (`kept_of`): the answer's head and its `increases`, packed."""
        return cls(id=kept["id"], name=kept["name"], stopped_at=kept["stopped_at"] or 0.0,
                   increases=kept["increases"])


def kept_of(answer: Mapping[str, Any]) -> dict[str, Any]:
    """Of a stop answer, what memory keeps (`StoppedWindow.of`, `LastWindow.of_kept` read it)."""
    kept = {k: answer[k] for k in ("id", "name", "targets", "labels", "started_at",
                                   "stopped_at")}
    return kept | {"aggregate": brief_aggregate(answer["aggregate"]),
                   "increases": PackedIncreases.of_results(answer["results"])}


class PackedIncreases(Mapping[str, Counts]):
    """Per target `Counts`, kept packed, each made again when read."""

    def __init__(self, items: Iterable[tuple[str, Counts]]):
        shared: dict[tuple[int, ...], tuple[int, ...]] = {}  # one positions tuple for all alike
        self._packed: dict[str, PackedCounts] = {}
        for name, counts in items:
            positions = tuple(counts.per_position)
            self._packed[name] = pack_counts(counts, shared.setdefault(positions, positions))

    @classmethod
    def of_results(cls, results: Mapping[str, Mapping[str, Any]]) -> PackedIncreases:
        """The increases of a stop answer's RESULTs with status ok and an increase."""
        return cls((name, Counts.from_raw(result["increase"]))
                   for name, result in results.items()
                   if result["status"] == "ok" and result.get("increase"))

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled from a stop's child: each name one copy with the window list's.
        self._packed = {sys.intern(name): packed for name, packed in state["_packed"].items()}

    def __getitem__(self, name: str) -> Counts:
        return unpack_counts(self._packed[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._packed)

    def __len__(self) -> int:
        return len(self._packed)
