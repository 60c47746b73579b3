"""Raw samples from a Prometheus-compatible store: range selectors in instant queries, never
`rate()`/`increase()` (they extrapolate), in chunks under the stores' points-per-series limit."""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import re
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.config.model import StoreAuth
from exporter.core.aisbench import MAX_COUNT
from exporter.core.errors import ExporterError
from exporter.core.isotime import is_number
from exporter.core.redact import redact_url
from exporter.core.storecount import RawSeries, family_names

log = logging.getLogger(__name__)

# The bounds of one read (docs/reliability.md), checked before the first query or as answers come.
MAX_RANGE_SECONDS = 31 * 86400.0
CHUNK_SECONDS = 7200.0  # at a 1s scrape interval, under the points-per-series limit
MAX_POINTS_PER_QUERY = 11_000  # per series in one answer, as Prometheus's own query limit
MAX_SAMPLES = 2_000_000  # kept in all, every series together
MAX_SERIES = 10_000
MAX_BYTES = 256 * 1024 * 1024
# A `--match` is label matchers only: the metric names are ours to pick.
_MATCHERS = re.compile(r"^\{(.*)\}$", re.S)
_REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5


class HistoryError(ExporterError):
    """The store could not be read, or its answer is over a limit or not understood."""


class StoreStatusError(HistoryError):
    """The store answered with an HTTP error status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


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
    # Set when whoever asked has gone: no further query is sent.
    cancel: threading.Event | None = field(default=None, compare=False)


@dataclass(frozen=True)
class StoreRead:
    """What a read of a store gave: its series, and what the reader should be told about it."""

    series: list[RawSeries]
    notes: list[str]
    scraped: list[dict[str, str]] = field(default_factory=list)  # `up`'s label sets


def check_range(frm: float, to: float) -> None:
    """`HistoryError` unless `from` is before `to`, both finite, at most `MAX_RANGE_SECONDS`."""
    if not (math.isfinite(frm) and math.isfinite(to)) or frm >= to:
        raise HistoryError(f"bad range: from {frm} must be before to {to}")
    if to - frm > MAX_RANGE_SECONDS:
        raise HistoryError(f"range of {to - frm:.0f} s is over the limit of "
                           f"{MAX_RANGE_SECONDS:.0f} s ({MAX_RANGE_SECONDS / 86400:g} days): "
                           "ask for a shorter one")


def selectors(match: Sequence[str], names: Sequence[str] = ()) -> list[str]:
    """The selectors of every spec-decode family (or `names`), under each `--match`'s matchers."""
    wanted = f'__name__=~"{"|".join(re.escape(n) for n in names or family_names())}"'
    out = []
    for one in match or ("{}",):
        found = _MATCHERS.match(one.strip())
        if found is None:
            raise HistoryError(f"--match {one!r}: give label matchers only, as {{job=\"vllm\"}}")
        inner = found.group(1).strip()
        out.append("{" + wanted + (f",{inner}" if inner else "") + "}")
    return out


def chunks(frm: float, to: float, size: float) -> Iterator[tuple[float, float]]:
    """[frm, to] cut in consecutive pieces of at most `size` seconds, one at a time."""
    start = frm
    while start < to:
        end = min(to, start + size)
        yield start, end
        start = end


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
        raise StoreStatusError(f"store {where} answered HTTP {exc.code}: {detail}",
                               exc.code) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HistoryError(f"store {where} is not reachable: {reason}") from exc


def _get(query: HistoryQuery, params: dict[str, str], notes: list[str],
         path: str = "/api/v1/query") -> bytes:
    """The store's answer to one query, following redirects; the credentials and the tenant
    never follow one to another origin (curl, Go's net/http and our scrapes do the same)."""
    url = query.url.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    headers, home, where = _headers(query.auth), _origin(url), redact_url(query.url)
    if home[0] not in ("http", "https"):
        raise HistoryError(f"store {where}: not an http:// or https:// URL")
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
            log.warning("history store redirected to another origin; credentials dropped "
                        "store=%s location=%s", where, redact_url(url))
            notes.append(f"store {where} redirected to another origin ({redact_url(url)}): "
                         "its credentials and tenant were not sent there")
    raise HistoryError(f"store {where}: over {MAX_REDIRECTS} redirects")


def _series_of(body: bytes, where: str) -> list[tuple[dict[str, str], list[Any]]]:
    """The answer's series as (labels, raw values), or `HistoryError` saying what is wrong."""
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise HistoryError(f"store {where}: answer is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise HistoryError(f"store {where}: answer is not a JSON object")
    if doc.get("status") != "success":
        raise HistoryError(f"store {where}: query failed: {str(doc.get('error'))[:300]}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise HistoryError(f"store {where}: answer's data is not a matrix")
    result = data.get("result")
    if not isinstance(result, list):
        raise HistoryError(f"store {where}: answer's data.result is not a list")
    return [_item(one, i, where) for i, one in enumerate(result)]


def _item(one: object, i: int, where: str) -> tuple[dict[str, str], list[Any]]:
    if not isinstance(one, dict):
        raise HistoryError(f"store {where}: result[{i}] is not an object: {one!r:.60}")
    metric, values = one.get("metric"), one.get("values")
    if not (isinstance(metric, dict) and isinstance(metric.get("__name__"), str)
            and all(isinstance(v, str) for v in metric.values())):
        raise HistoryError(f"store {where}: result[{i}].metric is not an object of label "
                           f"strings with a __name__: {metric!r:.80}")
    if not isinstance(values, list):
        raise HistoryError(f"store {where}: result[{i}].values is not a list: {values!r:.60}")
    return metric, values


def _sample(pair: object, labels: dict[str, str], where: str) -> tuple[float, float]:
    """One `[time, "value"]` as numbers: a time, and a count (NaN, a staleness marker, too)."""
    series = labels["__name__"] + "{" + ",".join(
        f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__") + "}"
    if not (isinstance(pair, list) and len(pair) == 2 and is_number(pair[0])
            and math.isfinite(pair[0]) and isinstance(pair[1], str | int | float)
            and not isinstance(pair[1], bool)):
        raise HistoryError(f"store {where}: {series:.200} has a sample that is not "
                           f"[time, \"value\"]: {pair!r:.60}")
    try:
        value = float(pair[1])
    except ValueError:
        value = -1.0
    if not (math.isnan(value) or 0.0 <= value <= MAX_COUNT):
        # Past 2**53 a float counter is no longer exact (the peer vetting's rule too).
        raise HistoryError(f"store {where}: {series:.200} at {pair[0]}: {pair[1]!r:.40} is "
                           "not a count (a number from 0 to 2^53)")
    return float(pair[0]), value


def scraped_servers(query: HistoryQuery, notes: list[str]) -> list[dict[str, str]]:
    """The label sets of `up` in [frm, to]: every server the store scraped, spec decode or not
    (the series API reads the index, not the samples)."""
    where, out = redact_url(query.url), []
    for selector in selectors(query.match, ["up"]):
        try:
            body = _get(query, {"match[]": selector, "start": f"{query.frm:.3f}",
                                "end": f"{query.to:.3f}"}, notes, "/api/v1/series")
        except StoreStatusError as exc:
            if exc.status not in (404, 405, 501):
                raise
            notes.append(f"store {where} has no series API (HTTP {exc.status}): servers it "
                         "scrapes without spec-decode series are not listed")
            return []
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise HistoryError(f"store {where}: series answer is not JSON: {exc}") from None
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list) or not all(
                isinstance(d, dict) and all(isinstance(v, str) for v in d.values())
                for d in data):
            raise HistoryError(f"store {where}: series answer's data is not a list of label "
                               "sets")
        out.extend(data)
        if len(out) > MAX_SERIES:
            raise HistoryError(f"over {MAX_SERIES} scraped servers; narrow --match")
    return out


def fetch_series(query: HistoryQuery) -> StoreRead:
    """Every spec-decode series' raw samples in [frm, to], and the servers the store scraped."""
    check_range(query.frm, query.to)
    notes: list[str] = []
    scraped = scraped_servers(query, notes)
    merged = _samples(query, notes)
    series = [RawSeries(dict(key), sorted(samples.items()))
              for key, samples in merged.items() if samples]
    return StoreRead(series, list(dict.fromkeys(notes)), scraped)


def _samples(query: HistoryQuery, notes: list[str]
             ) -> dict[tuple[tuple[str, str], ...], dict[float, float]]:
    merged: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
    kept, where = 0, redact_url(query.url)
    for selector in selectors(query.match):
        for start, end in chunks(query.frm, query.to, CHUNK_SECONDS):
            if query.cancel is not None and query.cancel.is_set():
                raise HistoryError("cancelled: whoever asked has gone")
            # One millisecond more than the chunk: a range selector's left end is open.
            span = f"{round((end - start) * 1000) + 1}ms"
            body = _get(query, {"query": f"{selector}[{span}]", "time": f"{end:.3f}"}, notes)
            for labels, values in _series_of(body, where):
                if len(values) > MAX_POINTS_PER_QUERY:
                    raise HistoryError(
                        f"store {where}: {len(values)} points for one series in "
                        f"{end - start:.0f} s, over {MAX_POINTS_PER_QUERY:,} per query "
                        "(a scrape interval under 0.65 s)")
                samples = merged.setdefault(tuple(sorted(labels.items())), {})
                before = len(samples)
                for pair in values:
                    at, value = _sample(pair, labels, where)
                    if start <= at <= end:
                        samples[at] = value
                kept += len(samples) - before
                if kept > MAX_SAMPLES:
                    raise HistoryError(f"over {MAX_SAMPLES:,} samples in all; narrow --match "
                                       "or the range")
                if len(merged) > MAX_SERIES:
                    raise HistoryError(f"over {MAX_SERIES} series; narrow --match")
    return merged
