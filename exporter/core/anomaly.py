"""Counter values no counter can have, as a window's accumulators tally them (kept in the
state: small and immutable), and how a person reads a series."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from typing import Any

from exporter.core.snapshot import SeriesKey, Snapshot


def value_text(value: float) -> str:
    """A sample value as an exposition writes it: NaN, +Inf, -Inf, or the number."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def series_text(key: SeriesKey) -> str:
    """A series as a person looks it up: AISBench's counter name and the labels that tell it."""
    labels = [("engine", key.engine), ("model_name", key.model_name)]
    if key.position >= 0:
        labels.append(("position", str(key.position)))
    labels += list(key.extra)
    # A note is read by people and kept in the state: a 100k-character label value is cut.
    inner = ",".join(
        f'{name}="{value if len(value) <= 120 else value[:117] + "..."}"'
        for name, value in labels if value
    )
    return f"{key.field.value}{{{inner}}}" if inner else key.field.value


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A counter value no counter can have (NaN, infinite, negative) in one scrape."""

    at: float
    series: str
    value: str
    others: int = 0  # further unusable values in the same scrape


def find_anomaly(snapshot: Snapshot, at: float) -> Anomaly | None:
    """The scrape's first unusable counter value (by series), or None when all are usable."""
    # One chained comparison per value (NaN fails it too): this runs on every scrape.
    bad = [key for key, value in snapshot.values.items() if not 0.0 <= value < math.inf]
    if not bad:
        return None
    first = min(bad)  # a stable choice, whatever the page's order; cheap for many
    return Anomaly(at, series_text(first), value_text(snapshot.values[first]), len(bad) - 1)


@dataclass(frozen=True, slots=True)
class AnomalyTally:
    """Anomalous scrapes of one stretch: the first, the last, and how many."""

    count: int = 0
    first: Anomaly | None = None
    last: Anomaly | None = None

    def plus(self, anomaly: Anomaly) -> AnomalyTally:
        """This tally and one more anomalous scrape."""
        return AnomalyTally(self.count + 1, self.first or anomaly, anomaly)

    def joined(self, other: AnomalyTally) -> AnomalyTally:
        """This tally and another's scrapes (a later stretch)."""
        if not other.count:
            return self
        return AnomalyTally(self.count + other.count, self.first or other.first, other.last)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state."""
        first, last = (None if a is None else list(astuple(a)) for a in (self.first, self.last))
        return {"count": self.count, "first": first, "last": last}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> AnomalyTally:
        """Inverse of `to_dict`."""
        if not data or not data["count"]:
            return NO_ANOMALIES
        first, last = (Anomaly(*a) if a else None for a in (data["first"], data["last"]))
        return cls(data["count"], first, last)


NO_ANOMALIES = AnomalyTally()
