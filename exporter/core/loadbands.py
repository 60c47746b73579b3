"""Acceptance against load: each scrape interval's increase kept by the server's running-requests
band (powers of two: 0, 1, 2-3, 4-7, ...), so a window says how acceptance moved with load.

An interval's band is that of the mean of the running-requests gauge at its two scrapes, rounded
half up to a whole number of requests (the one reading there is, where a scrape had none); an
interval neither of whose scrapes had the gauge is in `UNKNOWN`. Every interval is in one band,
so the bands' sums are the window's increase exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from exporter.core.derive import result_data
from exporter.core.snapshot import Counts, in_position_order, integral, sum_counts

UNKNOWN = -1  # the band of an interval without a reading of the gauge
_UNKNOWN_LABEL = "unknown"

# Per band (its lower bound, or UNKNOWN): the intervals in it and their increase summed.
Bands = Mapping[int, tuple[int, Counts]]


def interval_band(before: float | None, after: float | None) -> int:
    """The band of an interval whose scrapes read `before` and `after` running requests."""
    readings = [r for r in (before, after) if r is not None]
    if not readings:
        return UNKNOWN
    requests = math.floor(sum(readings) / len(readings) + 0.5)
    return 0 if requests <= 0 else 1 << (requests.bit_length() - 1)


def band_label(band: int) -> str:
    """`0`, `1`, `2-3`, `4-7`, ... (`unknown` for UNKNOWN): the label of a band."""
    if band == UNKNOWN:
        return _UNKNOWN_LABEL
    return str(band) if band < 2 else f"{band}-{2 * band - 1}"


def band_of(label: str) -> int:
    """Inverse of `band_label`; ValueError for another text."""
    if label == _UNKNOWN_LABEL:
        return UNKNOWN
    band = int(label.partition("-")[0])
    if band_label(band) != label:
        raise ValueError(f"not a load band: {label!r}")
    return band


def with_interval(bands: Bands, band: int, increase: Counts) -> dict[int, tuple[int, Counts]]:
    """`bands` with one more interval of `increase` in `band` (a new mapping)."""
    intervals, counts = bands.get(band, (0, Counts()))
    return {**bands, band: (intervals + 1, counts + increase)}


def summed(parts: Iterable[Bands]) -> dict[int, tuple[int, Counts]]:
    """Several targets' bands, band by band (each band's counts added in the parts' order)."""
    intervals: dict[int, int] = {}
    counts: dict[int, list[Counts]] = {}
    for bands in parts:
        for band, (n, increase) in bands.items():
            intervals[band] = intervals.get(band, 0) + n
            counts.setdefault(band, []).append(increase)
    return {band: (n, sum_counts(counts[band])) for band, n in intervals.items()}


def reported(bands: Bands) -> bool:
    """Whether `bands` say anything of load: an interval in a band of a reading."""
    return any(band != UNKNOWN for band in bands)


def bands_json(bands: Bands) -> dict[str, Any]:
    """Per band label, in band order: intervals, AISBench's `data` figures and the increase."""
    order = sorted(bands, key=lambda band: (band == UNKNOWN, band))
    return {band_label(band): {"intervals": bands[band][0], **result_data(bands[band][1]),
                               "increase": bands[band][1].as_raw()} for band in order}


def bands_from_json(body: object) -> dict[int, tuple[int, Counts]]:
    """Inverse of `bands_json` (empty for anything else)."""
    if not isinstance(body, Mapping):
        return {}
    return {band_of(label): (int(entry["intervals"]), Counts.from_raw(entry["increase"]))
            for label, entry in body.items()}


def bands_row(bands: Bands) -> dict[str, list[Any]]:
    """The bands as an accumulator's row keeps them (written every round, so short): per band,
    `[intervals, drafts, draft tokens, accepted, per position]` and the positions' drafts where
    `Counts` has them."""
    row = {}
    for band, (intervals, counts) in bands.items():
        per_position = counts.per_position
        positions: list[float] | dict[str, float] = (
            list(map(integral, per_position.values())) if in_position_order(per_position)
            else {str(p): integral(v) for p, v in per_position.items()})
        entry = [intervals, *map(integral, (counts.drafts, counts.draft_tokens, counts.accepted)),
                 positions]
        if counts.position_drafts:
            entry.append({str(p): v for p, v in counts.position_drafts.items()})
        row[str(band)] = entry
    return row


def bands_from_row(row: Mapping[str, Sequence[Any]]) -> dict[int, tuple[int, Counts]]:
    """Inverse of `bands_row`."""
    bands = {}
    for band, (intervals, drafts, tokens, accepted, positions, *uneven) in row.items():
        per_position = ({int(p): float(v) for p, v in positions.items()}
                        if isinstance(positions, Mapping)
                        else {p: float(v) for p, v in enumerate(positions)})
        position_drafts = {int(p): float(v) for p, v in uneven[0].items()} if uneven else {}
        bands[int(band)] = (int(intervals), Counts(float(drafts), float(tokens), float(accepted),
                                                   per_position, position_drafts))
    return bands
