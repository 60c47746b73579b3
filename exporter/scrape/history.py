"""Raw samples from a Prometheus-compatible store (Prometheus, Thanos, Mimir, VictoriaMetrics).

Range selectors in instant queries, never `rate()`/`increase()` (they extrapolate), read in chunks
that stay under the stores' points-per-series limit (Prometheus's is 11,000).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exporter.config.model import StoreAuth
from exporter.core.errors import ExporterError
from exporter.core.history import RawSeries, family_names
from exporter.core.redact import redact_url

log = logging.getLogger(__name__)

CHUNK_SECONDS = 7200.0  # a 1s scrape interval's two hours
MAX_SERIES = 10_000
MAX_BYTES = 256 * 1024 * 1024
# A `--match` is label matchers only: the metric names are ours to pick.
_MATCHERS = re.compile(r"^\{(.*)\}$", re.S)
_REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5


class HistoryError(ExporterError):
    """The store could not be read, or its answer is over a limit or not understood."""


def _headers(auth: StoreAuth) -> dict[str, str]:
    """The request headers `auth` adds: a bearer token or basic auth, a Mimir/Cortex tenant."""
    out: dict[str, str] = {}
    if auth.token_env:
        token = os.environ.get(auth.token_env)
        if not token:
            raise HistoryError(f"environment variable {auth.token_env} is not set")
        out["Authorization"] = f"Bearer {token}"
    elif auth.username is not None:
        password = os.environ.get(auth.password_env) if auth.password_env else None
        pair = f"{auth.username}:{password or ''}".encode()
        out["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    if auth.tenant:
        out["X-Scope-OrgID"] = auth.tenant
    return out


@dataclass(frozen=True)
class HistoryQuery:
    """One read of a store: where, what range, which series, within which limits."""

    url: str  # the store's base URL (`/api/v1/query` is appended)
    frm: float
    to: float
    match: Sequence[str] = ()
    auth: StoreAuth = StoreAuth()  # only ever sent to `url`'s origin
    timeout: float = 30.0


@dataclass(frozen=True)
class StoreRead:
    """What a read of a store gave: its series, and what the reader should be told about it."""

    series: list[RawSeries]
    notes: list[str]


def check_range(frm: float, to: float) -> None:
    """A range that can hold samples: finite, `from` before `to`."""
    if not (math.isfinite(frm) and math.isfinite(to)) or frm >= to:
        raise HistoryError(f"bad range: from {frm} must be before to {to}")


def selectors(match: Sequence[str]) -> list[str]:
    """The selectors to query: every spec-decode family, under each `--match`'s matchers."""
    names = "|".join(re.escape(n) for n in family_names())
    wanted = f'__name__=~"{names}"'
    out = []
    for one in match or ("{}",):
        found = _MATCHERS.match(one.strip())
        if found is None:
            raise HistoryError(f"--match {one!r}: give label matchers only, as {{job=\"vllm\"}}")
        inner = found.group(1).strip()
        out.append("{" + wanted + (f",{inner}" if inner else "") + "}")
    return out


def chunks(frm: float, to: float, size: float) -> list[tuple[float, float]]:
    """[frm, to] cut in consecutive pieces of at most `size` seconds."""
    out = []
    start = frm
    while start < to:
        end = min(to, start + size)
        out.append((start, end))
        start = end
    return out


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects come back as answers: `_get` follows them, deciding what goes along."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def _open(url: str, headers: dict[str, str], query: HistoryQuery) -> tuple[bytes | None, str]:
    """One GET: (the body, "") or (None, where a redirect points)."""
    context = ssl.create_default_context(cafile=query.auth.ca_file) if query.auth.ca_file else None
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=context))
    where = redact_url(query.url)
    try:
        with opener.open(urllib.request.Request(url, headers=headers),
                         timeout=query.timeout) as answer:
            return answer.read(MAX_BYTES + 1), ""
    except urllib.error.HTTPError as exc:
        location = exc.headers.get("Location") if exc.code in _REDIRECTS else None
        if location:
            return None, urllib.parse.urljoin(url, location)
        detail = exc.read(2000).decode(errors="replace")
        raise HistoryError(f"store {where} answered HTTP {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HistoryError(f"store {where} is not reachable: {reason}") from exc


def _get(query: HistoryQuery, params: dict[str, str], notes: list[str]) -> bytes:
    """The store's answer to one query, following redirects; the credentials and the tenant
    never follow one to another origin (curl, Go's net/http and our scrapes do the same)."""
    url = query.url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode(params)
    headers, home, where = _headers(query.auth), _origin(url), redact_url(query.url)
    for _ in range(MAX_REDIRECTS + 1):
        body, url = _open(url, headers, query)
        if body is not None:
            if len(body) > MAX_BYTES:
                raise HistoryError(f"store {where}: answer over {MAX_BYTES} bytes; "
                                   "narrow --match or the range")
            return body
        if _origin(url)[0] not in ("http", "https"):
            raise HistoryError(f"store {where} redirected to {redact_url(url)}: "
                               "only http:// and https:// are followed")
        if _origin(url) != home and headers:
            headers = {}
            note = (f"store {where} redirected to another origin ({redact_url(url)}): "
                    "its credentials and tenant were not sent there")
            log.warning("history store redirected to another origin; credentials dropped "
                        "store=%s location=%s", where, redact_url(url))
            notes.append(note)
    raise HistoryError(f"store {where}: over {MAX_REDIRECTS} redirects")


def _series_of(body: bytes, where: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(body)
        if doc["status"] != "success" or doc["data"]["resultType"] != "matrix":
            raise ValueError(doc.get("error", "not a matrix"))
        return list(doc["data"]["result"])
    except (ValueError, KeyError, TypeError) as exc:
        raise HistoryError(f"store {where}: unexpected answer: {exc}") from exc


def fetch_series(query: HistoryQuery) -> StoreRead:
    """Every spec-decode series' raw samples in [frm, to], chunk by chunk, merged."""
    check_range(query.frm, query.to)
    merged: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
    notes: list[str] = []
    for selector in selectors(query.match):
        for start, end in chunks(query.frm, query.to, CHUNK_SECONDS):
            # One millisecond more than the chunk: a range selector's left end is open.
            span = f"{round((end - start) * 1000) + 1}ms"
            body = _get(query, {"query": f"{selector}[{span}]", "time": f"{end:.3f}"}, notes)
            for item in _series_of(body, redact_url(query.url)):
                key = tuple(sorted(item["metric"].items()))
                samples = merged.setdefault(key, {})
                for at, value in item["values"]:
                    if start <= float(at) <= end:
                        samples[float(at)] = float(value)
                if len(merged) > MAX_SERIES:
                    raise HistoryError(f"over {MAX_SERIES} series; narrow --match")
    series = [RawSeries(dict(key), sorted(samples.items()))
              for key, samples in merged.items() if samples]
    return StoreRead(series, list(dict.fromkeys(notes)))
