"""Raw samples from a Prometheus-compatible store (Prometheus, Thanos, Mimir, VictoriaMetrics).

Range selectors in instant queries, never `rate()`/`increase()` (they extrapolate), read in chunks
that stay under the stores' points-per-series limit (Prometheus's is 11,000).
"""

from __future__ import annotations

import base64
import json
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

from exporter.config.model import HistoryConfig
from exporter.core.errors import ExporterError
from exporter.core.history import RawSeries, family_names
from exporter.core.redact import redact_url

CHUNK_SECONDS = 7200.0  # a 1s scrape interval's two hours
MAX_SERIES = 10_000
MAX_BYTES = 256 * 1024 * 1024
# A `--match` is label matchers only: the metric names are ours to pick.
_MATCHERS = re.compile(r"^\{(.*)\}$", re.S)


class HistoryError(ExporterError):
    """The store could not be read, or its answer is over a limit or not understood."""


def _headers(auth: HistoryConfig) -> dict[str, str]:
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
    auth: HistoryConfig = HistoryConfig()  # its URL and timeout aside
    timeout: float = 30.0


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


def _get(query: HistoryQuery, params: dict[str, str]) -> bytes:
    url = query.url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url, headers=_headers(query.auth))
    context = ssl.create_default_context(cafile=query.auth.ca_file) if query.auth.ca_file else None
    where = redact_url(query.url)
    try:
        with urllib.request.urlopen(request, timeout=query.timeout, context=context) as answer:
            body: bytes = answer.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        detail = exc.read(2000).decode(errors="replace")
        raise HistoryError(f"store {where} answered HTTP {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HistoryError(f"store {where} is not reachable: {reason}") from exc
    if len(body) > MAX_BYTES:
        raise HistoryError(f"store {where}: answer over {MAX_BYTES} bytes; "
                           "narrow --match or the range")
    return body


def _series_of(body: bytes, where: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(body)
        if doc["status"] != "success" or doc["data"]["resultType"] != "matrix":
            raise ValueError(doc.get("error", "not a matrix"))
        return list(doc["data"]["result"])
    except (ValueError, KeyError, TypeError) as exc:
        raise HistoryError(f"store {where}: unexpected answer: {exc}") from exc


def fetch_series(query: HistoryQuery) -> list[RawSeries]:
    """Every spec-decode series' raw samples in [frm, to], chunk by chunk, merged."""
    check_range(query.frm, query.to)
    merged: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
    for selector in selectors(query.match):
        for start, end in chunks(query.frm, query.to, CHUNK_SECONDS):
            # One millisecond more than the chunk: a range selector's left end is open.
            span = f"{round((end - start) * 1000) + 1}ms"
            body = _get(query, {"query": f"{selector}[{span}]", "time": f"{end:.3f}"})
            for item in _series_of(body, redact_url(query.url)):
                key = tuple(sorted(item["metric"].items()))
                samples = merged.setdefault(key, {})
                for at, value in item["values"]:
                    if start <= float(at) <= end:
                        samples[float(at)] = float(value)
                if len(merged) > MAX_SERIES:
                    raise HistoryError(f"over {MAX_SERIES} series; narrow --match")
    return [RawSeries(dict(key), sorted(samples.items()))
            for key, samples in merged.items() if samples]
