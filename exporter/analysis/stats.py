"""Pure statistics for comparing two windows: 95% intervals, differences, verdicts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist
from typing import Any

CONFIDENCE = 0.95
Z = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)

ASSUMPTION = (
    "95% intervals treat drafts as independent; acceptance length and rate use a normal "
    "interval with the variance of the distribution of accepted tokens per draft, "
    "per-position rates Wilson intervals (differences: Newcombe's hybrid score interval)"
)


class Verdict(StrEnum):
    """What the interval of B - A says (every metric here is better when higher)."""

    BETTER = "better"
    WORSE = "worse"
    SAME = "no significant difference"
    UNKNOWN = "unknown"  # no interval could be computed (an estimate, no drafts)


@dataclass(frozen=True)
class Estimate:
    """A value with its 95% interval; `low`/`high` are None when no interval exists."""

    value: float
    low: float | None = None
    high: float | None = None
    se: float | None = None  # standard error, for normal intervals (differences need it)

    def as_dict(self) -> dict[str, Any]:
        """JSON shape: value, low, high."""
        return {"value": self.value, "low": self.low, "high": self.high}


def wilson(successes: float, trials: float) -> Estimate | None:
    """Wilson score interval of a proportion; None without trials."""
    if trials <= 0:
        return None
    p = min(1.0, max(0.0, successes / trials))
    denominator = 1 + Z * Z / trials
    centre = (p + Z * Z / (2 * trials)) / denominator
    half = Z / denominator * math.sqrt(p * (1 - p) / trials + Z * Z / (4 * trials * trials))
    # At p = 0 or 1 one bound is exact; float rounding would leave it at 1e-17 off.
    low = 0.0 if p == 0 else max(0.0, centre - half)
    high = 1.0 if p == 1 else min(1.0, centre + half)
    return Estimate(p, low, high)


def mean_interval(mean: float, variance: float, n: float) -> Estimate | None:
    """Normal interval of a mean of n independent draws with this variance; None if n <= 0."""
    if n <= 0:
        return None
    se = math.sqrt(max(variance, 0.0) / n)
    return Estimate(mean, mean - Z * se, mean + Z * se, se)


def normal_difference(a: Estimate, b: Estimate) -> Estimate:
    """B - A for two independent normal estimates."""
    diff = b.value - a.value
    if a.se is None or b.se is None:
        return Estimate(diff)
    se = math.hypot(a.se, b.se)
    return Estimate(diff, diff - Z * se, diff + Z * se, se)


def newcombe_difference(a: Estimate, b: Estimate) -> Estimate:
    """B - A for two independent proportions from their Wilson intervals (Newcombe 1998, #10)."""
    diff = b.value - a.value
    if a.low is None or a.high is None or b.low is None or b.high is None:
        return Estimate(diff)
    low = diff - math.hypot(b.value - b.low, a.high - a.value)
    high = diff + math.hypot(b.high - b.value, a.value - a.low)
    return Estimate(diff, low, high)


def verdict(difference: Estimate) -> Verdict:
    """Better when the whole interval of B - A is above 0, worse when below, else the same."""
    if difference.low is None or difference.high is None:
        return Verdict.UNKNOWN
    if difference.low > 0:
        return Verdict.BETTER
    if difference.high < 0:
        return Verdict.WORSE
    return Verdict.SAME
