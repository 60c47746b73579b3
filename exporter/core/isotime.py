"""Times as people read them in notes, on the console and in JSON: ISO 8601 UTC, to the ms."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from typing import Any, TypeGuard

# Whole seconds' `2026-12-02T18:00:05`, as datetime writes them; cleared when full.
_SECONDS: dict[int, str] = {}
_MAX_SECONDS = 4096
_YEAR_10000 = 253402300800.0


def iso_utc(at: float) -> str:
    """`2026-12-02T18:00:05.250Z` for a Unix time in seconds."""
    if not 0.0 <= at < _YEAR_10000:  # NaN too
        return _iso_datetime(at)
    # datetime.fromtimestamp's own steps: the fraction rounded half to even to microseconds
    # (carried into the second at 1e6), then cut to milliseconds by isoformat.
    fraction, whole = math.modf(at)
    micro = round(fraction * 1e6)
    second = int(whole)
    if micro >= 1_000_000:
        micro -= 1_000_000
        second += 1
    head = _SECONDS.get(second)
    if head is None:
        if len(_SECONDS) >= _MAX_SECONDS:
            _SECONDS.clear()
        head = _SECONDS[second] = _iso_datetime(second)[:-5]
    return f"{head}.{micro // 1000:03d}Z"


def _iso_datetime(at: float) -> str:
    text = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    return text.removesuffix("+00:00") + "Z"


def with_iso_times(value: Any) -> Any:
    """`value` with `<key>_iso` beside every `<key>_at` epoch time, at any depth."""
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
        elif is_number(item):
            out[f"{key}_iso"] = iso_utc(item)
    return out


def is_number(value: object) -> TypeGuard[float]:
    """A finite int or float (not a bool): a time, or a count, from JSON."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_time(text: str, now: float | None = None) -> float:
    """Unix seconds of `now`, `-30m` (s, m, h, d), Unix seconds, or ISO 8601 (UTC if naive)."""
    now = time.time() if now is None else now
    text = text.strip()
    if text == "now":
        return now
    if found := _RELATIVE.match(text):
        return now - float(found.group(1)) * _UNIT[found.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"{text!r}: give ISO 8601, Unix seconds, -30m or now") from exc
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.timestamp()
