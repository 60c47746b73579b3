"""Pure math of the paired speed-up: window A ran without speculative decoding, B with it;
per target and overall, how much faster B answers (tokens per second per request, TPOT and ITL
quantiles), each with a 95% bootstrap interval drawn, seeded, from the two windows' bounded
timing tallies; and the `--fail-if-slower` gate on it (docs/numbers.md, "Paired speed-up")."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

from exporter.analysis.stats import CONFIDENCE
from exporter.core.segments import MIN_REQUESTS
from exporter.core.timing import SPLIT, Spread, Timings

RESAMPLES = 2000
SEED = 47
# (figure, statistics, whether higher is faster): a speed-up above 1 is always B faster.
ROWS = (("tokens_per_second", ("mean", "p50"), True), ("tpot_ms", ("p50", "p95", "p99"), False),
        ("itl_ms", ("p50", "p95", "p99"), False))
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
# A quantile's interval needs this many values beyond it on each side; the mean this many.
BEYOND = 5
HEADLINE = ("tokens_per_second", "mean")
METHOD = (f"{CONFIDENCE:.0%} percentile bootstrap, {RESAMPLES} resamples seeded {SEED}: each "
          "side's statistic redrawn from its own tally (a quantile as the order statistic of a "
          "resample of n from the bucketed values, a mean from its normal limit), the ratio "
          "taken pair by pair; A and B independent")


def _enough(spread: Spread, stat: str) -> bool:
    q = QUANTILES.get(stat)
    n = spread.count
    return n >= 2 * BEYOND if q is None else min(q, 1 - q) * n >= BEYOND


def point(spread: Spread, stat: str) -> float:
    """The statistic of one tally."""
    return spread.total / spread.count if stat == "mean" else spread.quantile(QUANTILES[stat])


def replicates(spread: Spread, stat: str, rng: random.Random) -> list[float]:
    """RESAMPLES bootstrap replicates of the statistic."""
    n = spread.count
    if stat == "mean":
        se = math.sqrt(spread.variance() / n)
        mean = spread.total / n
        return [max(rng.gauss(mean, se), 1e-12) for _ in range(RESAMPLES)]
    # The r-th smallest of n draws from the tally is its value at the r-th smallest of n
    # uniforms, which is Beta(r, n + 1 - r) distributed: one draw per resample, not n.
    rank = min(max(round(QUANTILES[stat] * (n - 1)) + 1, 1), n)
    keys = sorted(spread.logs.counts)
    cumulative = list(accumulate(spread.logs.counts[k] for k in keys))
    width, low, high = spread.logs.width, spread.logs.low, spread.logs.high
    out = []
    for _ in range(RESAMPLES):
        at = bisect.bisect_left(cumulative, rng.betavariate(rank, n + 1 - rank) * n)
        key = keys[min(at, len(keys) - 1)]
        out.append(math.exp(min(max((key + 0.5) * width, low), high)))
    return out


def _percentile(ordered: list[float], p: float) -> float:
    at = p * (len(ordered) - 1)
    below = math.floor(at)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (at - below)


def _row(figure: str, stat: str, faster_high: bool, a: Spread, b: Spread,
         rng: random.Random) -> dict[str, Any]:
    va, vb = point(a, stat), point(b, stat)
    value = vb / va if faster_high else va / vb
    row: dict[str, Any] = {"figure": figure, "stat": stat, "a": va, "b": vb,
                           "a_values": a.count, "b_values": b.count,
                           "speedup": {"value": value, "low": None, "high": None}}
    if not (_enough(a, stat) and _enough(b, stat)):
        row["verdict"] = "unknown"
        row["note"] = f"too few values for a {stat} interval (need {BEYOND} beyond it a side)"
        return row
    ra, rb = replicates(a, stat, rng), replicates(b, stat, rng)
    ratios = sorted(y / x if faster_high else x / y for x, y in zip(ra, rb, strict=True))
    tail = (1 - CONFIDENCE) / 2
    low, high = _percentile(ratios, tail), _percentile(ratios, 1 - tail)
    row["speedup"] |= {"low": low, "high": high}
    row["verdict"] = "faster" if low > 1 else "slower" if high < 1 else (
        "no significant difference")
    return row


def speedup_entry(a: Timings, b: Timings) -> dict[str, Any]:
    """One target's (or the aggregate's) speed-up rows, B over A; seeded, so repeatable."""
    rng = random.Random(SEED)
    rows = [_row(figure, stat, higher, a.spreads[figure], b.spreads[figure], rng)
            for figure, stats, higher in ROWS for stat in stats
            if a.spreads[figure].count and b.spreads[figure].count]
    return {"a_timed": a.timed, "b_timed": b.timed, "rows": rows}


def _timings(answer: Mapping[str, Any], name: str | None) -> Timings | None:
    """A window answer's timing tally of one target (None: the aggregate); None without."""
    block = answer.get("per_request")
    if not isinstance(block, Mapping):
        return None
    part = block.get("aggregate") if name is None else (block.get("targets") or {}).get(name)
    try:
        timings = Timings.from_block((part or {}).get("timing"))
    except ValueError:
        return None
    return timings if timings.timed else None


def split_timings(answer: Mapping[str, Any], dimension: str) -> dict[str, Timings]:
    """A window answer's aggregate timing tallies by value of a SPLIT dimension (none in a
    window saved before the split, or a peer's malformed one)."""
    block = ((answer.get("per_request") or {}).get("aggregate") or {}).get("timing_by")
    values = (block or {}).get(dimension) if isinstance(block, Mapping) else None
    try:
        return {str(v): Timings.from_block(t) for v, t in (values or {}).items()}
    except ValueError:
        return {}


def _by_segment(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Speed-up entries per value of each SPLIT dimension timed in both windows; a value with
    fewer than MIN_REQUESTS timed answers a side has a note instead of rows."""
    out: dict[str, dict[str, Any]] = {}
    for dimension in SPLIT:
        sa, sb = split_timings(a, dimension), split_timings(b, dimension)
        out[dimension] = {}
        for value in (v for v in sb if v in sa and sa[v].timed and sb[v].timed):
            ta, tb = sa[value], sb[value]
            if min(ta.timed, tb.timed) < MIN_REQUESTS:
                out[dimension][value] = {
                    "a_timed": ta.timed, "b_timed": tb.timed, "rows": [],
                    "note": f"too few timed requests (fewer than {MIN_REQUESTS} a side)"}
            else:
                out[dimension][value] = speedup_entry(ta, tb) | {"note": None}
    return out


def compare_speed(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `speedup` section of a comparison: per target timed in both, overall, and per
    concurrency band and tag timed in both; None when neither window carries timings."""
    targets = {}
    for name in (b.get("per_request") or {}).get("targets") or {}:
        ta, tb = _timings(a, name), _timings(b, name)
        if ta is not None and tb is not None:
            targets[name] = speedup_entry(ta, tb)
    ta, tb = _timings(a, None), _timings(b, None)
    if ta is None and tb is None:
        return None
    missing = [side for side, t in (("A", ta), ("B", tb)) if t is None]
    return {"method": METHOD, "targets": targets,
            "aggregate": speedup_entry(ta, tb) if ta is not None and tb is not None else None,
            "missing": missing, "by": _by_segment(a, b)}


def gate_slower(speed: Mapping[str, Any] | None, ratio: float) -> dict[str, Any]:
    """`--fail-if-slower [RATIO]`: trips for each entry (target and overall, not a band or
    tag) whose headline speed-up (tokens per second per request, mean) has its whole 95%
    interval below RATIO (1: B slower than A)."""
    checks = []
    entries = dict((speed or {}).get("targets") or {})
    if speed is not None and speed.get("aggregate") is not None:
        entries["all"] = speed["aggregate"]
    for name, entry in entries.items():
        for row in entry["rows"]:
            if (row["figure"], row["stat"]) == HEADLINE:
                high = row["speedup"]["high"]
                checks.append({"target": name, "ratio": ratio, "speedup": row["speedup"],
                               "tripped": high is not None and high < ratio})
    return {"ratio": ratio, "checks": checks, "tripped": any(c["tripped"] for c in checks)}
