"""Pure math: the distribution of X, the accepted tokens per draft, from per-position rates.

Within one draft, position i+1 is only accepted if position i was (tokens after the first
rejection are discarded), so the per-position rates are X's survival function:
P(X >= i+1) = p_i and P(X = j) = p_{j-1} - p_j, with p_{-1} = 1 and p_k = 0. Measured rates
that are not non-increasing (noise, a restart, a dialect that counts differently) are replaced
by their isotonic (pool-adjacent-violators) fit, and the distribution says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import mul
from typing import Any

# Rates computed from float counters can exceed each other by rounding alone.
_TOLERANCE = 1e-12
# Real drafters propose a handful of tokens; a position number past this is corrupt input
# that would otherwise allocate a list that long.
MAX_POSITIONS = 10_000


def isotonic_non_increasing(
    values: Sequence[float], weights: Sequence[float] | None = None
) -> list[float]:
    """The non-increasing sequence closest to `values` in weighted least squares (PAV)."""
    if weights is None:
        weights = [1.0] * len(values)
    if len(weights) != len(values):
        raise ValueError("values and weights differ in length")
    # Each block: [mean, weight, count]; a block that rises above its left neighbour is pooled.
    blocks: list[list[float]] = []
    for value, weight in zip(values, weights, strict=True):
        blocks.append([float(value), float(weight), 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0] - _TOLERANCE:
            mean2, weight2, count2 = blocks.pop()
            mean1, weight1, count1 = blocks[-1]
            total = weight1 + weight2
            mean = (mean1 * weight1 + mean2 * weight2) / total if total > 0 else (mean1 + mean2) / 2
            blocks[-1] = [mean, total, count1 + count2]
    fitted: list[float] = []
    for mean, _, count in blocks:
        fitted.extend([mean] * int(count))
    return fitted


def is_non_increasing(values: Sequence[float]) -> bool:
    """Whether every value is at most its predecessor (up to float rounding)."""
    return all(b <= a + _TOLERANCE for a, b in zip(values, values[1:], strict=False))


@dataclass(frozen=True)
class Distribution:
    """X = accepted tokens per draft, for a window with k = len(rates) positions."""

    measured: tuple[float, ...]  # the per-position rates as measured (clamped to 0..1)
    rates: tuple[float, ...]  # non-increasing: the measured ones, or their isotonic fit
    monotone: bool  # the measured rates were already non-increasing

    @property
    def k(self) -> int:
        """Number of positions."""
        return len(self.rates)

    @property
    def probabilities(self) -> tuple[float, ...]:
        """P(X = j) for j = 0..k."""
        survival = (1.0, *self.rates, 0.0)
        return tuple(survival[j] - survival[j + 1] for j in range(self.k + 1))

    @property
    def mean(self) -> float:
        """E[X] = sum of p_i (the acceptance length minus one)."""
        return sum(self.rates)

    @property
    def variance(self) -> float:
        """Var[X]: E[X^2] = sum_i (2i + 1) p_i for a survival function p."""
        # (2i + 1) p_i summed in order, as a generator would, without one (1000 targets advised
        # at each stop).
        second: float = sum(map(mul, range(1, 2 * len(self.rates), 2), self.rates))
        return max(second - self.mean**2, 0.0)

    def as_dict(self) -> dict[str, Any]:
        """JSON shape: measured and used rates, P(X = j), mean, variance, the monotone flag."""
        return {
            "k": self.k,
            "monotone": self.monotone,
            "note": None if self.monotone else (
                "measured per-position rates rise somewhere; the isotonic "
                "(non-increasing) fit is used"
            ),
            "measured_rates": list(self.measured),
            "rates": list(self.rates),
            "probabilities": {str(j): p for j, p in enumerate(self.probabilities)},
            "mean": self.mean,
            "variance": self.variance,
        }


def distribution(
    rates: Sequence[float], weights: Sequence[float] | None = None
) -> Distribution:
    """The distribution of X from the per-position rates p_0..p_{k-1}.

    Rates outside 0..1 are clamped (a survival function cannot leave that range). The fit
    weights default to equal, which is right when every rate comes from the same drafts.
    """
    measured = tuple(min(1.0, max(0.0, float(p))) for p in rates)
    if is_non_increasing(measured):
        return Distribution(measured, measured, True)
    fitted = tuple(isotonic_non_increasing(measured, weights))
    return Distribution(measured, fitted, False)


def rates_from_mapping(per_position: Mapping[str, float] | Mapping[int, float]) -> list[float]:
    """Rates in numeric position order from {"0": p0, "1": p1, ...} (keys str or int).

    A missing position in the middle is a 0 rate: nothing was accepted there.
    """
    if not per_position:
        return []
    by_pos = {int(pos): float(rate) for pos, rate in per_position.items()}
    if min(by_pos) < 0 or max(by_pos) >= MAX_POSITIONS:
        raise ValueError(f"position outside 0..{MAX_POSITIONS - 1}")
    return [by_pos.get(pos, 0.0) for pos in range(max(by_pos) + 1)]
