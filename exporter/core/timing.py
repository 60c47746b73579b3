"""Per-request timings, pure: what one answer took (the server's own figures, vLLM's
`--enable-per-request-metrics`, where it sends them; else the proxy's clock: first byte, chunk
gaps, end), and bounded tallies of them over a window's requests that merge exactly across
targets and shards (docs/numbers.md, "Paired speed-up")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.core.segments import MAX_SEGMENTS, OTHER
from exporter.core.tallies import Buckets, finite, natural

# Buckets of the logarithm 0.01 wide: a quantile read at a bucket's middle is within a factor
# e^0.005 (0.5%) of the exact one, whatever the unit and spread; the keys stay few (a factor of
# 10 between the fastest and slowest request is 231 buckets).
LOG_WIDTH = 0.01
FLOOR = 1e-3  # a value below this (ms, tokens/s) is tallied at it: its logarithm must exist
# Per request, except ITL: one value per gap between two chunks of a streamed answer.
FIGURES = ("tokens_per_second", "tpot_ms", "ttft_ms", "itl_ms")
# vLLM's PerRequestMetrics names for ours.
SERVER_NAMES = {"tokens_per_second": "tokens_per_second", "tpot_ms": "mean_itl_ms",
                "ttft_ms": "time_to_first_token_ms"}


@dataclass
class Spread:
    """Positive values tallied by their logarithm in fixed buckets, beside their exact count,
    sum and sum of squares."""

    logs: Buckets = field(default_factory=lambda: Buckets(LOG_WIDTH))
    total: float = 0.0
    squares: float = 0.0

    @property
    def count(self) -> int:
        """Values tallied."""
        return self.logs.count

    def add(self, value: float) -> None:
        """Tally one value."""
        value = max(value, FLOOR)
        self.logs.add(math.log(value))
        self.total += value
        self.squares += value * value

    def merge(self, other: Spread) -> None:
        """Add another tally."""
        self.logs.merge(other.logs)
        self.total += other.total
        self.squares += other.squares

    def quantile(self, q: float) -> float:
        """The q quantile, within 0.5% of the exact one."""
        return self.logs.quantile(q, math.exp)

    def variance(self) -> float:
        """The values' variance (n - 1), exact up to float rounding; 0 for one value."""
        n = self.count
        return max(self.squares - self.total * self.total / n, 0.0) / (n - 1) if n > 1 else 0.0

    def summary(self) -> dict[str, float | int] | None:
        """count, mean, min, p50, p95, p99, max (None when empty)."""
        if not self.count:
            return None
        return {"count": self.count, "mean": self.total / self.count,
                "min": math.exp(self.logs.low), "p50": self.quantile(0.5),
                "p95": self.quantile(0.95), "p99": self.quantile(0.99),
                "max": math.exp(self.logs.high)}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (`from_dict`)."""
        return {"sum": self.total, "squares": self.squares, "logs": self.logs.to_dict()}

    @classmethod
    def from_dict(cls, data: object) -> Spread:
        """Inverse of `to_dict`; `ValueError` unless it is one (a peer's)."""
        logs = data.get("logs") if isinstance(data, Mapping) else None
        if not isinstance(data, Mapping) or not isinstance(logs, Mapping) or not finite(
                data.get("sum")) or not finite(data.get("squares")):
            raise ValueError("a timing tally is malformed")
        return cls(Buckets.from_dict(logs, LOG_WIDTH), float(data["sum"]),
                   float(data["squares"]))


@dataclass(frozen=True)
class Timing:
    """One answer's timings; a figure is None where neither the server nor the proxy could
    measure it (`by_server`: the server's own figures were used)."""

    tokens_per_second: float | None = None
    tpot_ms: float | None = None
    ttft_ms: float | None = None
    gaps_ms: Spread | None = None  # the streamed answer's chunk gaps, as the proxy saw them
    by_server: bool = False

    @classmethod
    def of(cls, values: Mapping[str, float], gaps: Spread | None, by_server: bool) -> Timing:
        """From its per-request figures by name (those of SERVER_NAMES)."""
        return cls(values.get("tokens_per_second"), values.get("tpot_ms"),
                   values.get("ttft_ms"), gaps, by_server)


def server_timing(metrics: object) -> Timing | None:
    """vLLM's per-request timing fields of an answer's `metrics`; None when it has none (the
    server runs without --enable-per-request-metrics: they are absent or null)."""
    if not isinstance(metrics, Mapping):
        return None
    values = {ours: metrics.get(theirs) for ours, theirs in SERVER_NAMES.items()}
    sound = {k: float(v) for k, v in values.items() if finite(v) and v >= 0}
    return Timing.of(sound, None, True) if sound else None


@dataclass
class Clock:
    """The proxy's own clock on one answer (monotonic seconds): when the request went, when
    each piece of the answer came."""

    sent: float
    first: float | None = None
    last: float | None = None
    gaps: Spread = field(default_factory=Spread)

    def tick(self, at: float) -> None:
        """A piece of the answer arrived at `at`."""
        if self.last is not None:
            self.gaps.add(1000 * (at - self.last))
        if self.first is None:
            self.first = at
        self.last = at

    def timing(self, server: Timing | None, tokens: int | None, streamed: bool) -> Timing:
        """The answer's timings: the server's figures where given, else the proxy's; TPOT,
        TTFT and gaps only for a streamed answer (a whole body's first byte is its end)."""
        own: dict[str, float] = {}
        if self.first is not None and self.last is not None and tokens:
            if self.last > self.sent:
                own["tokens_per_second"] = tokens / (self.last - self.sent)
            if streamed:
                own["ttft_ms"] = 1000 * (self.first - self.sent)
                if tokens > 1:
                    own["tpot_ms"] = 1000 * (self.last - self.first) / (tokens - 1)
        given = {k: getattr(server, k) for k in SERVER_NAMES if server is not None
                 and getattr(server, k) is not None}
        gaps = self.gaps if streamed and self.gaps.count else None
        return Timing.of(own | given, gaps, bool(given))


@dataclass
class Timings:
    """A window's timings for one target (or merged): how many answers were timed and by
    whom, and a Spread per figure."""

    timed: int = 0
    by_server: int = 0
    spreads: dict[str, Spread] = field(default_factory=lambda: {f: Spread() for f in FIGURES})

    def add(self, timing: Timing) -> None:
        """Tally one answer's timings."""
        self.timed += 1
        self.by_server += timing.by_server
        for name in FIGURES[:3]:
            if (value := getattr(timing, name)) is not None:
                self.spreads[name].add(value)
        if timing.gaps_ms is not None:
            self.spreads["itl_ms"].merge(timing.gaps_ms)

    def merge(self, other: Timings) -> None:
        """Add another target's (or shard's) tally."""
        self.timed += other.timed
        self.by_server += other.by_server
        for name in FIGURES:
            self.spreads[name].merge(other.spreads[name])

    def answer(self) -> dict[str, Any]:
        """The `timing` block of a `per_request` block."""
        return {"timed": self.timed, "by_server": self.by_server,
                "weighting": "tokens_per_second, tpot_ms, ttft_ms: each request once; "
                             "itl_ms: each gap between two chunks of a streamed answer once",
                **{name: self.spreads[name].summary() for name in FIGURES},
                "buckets": {name: self.spreads[name].to_dict() for name in FIGURES}}

    @classmethod
    def from_block(cls, block: object) -> Timings:
        """The tally a `timing` block was made from (an empty one for None: a block written
        before timings were kept); `ValueError` when it is not one (a peer's)."""
        if block is None:
            return cls()
        if not isinstance(block, Mapping) or not isinstance(block.get("buckets"), Mapping):
            raise ValueError("not a timing block")
        timed, by_server = block.get("timed"), block.get("by_server")
        if not natural(timed) or not natural(by_server) or by_server > timed:
            raise ValueError("its timed answers are not counts")
        spreads = {name: Spread.from_dict(block["buckets"].get(name)) for name in FIGURES}
        if any(spreads[name].count > timed for name in FIGURES[:3]):
            raise ValueError("more timed values than timed answers")
        return cls(timed, by_server, spreads)


# The segment dimensions (core/segments.py) the timings are also split by: the load a request
# met and the client's tag, what a speed-up is asked per (issue 47).
SPLIT = ("concurrency", "tag")


@dataclass
class SplitTimings:
    """Timings per value of each SPLIT dimension, bounded as segments are: at most
    MAX_SEGMENTS values a dimension, the rest in OTHER."""

    by: dict[str, dict[str, Timings]] = field(default_factory=lambda: {d: {} for d in SPLIT})

    def _slot(self, dimension: str, value: str) -> Timings:
        values = self.by[dimension]
        if (slot := values.get(value)) is not None:
            return slot  # the common case builds no Timings to throw away
        if len(values) >= MAX_SEGMENTS:
            value = OTHER
        return values.setdefault(value, Timings())

    def add(self, keys: Mapping[str, str], timing: Timing) -> None:
        """One answer's timings in its value (`keys`: by dimension) of each dimension."""
        for dimension in SPLIT:
            self._slot(dimension, keys[dimension]).add(timing)

    def merge(self, other: SplitTimings) -> None:
        """Add another target's (or shard's) split tallies."""
        for dimension, values in other.by.items():
            for value, timings in values.items():
                self._slot(dimension, value).merge(timings)

    def answer(self) -> dict[str, dict[str, Any]]:
        """The `timing_by` block: each dimension's values' `timing` blocks."""
        return {d: {v: t.answer() for v, t in values.items()} for d, values in self.by.items()}

    @classmethod
    def from_block(cls, block: object, timed: int) -> SplitTimings:
        """Inverse of `answer`; none for None (a block saved before the split); `ValueError`
        when malformed or a dimension's timed answers do not sum to `timed`."""
        out = cls()
        if block is None:
            return out
        if not isinstance(block, Mapping) or set(block) != set(SPLIT):
            raise ValueError("its timings are not split by " + ", ".join(SPLIT))
        for dimension in SPLIT:
            values = block[dimension]
            if not isinstance(values, Mapping) or len(values) > MAX_SEGMENTS + 1:
                raise ValueError(f"its {dimension} timings are not a bounded object")
            out.by[dimension] = {str(v): Timings.from_block(t) for v, t in values.items()}
            if sum(t.timed for t in out.by[dimension].values()) != timed:
                raise ValueError(f"its {dimension} timings do not sum to its timed answers")
        return out
