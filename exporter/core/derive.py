"""Pure math from counter increases to the figures users read: rate, length, per position."""

from __future__ import annotations

from typing import Any

from exporter.core.snapshot import Counts, integral


def acceptance_ratio(counts: Counts) -> float | None:
    """Accepted / draft tokens, 0..1; None without draft tokens."""
    if counts.draft_tokens <= 0:
        return None
    return counts.accepted / counts.draft_tokens


def acceptance_length(counts: Counts) -> float | None:
    """Tokens per forward pass: 1 + accepted / drafts; None without drafts."""
    if counts.drafts <= 0:
        return None
    return 1.0 + counts.accepted / counts.drafts


def position_ratios(counts: Counts) -> dict[int, float]:
    """Per position, accepted at it / the drafts behind it (see `Counts`), in numeric order."""
    if not counts.position_drafts:  # the usual case: every position over all the drafts
        drafts = counts.drafts
        per_position = counts.per_position
        if drafts <= 0:
            return {}
        return {pos: per_position[pos] / drafts for pos in sorted(per_position)}
    ratios = {}
    for pos in sorted(counts.per_position):
        drafts = counts.drafts_at(pos)
        if drafts > 0:
            ratios[pos] = counts.per_position[pos] / drafts
    return ratios


def span_figures(start: Counts, end: Counts) -> tuple[float | None, float | None,
                                                     dict[int, float]]:
    """`acceptance_ratio`, `acceptance_length` and `position_ratios` of `end - start`, by the
    same float operations."""
    before, after = start.per_position, end.per_position
    if start.position_drafts or end.position_drafts or not after.keys() <= before.keys():
        counts = end - start
        return acceptance_ratio(counts), acceptance_length(counts), position_ratios(counts)
    drafts = end.drafts - start.drafts
    tokens = end.draft_tokens - start.draft_tokens
    accepted = end.accepted - start.accepted
    ratio = accepted / tokens if tokens > 0 else None
    if drafts <= 0:
        return ratio, None, {}
    return ratio, 1.0 + accepted / drafts, {
        pos: (after[pos] - before[pos]) / drafts for pos in sorted(after)
    }


def result_data(counts: Counts) -> dict[str, Any]:
    """The `data` part of an AISBench RESULT, in full precision (rounding here first would
    make displays print the wrong second decimal)."""
    ratio = acceptance_ratio(counts)
    length = acceptance_length(counts)
    drafts, per_position = counts.drafts, counts.per_position
    if not counts.position_drafts and drafts > 0:
        # The usual case of `position_ratios`, keyed for JSON in the same pass.
        rates = {str(pos): per_position[pos] / drafts for pos in sorted(per_position)}
    else:
        rates = {str(pos): rate for pos, rate in position_ratios(counts).items()}
    return {
        "num_drafts": integral(counts.drafts),
        "draft_tokens": integral(counts.draft_tokens),
        "accepted_tokens": integral(counts.accepted),
        "acceptance_rate": 100.0 * ratio if ratio is not None else None,
        "acceptance_length": length,
        "per_position_acceptance_rates": rates,
    }


def has_activity(counts: Counts) -> bool:
    """Whether any draft happened (the condition for an `ok` result)."""
    return counts.drafts > 0 or counts.draft_tokens > 0
