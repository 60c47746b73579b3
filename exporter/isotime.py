"""Times as people read them in notes and on the console: ISO 8601 UTC, to the millisecond."""

from __future__ import annotations

from datetime import UTC, datetime


def iso_utc(at: float) -> str:
    """`2026-12-02T18:00:05.250Z` for a Unix time in seconds."""
    text = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    return text.removesuffix("+00:00") + "Z"
