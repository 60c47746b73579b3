"""Pure math of the speculation advisor: which number of speculative tokens k' to run.

With k' <= k drafted tokens the expected tokens per target forward pass is exactly
L(k') = 1 + sum_{i<k'} p_i: the first k' positions do not depend on what is drafted after
them. With c the cost of drafting one token relative to one target forward pass, the expected
speed-up over no speculation is S(k') = L(k') / (1 + c k') (Leviathan et al., "Fast Inference
from Transformers via Speculative Decoding", 2023, with measured instead of modelled
acceptance). Past k the rates are unmeasured: a geometric fit of the measured ones extends
them to 2k, and every such row is marked as an estimate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from exporter.distribution import Distribution, distribution, rates_from_mapping

DEFAULT_COSTS = (0.0, 0.05, 0.1, 0.25)
TAIL_FIT = "least squares of log p_i on i over the measured positions with p_i > 0"


class AdviceRow(TypedDict):
    """One k' of the advisor table: L, and S per draft cost key."""

    k: int
    length: float
    estimate: bool  # past the measured k: rates from the tail fit
    speedup: dict[str, float]


class Best(TypedDict):
    """The best k' for one draft cost."""

    k: int
    speedup: float
    estimate: bool


def expected_length(rates: Sequence[float], k: int) -> float:
    """L(k) = 1 + sum of the first k rates (tokens per target forward pass)."""
    if k < 0 or k > len(rates):
        raise ValueError(f"k={k} outside 0..{len(rates)}")
    return 1.0 + sum(rates[:k])


def speedup(length: float, cost: float, k: int) -> float:
    """S = L / (1 + c k): tokens per unit of time relative to plain decoding."""
    return length / (1.0 + cost * k)


def tail_ratio(rates: Sequence[float]) -> float | None:
    """The ratio r of a geometric fit p_i ~ a r^i; None without any positive rate.

    One positive rate alone (k = 1) gives r = p_0: drafts accepted token by token at the same
    odds, the model of Leviathan et al.
    """
    points = [(i, math.log(p)) for i, p in enumerate(rates) if p > 0]
    if not points:
        return None
    if len(points) == 1:
        return min(1.0, rates[points[0][0]])
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return min(1.0, max(0.0, math.exp(sxy / sxx)))


def extended_rates(rates: Sequence[float], upto: int) -> tuple[list[float], float | None]:
    """The measured rates, then p_i = p_{k-1} r^(i-k+1) up to `upto` positions; and r.

    The tail is anchored at the last measured rate so it continues the measured curve.
    """
    ratio = tail_ratio(rates)
    extended = list(rates)
    last = rates[-1] if rates else 0.0
    for i in range(len(rates), upto):
        extended.append(0.0 if ratio is None else last * ratio ** (i - len(rates) + 1))
    return extended, ratio


def cost_key(cost: float) -> str:
    """A draft cost as a JSON key: 0, 0.05, 0.1, 0.25."""
    return format(cost, "g")


def advice(dist: Distribution, costs: Sequence[float] = DEFAULT_COSTS) -> dict[str, Any]:
    """The advisor table: per k' = 1..2k, L and S per cost; the best k' per cost.

    k' = 0 (no speculation, S = 1) is a candidate too: with a costly drafter it can win.
    """
    k = dist.k
    if k == 0:
        return {"k": 0, "error": "no per-position rates: the advisor needs them"}
    rates, ratio = extended_rates(dist.rates, 2 * k)
    # A stop over 1000 targets advises each one on the event loop: keys made once, L summed
    # as it goes (the same values as expected_length, at a fraction of the calls).
    keyed = [(cost_key(c), c) for c in costs]
    rows: list[AdviceRow] = []
    length = 1.0
    for kk in range(1, 2 * k + 1):
        length += rates[kk - 1]
        rows.append({
            "k": kk,
            "length": length,
            "estimate": kk > k,
            "speedup": {key: length / (1.0 + c * kk) for key, c in keyed},
        })
    best: dict[str, Best] = {}
    for key, _ in keyed:
        top: Best = {"k": 0, "speedup": 1.0, "estimate": False}
        for row in rows:
            if row["speedup"][key] > top["speedup"] + 1e-12:
                top = {"k": row["k"], "speedup": row["speedup"][key], "estimate": row["estimate"]}
        best[key] = top
    return {
        "k": k,
        "draft_costs": [float(c) for c in costs],
        "monotone": dist.monotone,
        "tail_ratio": ratio,
        "tail_fit": TAIL_FIT,
        "rows": rows,
        "best": best,
        "distribution": dist.as_dict(),
    }


def result_rates(result: Mapping[str, Any] | None) -> list[float] | None:
    """Per-position rates of one RESULT (ours or AISBench's); None when it has none."""
    if not result or result.get("status") != "ok":
        return None
    increase = result.get("increase")
    if increase and increase.get("num_drafts", 0) > 0 and increase.get("accepted_per_pos"):
        # Our files keep the exact counts: rates at full precision whatever `data` rounds to.
        drafts = increase["num_drafts"]
        rates = rates_from_mapping(
            {p: v / drafts for p, v in increase["accepted_per_pos"].items()})
    else:
        rates = rates_from_mapping((result.get("data") or {}).get("per_position_acceptance_rates")
                                   or {})
    return rates or None


def result_advice(
    result: Mapping[str, Any] | None, costs: Sequence[float] = DEFAULT_COSTS
) -> dict[str, Any] | None:
    """The advisor table of one RESULT; None when it has no per-position rates."""
    rates = result_rates(result)
    return None if rates is None else advice(distribution(rates), costs)


def window_advice(
    answer: Mapping[str, Any], costs: Sequence[float] = DEFAULT_COSTS
) -> dict[str, Any]:
    """`advice` of a stop answer: per target (None without rates) and for the aggregate."""
    results = {name: result_advice(r, costs) for name, r in (answer.get("results") or {}).items()}
    ks = sorted({a["k"] for a in results.values() if a and "error" not in a})
    if len(ks) > 1:
        # Servers with k = 3 never draft position 4: summed, they dilute the deeper rates of
        # the k = 5 ones, and the "best k" of the mixture is nobody's best k.
        aggregate: dict[str, Any] | None = {
            "k": 0, "error": f"targets run different k ({', '.join(map(str, ks))}): advice "
                             "is per target only"}
    else:
        aggregate = result_advice(answer.get("aggregate"), costs)
    return {"draft_costs": [float(c) for c in costs], "results": results, "aggregate": aggregate}
