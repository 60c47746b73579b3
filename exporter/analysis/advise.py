"""Pure math of the speculation advisor: which number of speculative tokens k' to run.

For k' <= k, L(k') = 1 + sum_{i<k'} p_i exactly (a position does not depend on later ones);
with draft cost c, S(k') = L(k') / (1 + c k') (Leviathan et al., 2023, with measured
acceptance). Past k a geometric fit of the measured rates extends them to 2k, as estimates.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from itertools import accumulate, repeat
from operator import mul, sub, truediv
from typing import Any

from exporter.analysis.distribution import Distribution, distribution, rates_from_mapping
from exporter.analysis.speedup import split_timings
from exporter.core.segments import MIN_REQUESTS

DEFAULT_COSTS = (0.0, 0.05, 0.1, 0.25)
TAIL_FIT = "least squares of log p_i on i over the measured positions with p_i > 0"
NOT_BY_RATE = (
    "k is ranked by the speed-up S, never by the acceptance rate: the rate is accepted over "
    "drafted tokens, and each position added is drafted at every step but accepted only after "
    "all before it, so the rate falls as k grows whatever the drafter; ranked by it, k = 1 "
    "would always win")


def tail_ratio(rates: Sequence[float]) -> float | None:
    """The ratio r of a geometric fit p_i ~ a r^i (one positive rate: r = p_0); None without."""
    # Looped in C with map: the same float operations, summed in the same order.
    xs = [i for i, p in enumerate(rates) if p > 0]
    if not xs:
        return None
    if len(xs) == 1:
        return min(1.0, rates[xs[0]])
    n = len(xs)
    ys = [math.log(p) for p in rates if p > 0]
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    dx = list(map(sub, xs, repeat(mean_x)))
    sxx = sum(map(pow, dx, repeat(2)))
    sxy = sum(map(mul, dx, map(sub, ys, repeat(mean_y))))
    return min(1.0, max(0.0, math.exp(sxy / sxx)))


def extended_rates(rates: Sequence[float], upto: int) -> tuple[list[float], float | None]:
    """The measured rates, then p_i = p_{k-1} r^(i-k+1) up to `upto` positions; and r."""
    ratio = tail_ratio(rates)
    extended = list(rates)
    last = rates[-1] if rates else 0.0
    past = range(1, upto - len(rates) + 1)
    if ratio is None:
        extended += [0.0] * len(past)
    else:
        extended += map(mul, repeat(last), map(pow, repeat(ratio), past))
    return extended, ratio


def advice(dist: Distribution, costs: Sequence[float] = DEFAULT_COSTS) -> dict[str, Any]:
    """The advisor table: per k' = 1..2k, L and S per cost; the best k' (0 too) per cost."""
    k = len(dist.rates)
    if k == 0:
        return {"k": 0, "error": "no per-position rates: the advisor needs them"}
    rates, ratio = extended_rates(dist.rates, 2 * k)
    # Looped in C, with the float operations of the definitions in their order.
    keys, denominators = _cost_table(tuple(costs), 2 * k)
    lengths = list(accumulate(rates, initial=1.0))[1:]
    columns = [list(map(truediv, lengths, column)) for column in denominators]
    return {
        "k": k,
        "draft_costs": list(map(float, costs)),
        "monotone": dist.monotone,
        "tail_ratio": ratio,
        "tail_fit": TAIL_FIT,
        "rows": _rows(k, keys, lengths, columns),
        "best": {key: _best(column, k) for key, column in zip(keys, columns, strict=True)},
        "distribution": dist.as_dict(),
    }


def _rows(
    k: int, keys: Sequence[str], lengths: Sequence[float], columns: Sequence[Sequence[float]]
) -> list[dict[str, Any]]:
    """Per k' = 1..2k: k', L, whether it is past the measured k, and S per cost key."""
    counts = range(1, len(lengths) + 1)
    if len(keys) == 4:
        # The default costs: S per cost as a dict display, faster than dict(zip(...)).
        k0, k1, k2, k3 = keys
        return [
            {"k": kk, "length": length, "estimate": kk > k, "speedup": {k0: a, k1: b, k2: c, k3: d}}
            for kk, length, a, b, c, d in zip(counts, lengths, *columns, strict=True)
        ]
    speeds = zip(*columns, strict=True) if columns else [()] * len(lengths)
    return [
        {"k": kk, "length": length, "estimate": kk > k,
         "speedup": dict(zip(keys, row, strict=True))}
        for kk, length, row in zip(counts, lengths, speeds, strict=True)
    ]


def _best(speedups: Sequence[float], k: int) -> dict[str, Any]:
    """The first k' whose S beats the best so far by more than rounding; k' = 0 (S = 1) first."""
    top_k, top, beat = 0, 1.0, 1.0 + 1e-12
    for kk, value in enumerate(speedups, 1):
        if value > beat:
            top_k, top, beat = kk, value, value + 1e-12
    return {"k": top_k, "speedup": top, "estimate": top_k > k}


@functools.lru_cache(maxsize=64)
def _cost_table(
    costs: tuple[float, ...], upto: int
) -> tuple[tuple[str, ...], tuple[tuple[float, ...], ...]]:
    """The costs' JSON keys (0, 0.05), and per cost the denominators 1 + c k', k' = 1..upto."""
    return (
        tuple(format(c, "g") for c in costs),
        tuple(tuple(1.0 + c * kk for kk in range(1, upto + 1)) for c in costs),
    )


def result_advice(
    result: Mapping[str, Any] | None, costs: Sequence[float] = DEFAULT_COSTS
) -> dict[str, Any] | None:
    """The advisor table of one RESULT (ours or AISBench's); None without per-position rates."""
    if not result or result.get("status") != "ok":
        return None
    increase = result.get("increase")
    if increase and increase.get("num_drafts", 0) > 0 and increase.get("accepted_per_pos"):
        # Our files keep the exact counts: rates at full precision whatever `data` rounds to.
        drafts = increase["num_drafts"]
        rates = rates_from_mapping({p: v / drafts for p, v in increase["accepted_per_pos"].items()})
    else:
        rates = rates_from_mapping((result.get("data") or {}).get("per_position_acceptance_rates")
                                   or {})
    return advice(distribution(rates), costs) if rates else None


def window_advice(
    answer: Mapping[str, Any], costs: Sequence[float] = DEFAULT_COSTS,
    made: Mapping[str, dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """`advice` per target (None without rates) and aggregate; `made`: targets' advice made."""
    made = made or {}
    results = {name: made[name] if name in made else result_advice(r, costs)
               for name, r in (answer.get("results") or {}).items()}
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


def _tpot(answer: Mapping[str, Any]) -> float | None:
    """A window's mean time per output token (ms) over its timed requests, all targets."""
    block = (answer.get("per_request") or {}).get("aggregate") or {}
    figures = (block.get("timing") or {}).get("tpot_ms")
    return figures["mean"] if isinstance(figures, Mapping) and figures.get("mean") else None


def _band_tpots(answer: Mapping[str, Any]) -> dict[str, float]:
    """Mean TPOT (ms) per concurrency band with at least MIN_REQUESTS timed TPOTs."""
    return {band: t.spreads["tpot_ms"].total / t.spreads["tpot_ms"].count
            for band, t in split_timings(answer, "concurrency").items()
            if t.spreads["tpot_ms"].count >= MIN_REQUESTS and t.spreads["tpot_ms"].total > 0}


def _cost(tpot_a: float, tpot_b: float, length: float, per_step: float) -> dict[str, Any]:
    step_ratio = tpot_b * length / tpot_a
    return {"value": max((step_ratio - 1) / per_step, 0.0), "baseline_tpot_ms": tpot_a,
            "tpot_ms": tpot_b, "acceptance_length": length, "draft_tokens_per_step": per_step,
            "step_ratio": step_ratio, "note": None if step_ratio >= 1 else
            "a spec step took less than a no-spec one (other load, other hardware?): c = 0"}


def measured_cost(baseline: Mapping[str, Any], answer: Mapping[str, Any]) -> dict[str, Any]:
    """The draft cost c that S = L / (1 + c k') assumes, measured: a spec step (B's TPOT times
    the tokens per step L) over a no-spec step (the baseline's TPOT: one token a step), less
    one, per token drafted; per concurrency band timed in both windows (`by_concurrency`),
    the window's one figure beside it; or why it cannot be measured."""
    tpot_a, tpot_b = _tpot(baseline), _tpot(answer)
    data = (answer.get("aggregate") or {}).get("data") or {}
    drafts, drafted = data.get("num_drafts"), data.get("draft_tokens")
    if tpot_a is None or tpot_b is None:
        side = "the baseline" if tpot_a is None else "the window"
        return {"error": f"{side} has no timed requests (TPOT): run it through the proxy"}
    if not drafts or not drafted or data.get("acceptance_length") is None:
        return {"error": "the window counted no drafts: no step to measure"}
    length, per_step = data["acceptance_length"], drafted / drafts
    bands_a, bands_b = _band_tpots(baseline), _band_tpots(answer)
    # The window's acceptance length and drafts a step for every band: the counters are not
    # split, and the load changes a step's time, not what it accepts.
    by_band = {band: _cost(bands_a[band], bands_b[band], length, per_step)
               for band in bands_b if band in bands_a}
    source = (f"per concurrency band ({', '.join(by_band)}), each timed in both windows"
              if by_band else "the window's one figure: no concurrency band has "
              f"{MIN_REQUESTS} timed requests in both windows")
    return _cost(tpot_a, tpot_b, length, per_step) | {"by_concurrency": by_band,
                                                        "source": source}
