"""Bounded tallies of per-request values, pure: fixed-width buckets with the exact count, sum,
min and max beside them, so a million requests cost a few thousand integers and two tallies
merge exactly (a fleet's shards, a window's targets)."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard


@dataclass
class Buckets:
    """Values in buckets `width` wide (bucket i holds [i*width, (i+1)*width)), keyed sparsely:
    the keys are bounded by the values' range, never by their number. A quantile is read at
    its bucket's middle, clamped to the exact min and max: within width/2 of the exact one."""

    width: float
    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    counts: dict[int, int] = field(default_factory=dict)

    def add(self, value: float) -> None:
        """Tally one value."""
        key = math.floor(value / self.width)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.count += 1
        self.total += value
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def merge(self, other: Buckets) -> None:
        """Add another tally of the same width."""
        if other.width != self.width:
            raise ValueError(f"buckets {other.width} wide cannot merge into {self.width}")
        for key, n in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        self.count += other.count
        self.total += other.total
        self.low = min(self.low, other.low)
        self.high = max(self.high, other.high)

    def _at_rank(self, rank: int, ordered: list[tuple[int, int]]) -> float:
        seen = 0
        for key, n in ordered:
            seen += n
            if rank < seen:
                return min(max((key + 0.5) * self.width, self.low), self.high)
        return self.high

    def quantile(self, q: float, unmap: Callable[[float], float] | None = None) -> float:
        """The linear-interpolated quantile (numpy's default), from the buckets; of the values
        `unmap` gives back when the tally holds a map of them (a logarithm)."""
        ordered = sorted(self.counts.items())
        at = q * (self.count - 1)  # between the ranks (0-based) below and below + 1
        below = math.floor(at)
        first = self._at_rank(below, ordered)
        second = self._at_rank(min(below + 1, self.count - 1), ordered)
        if unmap is not None:
            first, second = unmap(first), unmap(second)
        return first + (second - first) * (at - below)

    def summary(self) -> dict[str, float] | None:
        """mean, min, p5, p50, p95, max (None when empty); mean, min and max exact."""
        if not self.count:
            return None
        return {"mean": self.total / self.count, "min": self.low, "p5": self.quantile(0.05),
                "p50": self.quantile(0.5), "p95": self.quantile(0.95), "max": self.high}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, for the state database and a shard's answer (`from_dict`)."""
        return {"width": self.width, "count": self.count, "sum": self.total,
                "min": self.low if self.count else None,
                "max": self.high if self.count else None,
                "counts": {str(k): n for k, n in sorted(self.counts.items())}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], width: float) -> Buckets:
        """Inverse of `to_dict`; `ValueError` unless it is a sound tally `width` wide."""
        if not isinstance(data, Mapping) or data.get("width") != width:
            raise ValueError(f"not a tally of buckets {width} wide")
        counts = data.get("counts")
        if not isinstance(counts, Mapping):
            raise ValueError("its counts are not an object")
        parsed = {int(k): n for k, n in counts.items()}
        count, total = data.get("count"), data.get("sum")
        if (not all(natural(n) and n > 0 for n in parsed.values()) or not natural(count)
                or sum(parsed.values()) != count or not finite(total)):
            raise ValueError("its counts are not counts")
        tally = cls(width, count, float(total), counts=parsed)
        if count:
            low, high = data.get("min"), data.get("max")
            if not (finite(low) and finite(high) and low <= high):
                raise ValueError("its min and max are not numbers")
            tally.low, tally.high = float(low), float(high)
        return tally


def add_counts(into: list[int], more: list[int]) -> None:
    """Add `more` into `into` position by position, `into` grown to fit."""
    if len(more) > len(into):
        into.extend([0] * (len(more) - len(into)))
    into[:len(more)] = map(operator.add, into, more)


def natural(value: object) -> TypeGuard[int]:
    """A whole number from 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def finite(value: object) -> TypeGuard[float]:
    """A finite int or float (not a bool)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))
