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
from itertools import repeat
from operator import add, le, mul, sub
from typing import Any

from exporter.core.snapshot import in_position_order, position_keys

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
    # b <= a + tolerance for each neighbouring pair, looped in C (1000 targets at a stop).
    return all(map(le, values[1:], map(add, values, repeat(_TOLERANCE))))


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
        # The properties' arithmetic inlined, the mean summed once: a stop over 1000 targets
        # writes one of these per target.
        rates = self.rates
        survival = (1.0, *rates, 0.0)
        mean = sum(rates)
        second: float = sum(map(mul, range(1, 2 * len(rates), 2), rates))
        return {
            "k": len(rates),
            "monotone": self.monotone,
            "note": None if self.monotone else (
                "measured per-position rates rise somewhere; the isotonic "
                "(non-increasing) fit is used"
            ),
            "measured_rates": list(self.measured),
            "rates": list(rates),
            "probabilities": dict(zip(
                position_keys(len(rates) + 1), map(sub, survival, survival[1:]), strict=True)),
            "mean": mean,
            "variance": max(second - mean**2, 0.0),
        }


def distribution(
    rates: Sequence[float], weights: Sequence[float] | None = None
) -> Distribution:
    """The distribution of X from the per-position rates p_0..p_{k-1}.

    Rates outside 0..1 are clamped (a survival function cannot leave that range). The fit
    weights default to equal, which is right when every rate comes from the same drafts.
    """
    # min(1.0, max(0.0, p)) for each rate, looped in C (1000 targets advised at a stop).
    measured = tuple(map(min, repeat(1.0), map(max, repeat(0.0), map(float, rates))))
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
    if in_position_order(per_position):
        # Positions 0..k-1 in order, as our answers and AISBench's files write them: the
        # list is the values (what the general case below builds, without its dict).
        return [float(rate) for rate in per_position.values()]
    by_pos = {int(pos): float(rate) for pos, rate in per_position.items()}
    if min(by_pos) < 0 or max(by_pos) >= MAX_POSITIONS:
        raise ValueError(f"position outside 0..{MAX_POSITIONS - 1}")
    return [by_pos.get(pos, 0.0) for pos in range(max(by_pos) + 1)]
