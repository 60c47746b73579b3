"""Pure comparison of two runs' RESULTs: per metric A, B, B - A with 95% intervals, a verdict.

Every metric is better when higher. A gate (`acceptance_length=2%`) trips only when even the
interval's end nearest to no change loses more than the limit: merely significant or merely
large differences do not, or a CI gate crying wolf on noise would soon be switched off.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.analysis.distribution import distribution, rates_from_mapping
from exporter.analysis.stats import (
    ASSUMPTION,
    CONFIDENCE,
    Estimate,
    Verdict,
    Z,
    mean_interval,
    newcombe_difference,
    normal_difference,
    verdict,
    wilson,
)
from exporter.core.aisbench import Result, Status, aggregate
from exporter.core.errors import ExporterError
from exporter.core.snapshot import Counts

RATE = "acceptance_rate"
LENGTH = "acceptance_length"
_POSITION = re.compile(r"position_(\d+)")


@dataclass(frozen=True)
class Sample:
    """What one RESULT says: counts (None for estimates) and its figures."""

    drafts: float | None
    draft_tokens: float | None
    accepted: float | None
    rates: tuple[float, ...]  # per position, in order
    acceptance_rate: float | None  # percent
    acceptance_length: float | None
    # The drafts behind each position where they differ from `drafts` (parts of mixed k).
    position_drafts: tuple[float, ...] = ()

    def drafts_at(self, pos: int) -> float | None:
        """The drafts position `pos`'s rate is over."""
        return self.position_drafts[pos] if self.position_drafts else self.drafts


def sample(result: Mapping[str, Any] | None) -> Sample | None:
    """The numbers of an `ok` RESULT, ours or AISBench's; None for N/A."""
    if not result or result.get("status") != "ok" or not result.get("data"):
        return None
    data = result["data"]
    increase = result.get("increase")
    if increase and increase.get("num_drafts", 0) > 0:
        # Our files keep the exact counts; `data` may be rounded. Position i is over the drafts
        # of the parts that draft it (an aggregate over mixed k), as `Counts` says.
        counts = Counts.from_raw(increase)
        positions = sorted(counts.per_position)
        rates = rates_from_mapping(
            {p: counts.per_position[p] / counts.drafts_at(p) for p in positions})
        behind = tuple(counts.position_drafts.get(p, counts.drafts)
                       for p in range(len(rates))) if counts.position_drafts else ()
        return Sample(counts.drafts, counts.draft_tokens, counts.accepted, tuple(rates),
                      100 * counts.accepted / counts.draft_tokens
                      if counts.draft_tokens > 0 else None,
                      1 + counts.accepted / counts.drafts, behind)
    return Sample(
        _number(data.get("num_drafts")),
        _number(data.get("draft_tokens")),
        _number(data.get("accepted_tokens")),
        tuple(rates_from_mapping(data.get("per_position_acceptance_rates") or {})),
        _number(data.get("acceptance_rate")),
        _number(data.get("acceptance_length")),
    )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def length_estimate(s: Sample) -> tuple[Estimate | None, str | None]:
    """Acceptance length's normal interval (Var X, else the Bhatia-Davis bound); a note why."""
    if s.acceptance_length is None:
        return None, None
    if s.drafts is None:
        return Estimate(s.acceptance_length), "an estimate without counts: no interval"
    if s.drafts <= 0:
        # AISBench writes length 0.0 when draft tokens grew but drafts did not: no length.
        return None, "no drafts counted: no acceptance length"
    mean = s.acceptance_length - 1
    if s.rates:
        variance, note = distribution(s.rates).variance, None
    elif s.draft_tokens:
        k = s.draft_tokens / s.drafts
        variance = max(mean * (k - mean), 0.0)
        note = "no per-position rates: the variance is bounded by m (k - m), a wider interval"
    else:
        return Estimate(s.acceptance_length), "no draft tokens: no interval"
    interval = mean_interval(s.acceptance_length, variance, s.drafts)
    return interval, note


def metric_estimates(s: Sample) -> tuple[dict[str, Estimate], list[str]]:
    """Every metric of one sample with its interval, and notes on how they were made."""
    notes = []
    estimates: dict[str, Estimate] = {}
    length, note = length_estimate(s)
    if note:
        notes.append(note)
    if s.acceptance_rate is not None:
        if length is not None and length.se is not None and s.drafts and s.draft_tokens:
            # rate = 100 (L - 1) / (draft tokens per draft): the same spread, rescaled.
            factor = 100 * s.drafts / s.draft_tokens
            se = length.se * factor
            estimates[RATE] = Estimate(s.acceptance_rate, s.acceptance_rate - Z * se,
                                       s.acceptance_rate + Z * se, se)
            per_draft = s.draft_tokens / s.drafts
            if abs(per_draft - round(per_draft)) > 1e-9:
                notes.append("drafts differ in length (n-gram drafting, or targets with "
                             f"different k): the rate's interval takes the mean, "
                             f"{per_draft:.3g} tokens per draft, as fixed")
        else:
            estimates[RATE] = Estimate(s.acceptance_rate)
    if length is not None:
        estimates[LENGTH] = length
    for i, rate in enumerate(s.rates):
        behind = s.drafts_at(i)
        interval = wilson(rate * behind, behind) if behind else None
        estimates[f"position_{i}"] = interval or Estimate(rate)
    return estimates, notes


def compare_samples(a: Sample, b: Sample) -> dict[str, Any]:
    """One comparison entry: per metric present in both, A, B, B - A and the verdict."""
    ea, notes_a = metric_estimates(a)
    eb, notes_b = metric_estimates(b)
    rows = []
    for metric in (m for m in ea if m in eb):  # metric_estimates' order: rate, length, positions
        difference = newcombe_difference if metric.startswith("position_") else normal_difference
        diff = difference(ea[metric], eb[metric])
        rows.append({
            "metric": metric,
            "a": ea[metric].as_dict(),
            "b": eb[metric].as_dict(),
            "difference": diff.as_dict(),
            "verdict": verdict(diff).value,
        })
    notes = [f"A: {n}" for n in notes_a] + [f"B: {n}" for n in notes_b]
    return {"a_drafts": a.drafts, "b_drafts": b.drafts, "metrics": rows, "notes": notes}


def compare_answers(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Compare two windows' answers ({"results": {name: RESULT}, "aggregate": RESULT})."""
    ra, rb = a.get("results") or {}, b.get("results") or {}
    targets = {}
    for name in [n for n in ra if n in rb]:
        sa, sb = sample(ra[name]), sample(rb[name])
        if sa is None or sb is None:
            targets[name] = {"metrics": [], "notes": [_na_note(ra[name], rb[name])]}
        else:
            targets[name] = compare_samples(sa, sb)
    agg_a, agg_b = sample(a.get("aggregate")), sample(b.get("aggregate"))
    aggregate = compare_samples(agg_a, agg_b) if agg_a and agg_b else None
    return {
        "confidence": CONFIDENCE,
        "assumption": ASSUMPTION,
        "targets": targets,
        "aggregate": aggregate,
        "only_in_a": [n for n in ra if n not in rb],
        "only_in_b": [n for n in rb if n not in ra],
        "segments": compare_segments(a, b),
    }


def _na_note(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> str:
    parts = []
    for side, result in (("A", a), ("B", b)):
        if sample(result) is None:
            parts.append(f"{side} is N/A: {(result or {}).get('error') or 'no data'}")
    return "; ".join(parts)


class GateError(ExporterError):
    """A `--fail-if-worse` value that cannot be read."""


@dataclass(frozen=True)
class Gate:
    """`METRIC=LIMIT`: trip when B is worse than A by more than LIMIT with 95% confidence."""

    metric: str
    limit: float
    relative: bool  # LIMIT was given in percent of A's value

    def __str__(self) -> str:
        return f"{self.metric}={self.limit:g}{'%' if self.relative else ''}"

    def drop(self, a: float, b: float) -> float:
        """How much worse B is, in the limit's unit (percent of A, or absolute)."""
        if self.relative:
            if a == 0:
                return math.inf if b < a else 0.0
            return (a - b) / abs(a) * 100
        return a - b


def parse_gate(text: str) -> Gate:
    """`acceptance_length=2%` (relative) or `acceptance_rate=1.5` (absolute, metric units)."""
    metric, sep, limit = text.partition("=")
    metric = metric.strip()
    if not sep or not limit.strip():
        raise GateError(f"--fail-if-worse {text!r}: want METRIC=LIMIT, e.g. acceptance_length=2%")
    if metric not in (RATE, LENGTH) and not _POSITION.fullmatch(metric):
        raise GateError(f"--fail-if-worse {text!r}: unknown metric {metric!r}; known: "
                        f"{RATE}, {LENGTH}, position_<i>")
    limit = limit.strip()
    relative = limit.endswith("%")
    try:
        value = float(limit.removesuffix("%"))
    except ValueError:
        raise GateError(f"--fail-if-worse {text!r}: limit {limit!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise GateError(f"--fail-if-worse {text!r}: limit must be a number >= 0")
    return Gate(metric, value, relative)


def apply_gates(comparison: dict[str, Any], gates: list[Gate]) -> dict[str, Any]:
    """The comparison with `gates` (each gate per target and aggregate) and `tripped`."""
    entries = [(name, entry) for name, entry in comparison["targets"].items()]
    if comparison["aggregate"] is not None:
        entries.append(("all", comparison["aggregate"]))
    checks = []
    for gate in gates:
        for name, entry in entries:
            for row in entry["metrics"]:
                if row["metric"] == gate.metric:
                    # The smallest drop the 95% interval of B - A allows (none without one).
                    a, high = row["a"]["value"], row["difference"].get("high")
                    least = None if high is None else gate.drop(a, a + high)
                    checks.append({
                        "gate": str(gate), "target": name,
                        "drop": gate.drop(a, row["b"]["value"]),
                        "least_drop": least, "verdict": row["verdict"],
                        "tripped": (row["verdict"] == Verdict.WORSE and least is not None
                                    and least > gate.limit),
                    })
    return comparison | {"gates": checks, "tripped": any(c["tripped"] for c in checks)}


def summed_result(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The aggregate of several RESULTs (counts summed, then divided); estimates stay out."""
    counted = []
    for name, result in results.items():
        if result.get("status") == Status.OK and isinstance(result.get("increase"), Mapping):
            counted.append((name, Result.from_json(result)))  # our own file: exact counts
            continue
        s = sample(result)
        if s is None or not s.drafts or s.draft_tokens is None or s.accepted is None:
            continue
        per_position = {i: rate * s.drafts for i, rate in enumerate(s.rates)}
        counts = Counts(s.drafts, s.draft_tokens, s.accepted, per_position)
        counted.append((name, Result(status=Status.OK, url=None, increase=counts)))
    total = aggregate(counted)
    return total.to_json() if total.ok else None


def _by(answer: Mapping[str, Any]) -> Mapping[str, Any]:
    """The aggregate's `per_request.by` of a window's answer ({} without the proxy)."""
    per_request = answer.get("per_request")
    aggregate = per_request.get("aggregate") if isinstance(per_request, Mapping) else None
    by = aggregate.get("by") if isinstance(aggregate, Mapping) else None
    return by if isinstance(by, Mapping) else {}


def _segment_length(segment: object) -> Estimate | None:
    """A segment's acceptance length with its normal interval, None without a figure."""
    figure = segment.get("acceptance_length") if isinstance(segment, Mapping) else None
    if not isinstance(figure, Mapping) or any(
            _number(figure.get(k)) is None for k in ("value", "low", "high")):
        return None
    return Estimate(figure["value"], figure["low"], figure["high"],
                    (figure["high"] - figure["value"]) / Z)


def compare_segments(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Acceptance length segment by segment: per dimension of the aggregate's segments, each
    value in both windows with A, B, B - A and the verdict (`unknown` where a side has too few
    requests for a figure)."""
    by_a, by_b = _by(a), _by(b)
    out: dict[str, list[Any]] = {}
    for dimension, values in by_a.items():
        theirs = by_b.get(dimension)
        if not isinstance(values, Mapping) or not isinstance(theirs, Mapping):
            continue
        rows = []
        for value in (v for v in values if v in theirs):
            ea, eb = _segment_length(values[value]), _segment_length(theirs[value])
            diff = normal_difference(ea, eb) if ea is not None and eb is not None else None
            rows.append({"value": value, "a_requests": values[value].get("requests"),
                         "b_requests": theirs[value].get("requests"),
                         "a": ea and ea.as_dict(), "b": eb and eb.as_dict(),
                         "difference": diff and diff.as_dict(),
                         "verdict": (verdict(diff) if diff else Verdict.UNKNOWN).value})
        if rows:
            out[dimension] = rows
    return out
