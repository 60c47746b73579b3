"""The relay of the recording proxy: one request on to a target's API, its answer back as it
arrives, bounded in time and size, and a (chat) completion's answer read once the upstream has
sent it whole, whatever the client does after; a client that leaves cancels the upstream request
at any phase."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from exporter.core.perrequest import RequestStats, Unreadable, from_json, from_sse
from exporter.core.segments import InFlight
from exporter.core.timing import Clock

PARSE_LIMIT = 4 * 1024 * 1024  # a JSON answer larger than this is relayed, not parsed
# An event stream's end read for its figures: its last events (usage, the engine's per-request
# object, [DONE]) are a few KiB; a token chunk before them carries nothing read.
TAIL = 64 * 1024
SMALL_BODY = 64 * 1024  # a request body below this size (with its length given) is sent whole
# A relayed request body, streamed through, never held: a 128k-token prompt is ~1 MiB of JSON,
# a chat with base64 images tens of MiB.
MAX_RELAYED_BODY = 64 * 1024 * 1024
# How often a relay looks whether its client is still connected: aiohttp tells a handler only
# when it writes, and a relay waiting for the upstream's first byte writes nothing.
CLIENT_POLL = 0.1
# Headers of one hop (RFC 9110 7.6.1), and Host, which names the proxy, not the upstream.
_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
    "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length"))
# The exporter's token on /proxy/ (handlers.auth_middleware): the client's own Authorization is
# the model server's, relayed untouched.
PROXY_TOKEN_HEADER = "X-Specdec-Token"
# What aiohttp would add to a request that lacks it: the upstream gets the client's headers only
# (an Accept-Encoding the client never sent would bring it a body it cannot read).
_NOT_ADDED = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")

RecordFn = Callable[[str, RequestStats], None]


class Edges(Protocol):
    """The traffic edges a relay passes (edges.TrafficEdges, or those handed across loops)."""

    async def arrive(self, target: str, model: str) -> list[Any]:
        """Before a request of `model` goes: once every window it opens has started, its
        tickets."""

    def done(self, tickets: list[Any]) -> None:
        """The request's answer has completed (or failed)."""

    @property
    def registered(self) -> bool:
        """Whether any window waits on arrivals (else `arrive` has nothing to do)."""


@dataclass(frozen=True)
class Timeouts:
    """How long the relay waits on the upstream (a target's `proxy:` block), in seconds."""

    connect: float = 10.0
    first_byte: float = 300.0  # from sending the request to the answer's head
    idle: float = 120.0  # between two pieces of the answer's body


@dataclass(frozen=True)
class Upstream:
    """Where one target's API lives and what to call with each recorded answer."""

    target: str
    origin: str  # scheme://host:port
    record: RecordFn
    edges: Edges | None = None
    own_token: str = ""  # the exporter's token: never sent on, in whatever header it arrives
    timeouts: Timeouts = field(default_factory=Timeouts)
    flight: InFlight = field(default_factory=InFlight)  # this port's requests, keyed as they go


def forwarded(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """Headers for the next hop: those of one hop, and those `Connection` names, left out."""
    named = {token.strip().lower() for value in headers.getall("Connection", [])
             for token in value.split(",")}
    return CIMultiDict((key, value) for key, value in headers.items()
                       if key.lower() not in _HOP and key.lower() not in named)


def sent_on(headers: CIMultiDictProxy[str], own_token: str) -> CIMultiDict[str]:
    """A request's headers for the upstream: one hop's and the exporter's own token left out."""
    out = forwarded(headers)
    out.popall(PROXY_TOKEN_HEADER, None)
    if own_token and any(_is_token(value, own_token) for value in out.getall("Authorization", [])):
        out.popall("Authorization")
    return out


def _is_token(value: str, token: str) -> bool:
    given = value.removeprefix("Bearer ").strip().encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, token.encode("utf-8"))


def _recorded(request: web.Request) -> bool:
    """Only (chat) completion answers carry per-request figures."""
    return request.method == "POST" and request.path.rstrip("/").endswith("completions")


async def _model(request: web.Request, wait: float) -> str:
    """The `model` a request body names (traffic edges skip each model's warm-up); "" when
    not read: a body streamed through (no length, or SMALL_BODY or more) is never held."""
    length = request.content_length
    if length is None or length >= SMALL_BODY:
        return ""
    try:
        async with asyncio.timeout(wait):  # a client slow to send it: the relay says so
            model = json.loads(await request.read()).get("model")
    except (ValueError, AttributeError, TimeoutError, OSError):
        return ""
    return model if isinstance(model, str) else ""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class _BodyTooLarge(Exception):
    """A streamed request body went past MAX_RELAYED_BODY."""


class _Body:
    """A request body for the upstream: whole when small, else streamed through the limit."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.too_large = False  # aiohttp wraps what the stream raises: this says it was us

    async def data(self) -> bytes | AsyncIterator[bytes] | None:
        if not self.request.body_exists:
            return None
        # A small body of known length (a prompt) goes whole: streamed, it costs more writes.
        length = self.request.content_length
        if length is not None and length < SMALL_BODY:  # client_max_size refuses its size
            return await self.request.read()
        return self._limited()

    async def _limited(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self.request.content.iter_any():
            size += len(chunk)
            if size > MAX_RELAYED_BODY:
                self.too_large = True
                raise _BodyTooLarge
            yield chunk


class Kept:
    """A recorded answer's body as relayed, read once it has ended: a JSON body whole (up to
    PARSE_LIMIT); an event stream's first event and its last TAIL bytes, where its usage and
    the engine's figures are, so that no token chunk is held or parsed."""

    def __init__(self, sse: bool, length: int | None, sent: float) -> None:
        self.sse = sse
        self.length = length
        self.clock = Clock(sent)  # `sent`: time.monotonic() when the request went
        self.parts: deque[bytes] = deque()
        self.held = self.size = 0
        self.first = b""  # an event stream's first event: its id and model
        self.dropped = False

    def add(self, chunk: bytes) -> None:
        self.clock.tick(time.monotonic())
        self.size += len(chunk)
        if not self.sse:
            if self.size > PARSE_LIMIT:
                self.parts.clear()
            else:
                self.parts.append(chunk)
            return
        if not self.dropped and len(self.first) < TAIL:
            self.first += chunk
        self.parts.append(chunk)
        self.held += len(chunk)
        while self.held - len(self.parts[0]) >= TAIL:
            self.held -= len(self.parts.popleft())
            self.dropped = True

    def read(self) -> bytes:
        """What is parsed: the body; or the stream's first event and its tail's whole events."""
        tail = b"".join(self.parts)
        if not self.dropped:
            return tail
        return _events_from(self.first, first_only=True) + _events_from(tail)

    def stats(self, ended: Unreadable | None) -> RequestStats:
        """Its figures; `ended` says why the relay stopped early, when it did: an answer whose
        bytes all came (an event stream to its `[DONE]`, a body to its length) reads anyway."""
        if self.size > PARSE_LIMIT and not self.sse:
            return RequestStats.unread(Unreadable.TOO_LARGE)
        whole = self.read()
        if not self.sse and ended is not None and self.length != self.size:
            return RequestStats.unread(ended)
        stats = from_sse(whole) if self.sse else from_json(whole)
        if ended is None:
            return stats.timed(self.clock, self.sse)
        return stats if stats.unreadable is None else RequestStats.unread(ended)


def _events_from(data: bytes, first_only: bool = False) -> bytes:
    """`data` from its first event boundary on (a tail begun mid-event), or up to and
    including it (`first_only`: the first event); all of it where no boundary is seen."""
    ends = [(i, len(sep)) for sep in (b"\n\n", b"\r\n\r\n") if (i := data.find(sep)) >= 0]
    if not ends:
        return b"" if first_only else data
    at, size = min(ends)
    return data[:at + size] if first_only else data[at + size:]


async def _client_gone(request: web.Request) -> None:
    while (transport := request.transport) is not None and not transport.is_closing():
        await asyncio.sleep(CLIENT_POLL)


async def relay(request: web.Request, session: aiohttp.ClientSession, upstream: Upstream,
                path: str) -> web.StreamResponse:
    """Forward one request and relay its answer as it arrives, between the traffic edges' calls;
    the upstream request ends when the client leaves."""
    if (request.content_length or 0) > MAX_RELAYED_BODY:
        return _error(413, f"body of {request.content_length} bytes is over {MAX_RELAYED_BODY}"
                      " (the relayed body limit, 64 MiB)")
    edges, tickets = upstream.edges, []
    if edges is not None:
        model = await _model(request, upstream.timeouts.first_byte)
        tickets = await edges.arrive(upstream.target, model)
    try:
        return await _while_connected(request, _keyed(request, session, upstream, path))
    finally:
        if edges is not None:
            edges.done(tickets)


async def _keyed(request: web.Request, session: aiohttp.ClientSession, upstream: Upstream,
                 path: str) -> web.StreamResponse:
    """`_forward`, the request counted in flight and its record keyed by its tag, body and
    load (per_request.by)."""
    body = None
    if request.body_exists and (request.content_length or SMALL_BODY) < SMALL_BODY:
        with contextlib.suppress(aiohttp.ClientError, OSError):  # _forward meets it and answers
            body = await request.read()  # kept: `_Body` sends these bytes
    with upstream.flight.counted(request.headers, body) as context:
        record = upstream.record
        return await _forward(request, session, replace(upstream, record=lambda t, stats: record(
            t, replace(stats, context=context))), path)


async def _while_connected(request: web.Request,
                           work: Coroutine[Any, Any, web.StreamResponse]) -> web.StreamResponse:
    """`work`'s answer, or, once the client is gone, `work` cancelled (its upstream with it)."""
    relaying = asyncio.ensure_future(work)
    watching = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait((relaying, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if not relaying.done():
            relaying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await relaying
    if relaying.cancelled():
        return web.Response(status=499, reason="Client Closed Request")  # never sent: it left
    return relaying.result()


async def _forward(request: web.Request, session: aiohttp.ClientSession, upstream: Upstream,
                   path: str) -> web.StreamResponse:
    url = upstream.origin + path + (f"?{request.query_string}" if request.query_string else "")
    waits = upstream.timeouts
    key = f"proxy.{{}} of target {upstream.target}"
    body = _Body(request)
    sent = time.monotonic()
    try:
        async with asyncio.timeout(waits.first_byte):
            answer = await session.request(
                request.method, url, data=await body.data(),
                headers=sent_on(request.headers, upstream.own_token), allow_redirects=False,
                skip_auto_headers=_NOT_ADDED,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=waits.connect))
    except aiohttp.ConnectionTimeoutError:
        return _error(504, f"upstream {upstream.origin} not connected within {waits.connect:g}s"
                      f" ({key.format('connect_timeout')})")
    except TimeoutError:
        return _error(504, f"upstream {upstream.origin} sent no answer within "
                      f"{waits.first_byte:g}s ({key.format('first_byte_timeout')})")
    except (aiohttp.ClientError, OSError, _BodyTooLarge) as exc:
        if body.too_large:
            return _error(413, f"body is over {MAX_RELAYED_BODY} bytes (the relayed body "
                          "limit, 64 MiB)")
        return _error(502, f"upstream {upstream.origin} failed: {exc}")
    async with answer:
        return await _relay_answer(request, answer, upstream, sent)


async def _relay_answer(request: web.Request, answer: aiohttp.ClientResponse,
                        upstream: Upstream, sent: float) -> web.StreamResponse:
    """The answer to the client piece by piece; a recorded one counted once, however it ends."""
    response = web.StreamResponse(status=answer.status, reason=answer.reason,
                                  headers=forwarded(answer.headers))
    if answer.content_length is not None:
        response.content_length = answer.content_length
    kept = Kept("text/event-stream" in answer.headers.get("Content-Type", ""),
                answer.content_length, sent) if _recorded(request) else None
    ended: Unreadable | None = Unreadable.CLIENT_LEFT  # until the upstream's answer has ended
    try:
        await response.prepare(request)
        ended = await _pump(answer, response, kept, upstream.timeouts.idle)
        if ended in (Unreadable.CUT, Unreadable.STALLED) and request.transport is not None:
            request.transport.abort()  # the client sees a cut answer, not a whole one
    except ConnectionError:
        pass  # the client left before the head went out
    finally:
        if kept is not None:
            upstream.record(upstream.target, kept.stats(ended))
    if ended is None:
        with contextlib.suppress(ConnectionError):
            await response.write_eof()  # a client gone after the last byte changes nothing
    return response


async def _pump(answer: aiohttp.ClientResponse, response: web.StreamResponse,
                kept: Kept | None, idle: float) -> Unreadable | None:
    """Relay the answer's body; None when the upstream sent it whole, else why it stopped."""
    while True:
        try:
            async with asyncio.timeout(idle):
                chunk = await answer.content.readany()
        except TimeoutError:
            return Unreadable.STALLED
        except (aiohttp.ClientError, OSError):
            return Unreadable.CUT
        if not chunk:
            return None
        if kept is not None:
            kept.add(chunk)
        try:
            await response.write(chunk)
        except ConnectionError:
            return Unreadable.CLIENT_LEFT
