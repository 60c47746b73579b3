"""Times as people read them in notes, on the console and in JSON: ISO 8601 UTC, to the ms."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any


def iso_utc(at: float) -> str:
    """`2026-12-02T18:00:05.250Z` for a Unix time in seconds."""
    text = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    return text.removesuffix("+00:00") + "Z"


def with_iso_times(value: Any) -> Any:
    """`value` with an ISO string beside every epoch time: `started_at` gets `started_at_iso`.

    JSON answers keep the Unix seconds scripts compute with, and add what a person reads;
    keys ending in `_at` with a number are times, at any depth.
    """
    if isinstance(value, list):
        return [with_iso_times(item) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        out[key] = with_iso_times(item)
        if not (isinstance(key, str) and key.endswith("_at")):
            continue
        if item is None:
            out[f"{key}_iso"] = None  # not yet (a window still open): the key is always there
        elif isinstance(item, int | float) and not isinstance(item, bool) and math.isfinite(item):
            out[f"{key}_iso"] = iso_utc(item)
    return out
