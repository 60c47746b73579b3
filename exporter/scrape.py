"""One long-lived HTTP client session that scrapes targets; a failure is data, never raised."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import ssl
import time
from dataclasses import dataclass

import aiohttp

from exporter import __version__
from exporter.config import TargetConfig
from exporter.errors import ExporterError
from exporter.parse import parse_page
from exporter.redact import redact_text
from exporter.snapshot import Snapshot

_ACCEPT = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"
# The first sample line of a text exposition: a metric name, optional labels, then a number.
_SAMPLE_LINE = re.compile(
    rb"^[A-Za-z_:][A-Za-z0-9_:]*(\{.*\})?[ \t]+[-+]?(\d|\.\d|Inf|inf|NaN|nan)"
)
# aiohttp's HTTP errors read "400, message='what went wrong'" or "400, message:\n  what".
_AIOHTTP_MESSAGE = re.compile(r"message='([^']*)'")
_AIOHTTP_PREFIX = re.compile(r"^\d{3}, message:\s*")
_USER_AGENT = f"specdec-exporter/{__version__}"


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """What one scrape of one target gave: a snapshot, or the reason there is none."""

    target: str
    at: float  # wall-clock time the answer was complete, Unix seconds
    duration: float
    snapshot: Snapshot | None
    error: str | None = None
    size: int = 0

    @property
    def ok(self) -> bool:
        """The page was fetched and read."""
        return self.snapshot is not None


class ScrapeFailure(ExporterError):
    """Internal: why a scrape produced no page (turned into `ScrapeResult.error`)."""


class Scraper:
    """Scrapes targets over one `ClientSession`, at most `concurrency` at a time."""

    def __init__(self, session: aiohttp.ClientSession, *, max_bytes: int, concurrency: int):
        self.session = session
        self.max_bytes = max_bytes
        self._concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._ssl: dict[tuple[bool, str | None], ssl.SSLContext | bool] = {}

    def reconfigure(self, *, max_bytes: int, concurrency: int) -> None:
        """Apply a reloaded config's size cap and concurrency to the scrapes that follow."""
        self.max_bytes = max_bytes
        if concurrency != self._concurrency:
            self._concurrency = concurrency
            self._slots = asyncio.Semaphore(concurrency)

    async def scrape(self, target: TargetConfig, timeout: float, clock=time.time) -> ScrapeResult:
        """Fetch and parse one target; every failure becomes `error`."""
        async with self._slots:
            started = time.monotonic()
            try:
                page = await asyncio.wait_for(self._fetch(target), timeout)
                snapshot = parse_page(page, target.dialect)
                if not snapshot.has_spec_decode and not _looks_like_exposition(page):
                    raise ScrapeFailure("response is not Prometheus text format")
                error = None
            except ScrapeFailure as exc:
                page, snapshot, error = b"", None, str(exc)
            except TimeoutError:
                page, snapshot, error = b"", None, f"timeout after {timeout:g}s"
            except aiohttp.ClientPayloadError as exc:
                page, snapshot, error = b"", None, f"body cut off or corrupt: {_reason(exc)}"
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                page, snapshot, error = b"", None, _reason(exc)
            return ScrapeResult(
                target.name, clock(), time.monotonic() - started, snapshot, error, len(page)
            )

    async def _fetch(self, target: TargetConfig) -> bytes:
        headers = {"Accept": _ACCEPT, "Accept-Encoding": "gzip", "User-Agent": _USER_AGENT}
        headers.update(target.headers)
        if target.token_env and (token := os.environ.get(target.token_env)):
            headers["Authorization"] = f"Bearer {token}"
        async with self.session.get(
            target.url, headers=headers, ssl=self._ssl_for(target), allow_redirects=True,
            max_redirects=5,
        ) as response:
            if response.status != 200:
                raise ScrapeFailure(f"HTTP {response.status} {response.reason or ''}".strip())
            declared = response.content_length
            if declared is not None and declared > self.max_bytes:
                raise ScrapeFailure(
                    f"response of {declared} bytes is over the {self.max_bytes} byte cap"
                )
            chunks = []
            size = 0
            async for chunk in response.content.iter_chunked(256 * 1024):
                size += len(chunk)
                if size > self.max_bytes:
                    raise ScrapeFailure(f"response is over the {self.max_bytes} byte cap")
                chunks.append(chunk)
            return b"".join(chunks)

    def _ssl_for(self, target: TargetConfig) -> ssl.SSLContext | bool:
        if not target.url.startswith("https:"):
            return True
        key = (target.tls_verify, target.ca_file)
        if key not in self._ssl:
            if not target.tls_verify:
                self._ssl[key] = False
            else:
                self._ssl[key] = ssl.create_default_context(cafile=target.ca_file)
        return self._ssl[key]


def _looks_like_exposition(page: bytes) -> bool:
    # An empty page is valid exposition; HTML, JSON, a plain-text error or binary garbage is
    # not: text exposition is UTF-8 without NULs, and starts with a comment or a sample line.
    head = page[:4096]
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not just a character cut at the 4096th byte
            return False
    first = head.lstrip().split(b"\n", 1)[0]
    return not first or first.startswith(b"#") or _SAMPLE_LINE.match(first) is not None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate not trusted: {_tidy(str(exc.certificate_error))}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        error = exc.os_error
        if error.errno and error.errno > 0 and not isinstance(error, socket.gaierror):
            # asyncio says "Connect call failed ('127.0.0.1', 9)"; the errno says why.
            return f"connection failed: {os.strerror(error.errno)}"
        return f"connection failed: {_tidy(error.strerror or str(error))}"
    if isinstance(exc, aiohttp.TooManyRedirects):
        return "too many redirects"
    return _tidy(str(exc)) or type(exc).__name__


def _tidy(text: str) -> str:
    # One line, without aiohttp's "400, message=" wrapping around the actual reason.
    if match := _AIOHTTP_MESSAGE.search(text):
        text = match.group(1)
    text = _AIOHTTP_PREFIX.sub("", text)
    return redact_text(" ".join(text.split()))[:300]


def make_session(total_connections: int) -> aiohttp.ClientSession:
    """The one client session: proxies from HTTP(S)_PROXY/NO_PROXY, gzip decoded as it streams."""
    connector = aiohttp.TCPConnector(limit=total_connections, ttl_dns_cache=60)
    return aiohttp.ClientSession(
        connector=connector, trust_env=True, auto_decompress=True,
        timeout=aiohttp.ClientTimeout(total=None),
    )
