"""Pure math from counter increases to the figures users read: rate, length, per position."""

from __future__ import annotations

from typing import Any

from exporter.snapshot import Counts


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
    """Per position, accepted at that position / drafts, in numeric position order."""
    if counts.drafts <= 0:
        return {}
    return {pos: counts.per_position[pos] / counts.drafts for pos in sorted(counts.per_position)}


def result_data(counts: Counts) -> dict[str, Any]:
    """The `data` part of an AISBench RESULT (rounded as AISBench rounds); needs drafts > 0."""
    ratio = acceptance_ratio(counts)
    length = acceptance_length(counts)
    return {
        "num_drafts": _int(counts.drafts),
        "draft_tokens": _int(counts.draft_tokens),
        "accepted_tokens": _int(counts.accepted),
        "acceptance_rate": round(100.0 * ratio, 2) if ratio is not None else None,
        "acceptance_length": round(length, 3) if length is not None else None,
        "per_position_acceptance_rates": {
            str(pos): round(rate, 4) for pos, rate in position_ratios(counts).items()
        },
    }


def has_activity(counts: Counts) -> bool:
    """Whether any draft happened (the condition for an `ok` result)."""
    return counts.drafts > 0 or counts.draft_tokens > 0


def _int(value: float) -> int | float:
    # Counters are integral in vLLM; keep a fraction rather than hide it if one ever shows up.
    return int(value) if float(value).is_integer() else value
