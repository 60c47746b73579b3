"""Pure math: the distribution of X, the accepted tokens per draft, from per-position rates.
Position i+1 is accepted only if i was, so the rates are X's survival function P(X >= i+1)."""

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


def isotonic_non_increasing(values: Sequence[float]) -> list[float]:
    """The non-increasing sequence closest to `values` in least squares (PAV)."""
    # Each block: [mean, count]; a block that rises above its left neighbour is pooled.
    blocks: list[list[float]] = []
    for value in values:
        blocks.append([float(value), 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0] - _TOLERANCE:
            mean2, count2 = blocks.pop()
            mean1, count1 = blocks[-1]
            count = count1 + count2
            blocks[-1] = [(mean1 * count1 + mean2 * count2) / count, count]
    return [mean for mean, count in blocks for _ in range(int(count))]


def is_non_increasing(values: Sequence[float]) -> bool:
    """Whether every value is at most its predecessor (up to float rounding)."""
    # b <= a + tolerance for each neighbouring pair, looped in C.
    return all(map(le, values[1:], map(add, values, repeat(_TOLERANCE))))


@dataclass(frozen=True)
class Distribution:
    """X = accepted tokens per draft, for a window with k = len(rates) positions."""

    measured: tuple[float, ...]  # the per-position rates as measured (clamped to 0..1)
    rates: tuple[float, ...]  # non-increasing: the measured ones, or their isotonic fit
    monotone: bool  # the measured rates were already non-increasing

    @property
    def variance(self) -> float:
        """Var[X]: E[X^2] = sum_i (2i + 1) p_i for a survival function p, E[X] = sum_i p_i."""
        second: float = sum(map(mul, range(1, 2 * len(self.rates), 2), self.rates))
        return max(second - sum(self.rates)**2, 0.0)

    def as_dict(self) -> dict[str, Any]:
        """JSON shape: measured and used rates, P(X = j) = p_{j-1} - p_j, mean, variance."""
        rates = self.rates
        survival = (1.0, *rates, 0.0)
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
            "mean": sum(rates),
            "variance": self.variance,
        }


def distribution(rates: Sequence[float]) -> Distribution:
    """The distribution of X from the rates p_0..p_{k-1}, clamped to 0..1."""
    # min(1.0, max(0.0, p)) for each rate, looped in C.
    measured = tuple(map(min, repeat(1.0), map(max, repeat(0.0), map(float, rates))))
    if is_non_increasing(measured):
        return Distribution(measured, measured, True)
    return Distribution(measured, tuple(isotonic_non_increasing(measured)), False)


def rates_from_mapping(per_position: Mapping[str, float] | Mapping[int, float]) -> list[float]:
    """Rates in position order from {"0": p0, ...} (str or int keys); a missing one is 0."""
    if not per_position:
        return []
    if in_position_order(per_position):
        # Positions 0..k-1 in order, as ours and AISBench's files write them: just the values.
        return [float(rate) for rate in per_position.values()]
    by_pos = {int(pos): float(rate) for pos, rate in per_position.items()}
    if min(by_pos) < 0 or max(by_pos) >= MAX_POSITIONS:
        raise ValueError(f"position outside 0..{MAX_POSITIONS - 1}")
    return [by_pos.get(pos, 0.0) for pos in range(max(by_pos) + 1)]
