"""What `/metrics` answers in: text 0.0.4 or OpenMetrics by `Accept`, gzip by `Accept-Encoding`.
OpenMetrics is the text with counters named without `_total` and `# EOF` at the end: for our
families (no timestamps, exemplars, units or `_created`) the only differences."""

from __future__ import annotations

import gzip
from enum import StrEnum

TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version={version}; charset=utf-8"
OPENMETRICS_VERSIONS = ("1.0.0", "0.0.1")
# Once per state change, cached: most of level 9's win for far less time.
GZIP_LEVEL = 6


class Format(StrEnum):
    TEXT = "text"
    OPENMETRICS = "openmetrics"


def _media_ranges(accept: str) -> list[tuple[str, dict[str, str], float]]:
    ranges = []
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        if not media:
            continue
        params: dict[str, str] = {}
        for field in fields[1:]:
            key, _, value = field.partition("=")
            params[key.strip().lower()] = value.strip().strip('"')
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 0.0
        ranges.append((media, params, q))
    return ranges


def negotiate(accept: str | None, asked: str | None = None) -> tuple[Format, str]:
    """(format, Content-Type) by `Accept` (OpenMetrics if preferred); `asked` (?format=) wins."""
    if asked is not None:
        try:
            kind = Format(asked)
        except ValueError:
            raise ValueError(f"format must be text or openmetrics, not {asked!r}") from None
        if kind is Format.TEXT:
            return kind, TEXT_TYPE
        return kind, OPENMETRICS_TYPE.format(version=OPENMETRICS_VERSIONS[0])
    best_om: tuple[float, str] | None = None
    best_text = 0.0
    for media, params, q in _media_ranges(accept or ""):
        if media == "application/openmetrics-text" and q > 0:
            version = params.get("version", OPENMETRICS_VERSIONS[0])
            if version in OPENMETRICS_VERSIONS and (best_om is None or q > best_om[0]):
                best_om = (q, version)
        elif media in ("text/plain", "text/*", "*/*"):
            best_text = max(best_text, q)
    if best_om is not None and best_om[0] >= best_text:
        return Format.OPENMETRICS, OPENMETRICS_TYPE.format(version=best_om[1])
    return Format.TEXT, TEXT_TYPE


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether `Accept-Encoding` allows gzip (q > 0), as Prometheus always sends it."""
    return any(media in ("gzip", "*") and q > 0
               for media, _, q in _media_ranges(accept_encoding or ""))


def gzipped(body: bytes) -> bytes:
    """gzip with a fixed mtime, so the same body compresses to the same bytes."""
    return gzip.compress(body, GZIP_LEVEL, mtime=0)
