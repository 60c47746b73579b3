"""The exact quantile of a sample: the oracle the bucketed tallies' quantiles are held to."""

from __future__ import annotations

import math


def exact_quantile(values: list[float], q: float) -> float:
    """The `q` quantile by linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)
