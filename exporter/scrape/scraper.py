"""One long-lived HTTP client session that scrapes targets; a failure is data, never raised."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from exporter import __version__
from exporter.config.model import TargetConfig
from exporter.core.dialects import sample_names
from exporter.core.parse import PageLimitError, parse_page
from exporter.core.redact import redact_text
from exporter.core.snapshot import FILTERED, FULL, ScrapeResult, Snapshot
from exporter.scrape.httpget import Answer, CutOff, GetError, OverCap, Pool
from exporter.scrape.inflate import InflateError, OverCapError, inflate, use_fastest_zlib
from exporter.scrape.namefilter import Reading, families, filtered_urls, honoured, present

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
class _Plan:
    """How to reach one target, worked out once per config (never per scrape)."""

    target: TargetConfig
    url: URL
    headers: dict[str, str]  # for aiohttp
    # What a request to another origin carries after a redirect: no Authorization and none of
    # the configured headers (they may hold secrets), as curl, Go and browsers do.
    foreign_headers: dict[str, str]
    proxy: URL | None
    proxy_headers: dict[str, str] | None  # Proxy-Authorization, from the URL or ~/.netrc
    ssl: ssl.SSLContext | bool
    # The lean path: (host, port, the whole request as bytes); None means aiohttp serves it.
    lean: tuple[str, int, bytes] | None


class Scraper:
    """Scrapes targets, at most `concurrency` at a time: plain HTTP without a proxy through
    `httpget.Pool`, the rest (all of them with `lean=False`) through the aiohttp `session`."""

    def __init__(self, session: aiohttp.ClientSession, *, max_bytes: int, concurrency: int,
                 lean: bool = True):
        self.session = session
        self.max_bytes = max_bytes
        self.lean = lean
        self._concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._ssl: dict[tuple[bool, str | None], ssl.SSLContext | bool] = {}
        self._plans: dict[str, _Plan] = {}
        self._reads: dict[str, Reading[_Plan]] = {}
        self._pool = Pool()

    def reconfigure(self, *, max_bytes: int, concurrency: int) -> None:
        """Apply a reloaded config's size cap and concurrency; plans are worked out again."""
        self.max_bytes = max_bytes
        if concurrency != self._concurrency:
            self._concurrency = concurrency
            self._slots = asyncio.Semaphore(concurrency)
        self._plans.clear()

    def forget(self, targets: Iterable[TargetConfig]) -> None:
        """Keep only `targets`' plans and kept-alive connections (after a reload or discovery)."""
        keep = {target.name for target in targets}
        for name in [n for n in self._plans if n not in keep]:
            del self._plans[name]
        for name in [n for n in self._reads if n not in keep]:
            del self._reads[name]
        self._pool.forget({(p.lean[0], p.lean[1]) for p in self._plans.values() if p.lean})

    async def close(self) -> None:
        """Close the lean client's kept-alive connections (the session is the caller's)."""
        self._pool.close()

    async def scrape(
        self, target: TargetConfig, timeout: float, clock: Callable[[], float] = time.time
    ) -> ScrapeResult:
        """Fetch and parse one target; every failure becomes `error`."""
        async with self._slots:
            started = time.monotonic()
            try:
                async with asyncio.timeout(timeout):  # no extra task, unlike wait_for
                    page, snapshot = await self._read(target)
                if not snapshot.has_spec_decode and not _looks_like_exposition(page):
                    raise GetError("response is not Prometheus text format")
                error = None
            except CutOff as exc:
                page, snapshot, error = b"", None, f"body cut off or corrupt: {exc}"
            except (GetError, PageLimitError) as exc:
                page, snapshot, error = b"", None, str(exc)
            except TimeoutError:
                page, snapshot, error = b"", None, f"timeout after {timeout:g}s"
            except aiohttp.ClientPayloadError as exc:
                page, snapshot, error = b"", None, f"body cut off or corrupt: {_reason(exc)}"
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                page, snapshot, error = b"", None, _reason(exc)
            elapsed = time.monotonic() - started
            return ScrapeResult(target.name, clock(), elapsed, snapshot, error, len(page))

    async def _read(self, target: TargetConfig) -> tuple[bytes, Snapshot]:
        """The page and its snapshot: filtered where that was proven, else the full page (and
        a proof of the filter on it at first contact and after a restart)."""
        plan = self._plans.get(target.name)
        if plan is None or plan.target is not target:  # a reload or discovery replaced it
            plan = self._plans[target.name] = self._make_plan(target)
            self._reads[target.name] = Reading()
        reading = self._reads[target.name]
        if reading.filtered is not None:
            try:
                page = await self._fetch(reading.filtered)
                snapshot = _parsed(page, target, FILTERED)
            except BaseException:
                reading.reset()  # whatever failed, the full page is asked next
                raise
            if reading.keeps(snapshot):
                reading.last = snapshot
                return page, snapshot
            reading.reset()  # a restart or a family lost: the full page, and a proof on it
        page = await self._fetch(plan)
        snapshot = _parsed(page, target, FULL)
        if target.name_filter and reading.due(snapshot):
            await self._prove(plan, reading, page, snapshot)
        reading.last = snapshot
        return page, snapshot

    async def _prove(self, plan: _Plan, reading: Reading[_Plan], page: bytes,
                     snapshot: Snapshot) -> None:
        """Read the target filtered from now on if a filtered answer holds what `page` holds
        of our samples and nothing else."""
        reading.proven = True  # first: a filtered request that hangs is not asked again
        names = sample_names(snapshot.dialect if snapshot.has_spec_decode
                             else plan.target.dialect)
        wanted = present(page, names)
        if not wanted:
            return
        # Uncompressed: the filtered answer is a few KB, which prometheus_client would gzip at
        # level 9 on the server's event loop.
        headers = {k: v for k, v in plan.headers.items() if k.lower() != "accept-encoding"}
        headers["Accept-Encoding"] = "identity"
        for url in filtered_urls(plan.url, names):
            lean = plan.lean and (plan.lean[0], plan.lean[1], _request_bytes(url, headers))
            filtered = replace(plan, url=url, headers=headers, lean=lean)
            try:
                answer = await self._fetch(filtered)
            except (GetError, aiohttp.ClientError, OSError, ValueError):
                continue
            if honoured(answer, wanted, names):
                reading.filtered, reading.families = filtered, families(snapshot)
                return

    def _make_plan(self, target: TargetConfig) -> _Plan:
        url = URL(target.url)
        proxy, proxy_headers = proxy_for(url, target.proxy_url)
        headers = {
            "Accept": _ACCEPT,
            "Accept-Encoding": "gzip" if target.compression == "gzip" else "identity",
            "User-Agent": _USER_AGENT,
        }
        foreign = dict(headers)
        headers.update(target.headers)
        if url.user is not None:  # userinfo in the URL: Basic auth, on the lean path too
            secret = f"{url.user}:{url.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(secret).decode("ascii")
        if target.token_env and (token := os.environ.get(target.token_env)):
            headers["Authorization"] = f"Bearer {token}"
        lean = None
        if self.lean and url.scheme == "http" and proxy is None and url.host and url.port:
            lean = (url.host, url.port, _request_bytes(url, headers))
        return _Plan(target, url, headers, foreign, proxy, proxy_headers, self._ssl_for(target),
                     lean)

    async def _fetch(self, plan: _Plan) -> bytes:
        # The userinfo is in the Authorization header now; aiohttp refuses both at once.
        url = plan.url.with_user(None)
        if plan.lean is None:
            return await self._fetch_aiohttp(url, plan, 5, plan.headers)
        host, port, request = plan.lean
        answer = await self._pool.get(host, port, request, self.max_bytes)
        if answer.status == 200:
            return _decoded(answer, self.max_bytes)
        if answer.status not in REDIRECTS or not answer.location:
            raise GetError(f"HTTP {answer.status} {answer.reason}".strip())
        # A metrics URL that redirects is rare: aiohttp follows it from here.
        url = url.join(URL(answer.location.decode("latin-1"), encoded=True))
        headers = plan.headers if url.origin() == plan.url.origin() else plan.foreign_headers
        return await self._fetch_aiohttp(url, plan, 4, headers)

    async def _fetch_aiohttp(self, url: URL, plan: _Plan, max_redirects: int,
                             headers: dict[str, str]) -> bytes:
        """GET through aiohttp, following redirects here: aiohttp would carry the configured
        headers to another origin."""
        for _ in range(max_redirects + 1):
            sent, proxy_headers = with_proxy_headers(url, headers, plan.proxy_headers)
            async with self.session.get(
                url, headers=sent, ssl=plan.ssl, proxy=plan.proxy,
                proxy_headers=proxy_headers, allow_redirects=False,
            ) as response:
                location = response.headers.get("Location")
                if response.status in REDIRECTS and location:
                    url = url.join(URL(location, encoded=True))
                    if url.origin() != plan.url.origin():
                        headers = plan.foreign_headers
                    continue
                if response.status != 200:
                    raise GetError(f"HTTP {response.status} {response.reason or ''}".strip())
                return await read_capped(response, self.max_bytes)
        raise GetError("too many redirects")

    def _ssl_for(self, target: TargetConfig) -> ssl.SSLContext | bool:
        if not target.url.startswith("https:"):
            return True
        key = (target.tls_verify, target.ca_file)
        if key not in self._ssl:
            verify = target.tls_verify
            self._ssl[key] = ssl.create_default_context(cafile=target.ca_file) if verify else False
        return self._ssl[key]


REDIRECTS = frozenset((301, 302, 303, 307, 308))


def proxy_for(url: URL, proxy_url: str | None) -> tuple[URL | None, dict[str, str] | None]:
    """The proxy for `url` and its Proxy-Authorization header: `proxy_url` if given, else what
    aiohttp's `trust_env` would pick per request (HTTP(S)_PROXY, NO_PROXY, ~/.netrc), once."""
    if proxy_url is not None:
        proxy = URL(proxy_url)
        if proxy.user is None:
            return proxy, None
        secret = f"{proxy.user}:{proxy.password or ''}".encode("latin-1")
        auth = {"Proxy-Authorization": "Basic " + base64.b64encode(secret).decode("ascii")}
        return proxy.with_user(None), auth
    try:
        proxy, basic = get_env_proxy_for_url(url)
    except LookupError:
        return None, None
    return proxy, ({"Proxy-Authorization": basic.encode()} if basic is not None else None)


def with_proxy_headers(url: URL, headers: dict[str, str], proxy_headers: dict[str, str] | None
                       ) -> tuple[dict[str, str], dict[str, str] | None]:
    """The request's headers and aiohttp's `proxy_headers`: aiohttp sends proxy headers only with
    a CONNECT (to a TLS target); a plain-HTTP request to a forward proxy carries them itself."""
    if proxy_headers and url.scheme != "https":
        return headers | proxy_headers, None
    return headers, proxy_headers


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """The whole body, or `OverCap` when it is (or says it will be) over `cap` bytes."""
    declared = response.content_length
    if declared is not None and declared > cap:
        raise OverCap(f"response of {declared} bytes is over the {cap} byte cap")
    chunks = []
    size = 0
    async for chunk in response.content.iter_chunked(256 * 1024):
        size += len(chunk)
        if size > cap:
            raise OverCap(f"response is over the {cap} byte cap")
        chunks.append(chunk)
    return b"".join(chunks)


def _request_bytes(url: URL, headers: dict[str, str]) -> bytes:
    host = f"[{url.host}]" if ":" in (url.host or "") else url.host
    if not url.is_default_port():
        host = f"{host}:{url.port}"
    lines = [f"GET {url.raw_path_qs} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() != "host"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _decoded(answer: Answer, cap: int) -> bytes:
    if answer.encoding in (b"", b"identity"):
        return answer.body
    if answer.encoding in (b"gzip", b"x-gzip", b"deflate"):
        try:
            return inflate(answer.body, cap, gzip=answer.encoding != b"deflate")
        except OverCapError:
            raise GetError(f"response is over the {cap} byte cap") from None
        except InflateError:
            raise GetError("body cut off or corrupt: Can not decode content-encoding: "
                                + answer.encoding.decode("latin-1")) from None
    raise GetError(f"unsupported Content-Encoding {answer.encoding.decode('latin-1')!r}")


def _parsed(page: bytes, target: TargetConfig, read: str) -> Snapshot:
    return replace(parse_page(page, target.dialect, target.page_limits), read=read)


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
    """The session for TLS and proxied targets and discovery; `trust_env` off, as it reads the
    proxy environment and ~/.netrc on every request (`proxy_for` does once per target)."""
    use_fastest_zlib()
    connector = aiohttp.TCPConnector(limit=total_connections, ttl_dns_cache=60)
    return aiohttp.ClientSession(
        connector=connector, trust_env=False, auto_decompress=True,
        timeout=aiohttp.ClientTimeout(total=None),
    )
