"""The per-target ports' relay, bytes in = bytes out: each client connection's requests framed by
httptools (llhttp) and relayed in turn (their answers in `exchange`); a whole small request sent
on from the callback that completes it when a pooled connection is free, else by its task; a
recorded answer's figures handed on once it has ended."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from exporter.core.perrequest import Unreadable
from exporter.core.segments import RequestContext
from exporter.web.exchange import Answer, Request, Started
from exporter.web.guard import MAX_CONNECTIONS, ConnectionGuard
from exporter.web.relay import MAX_RELAYED_BODY, SMALL_BODY, Upstream, sent_on
from exporter.web.relayloop import (
    ConnectTimeout,
    Pool,
    UpstreamConnection,
    content_length,
    error_answer,
    head_bytes,
)

KEEPALIVE = 75.0  # an idle client connection is closed after this (aiohttp's default)
HELD = 1 << 20  # request body bytes held before the client's reading pauses


class _Refused(Exception):
    """The request gets an error answer of ours instead of the upstream's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ClientConnection(asyncio.Protocol):
    """One client connection on a per-target port: its requests parsed, and relayed in turn."""

    def __init__(self, port: PortRelay) -> None:
        self.port = port
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.requests: deque[Request] = deque()
        self.arrived: asyncio.Future[None] | None = None
        self.url = b""
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.upstream: UpstreamConnection | None = None  # while an answer is relayed
        self.answer: Answer | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.port.clients.add(self)
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:  # HttpParserUpgrade too: not relayed here
            assert self.transport is not None
            if not self.requests or self.requests[-1].ended:
                self.transport.write(error_answer(400, f"bad request: {exc}", close=True))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.port.clients.discard(self)
        for request in self.requests:
            if request.started is not None:
                request.started.cancel()
        if self.task is not None:
            self.task.cancel()

    def pause_writing(self) -> None:
        if self.answer is not None and self.upstream is not None:
            self.answer.paused = True
            if self.upstream.transport is not None:
                self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.answer is not None and self.upstream is not None:
            self.answer.paused = False
            if self.upstream.transport is not None and not self.upstream.gone:
                self.upstream.transport.resume_reading()

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self.url, self.headers = b"", CIMultiDict()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        p = self.parser
        self.requests.append(Request(p.get_method().decode("latin-1"), self.url, self.headers,
                                     p.should_keep_alive()))
        if self.headers.get("Expect", "").lower() == "100-continue" and self.transport:
            # The client waits for this before its body; the upstream is asked without it.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self.arrived is not None and not self.arrived.done():
            self.arrived.set_result(None)

    def on_body(self, body: bytes) -> None:
        request = self.requests[-1]
        request.add(body)
        if request.held > HELD and self.transport is not None:
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        request = self.requests[-1]
        request.end()
        if self.transport is not None and not request.taken and (len(self.requests) == 1 or (
                len(self.requests) == 2 and self.answer is not None and self.answer.whole)):
            request.started = _started(self.port, request, self.transport)

    async def _serve(self) -> None:
        first = True
        try:
            while (request := await self._next(first)) is not None:
                first = False
                if not await relay(self.port, request, self):
                    break
        finally:
            if self.transport is not None:
                self.transport.close()

    async def _next(self, first: bool) -> Request | None:
        """The next request's head, or None when a kept-alive connection stays idle."""
        if not self.requests:
            self.arrived = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(None if first else KEEPALIVE):
                    await self.arrived
            except TimeoutError:
                return None
        return self.requests[0]

    def resume_reading(self) -> None:
        """Held request body has gone on: read more of the client's."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


class PortRelay:
    """One target's proxy port: its upstream, its pooled connections, its open clients."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.pool = Pool(upstream.origin)
        self.clients: set[ClientConnection] = set()
        self.server: asyncio.Server | None = None

    async def open(self, host: str, port: int, header_timeout: float) -> None:
        """Listen on host:port (OSError when taken); a client slow to send its head is cut."""
        guard = ConnectionGuard(lambda: ClientConnection(self), header_timeout=header_timeout,
                                max_connections=MAX_CONNECTIONS)
        self.server = await asyncio.get_running_loop().create_server(guard, host, port)

    async def close(self) -> None:
        """Stop listening; cut the open clients (their upstream requests end) and the pool."""
        if self.server is not None:
            self.server.close()
        for client in list(self.clients):
            if client.transport is not None:
                client.transport.abort()
        self.pool.close()
        await asyncio.sleep(0)  # the clients' tasks see their cancellation


def _started(port: PortRelay, request: Request, client: asyncio.Transport) -> Started | None:
    """A whole small request sent on a pooled connection now, from the parser's callback: a
    task's wake-up waits behind every other stream's bytes in the loop's turn. None when it
    needs what only the task does (a connection made, a body streamed, the edges asked)."""
    upstream, length = port.upstream, content_length(request.headers)
    edges = upstream.edges if request.recorded else None
    if (length is None or length >= SMALL_BODY or request.too_large or (
            edges is not None and edges.registered)):
        return None
    conn = port.pool.take()
    if conn is None:
        return None
    flight, body = contextlib.ExitStack(), b"".join(request.pieces)
    context = flight.enter_context(
        upstream.flight.counted(request.headers, body if request.recorded else None))
    answer = _answer(upstream, request, client, context)
    answer.carried_by(conn, port.pool)
    _send_whole(conn, request, port, body)
    return Started(answer, flight)


async def relay(port: PortRelay, request: Request, client: ClientConnection) -> bool:
    """Relay one request between the traffic edges' calls; True when the connection stays."""
    upstream, transport = port.upstream, client.transport
    assert transport is not None
    if (content_length(request.headers) or 0) > MAX_RELAYED_BODY:
        transport.write(error_answer(
            413, f"body of {content_length(request.headers)} bytes is over "
            f"{MAX_RELAYED_BODY} (the relayed body limit, 64 MiB)", True))
        return False
    request.taken = True
    try:
        if request.started is not None:
            with request.started.flight:
                return await _exchange(port, request, client, transport, request.started.answer)
        body = await _whole(request, upstream.timeouts.first_byte) if request.recorded else None
        with upstream.flight.counted(request.headers, body) as context:  # per_request.by
            edges, tickets = upstream.edges if request.recorded else None, []
            if edges is not None:  # they skip each model's warm-up
                tickets = await edges.arrive(upstream.target, context.model or "")
            answer = _answer(upstream, request, transport, context)
            try:
                return await _exchange(port, request, client, transport, answer)
            finally:
                if edges is not None:
                    edges.done(tickets)
    finally:
        client.requests.popleft()


async def _whole(request: Request, wait: float) -> bytes | None:
    """A small request body once whole; None when not held: a body streamed through (no
    length, or SMALL_BODY or more), or one a client is slow to send."""
    length = content_length(request.headers)
    if length is None or length >= SMALL_BODY:
        return None
    try:
        async with asyncio.timeout(wait):  # a client slow to send it: the relay says so
            while not request.ended:
                request.more = asyncio.get_running_loop().create_future()
                await request.more
    except TimeoutError:
        return None
    return b"".join(request.pieces)


def _answer(upstream: Upstream, request: Request, client: asyncio.Transport,
            context: RequestContext) -> Answer:
    """The request's answer, recorded with its context once it has ended."""
    answer = Answer(request, client, upstream.timeouts.idle)
    answer.on_whole = partial(_record, upstream, answer, context)
    return answer


def _record(upstream: Upstream, answer: Answer, context: RequestContext,
            ended: Unreadable | None) -> None:
    if answer.kept is not None:  # the relay's one place where an answer has ended
        upstream.record(upstream.target, replace(answer.kept.stats(ended), context=context))


async def _exchange(port: PortRelay, request: Request, client: ClientConnection,
                    transport: asyncio.Transport, answer: Answer) -> bool:
    ended: Unreadable | None = Unreadable.CLIENT_LEFT
    try:
        try:
            await _asked(port, request, client, answer)
        except _Refused as refused:
            transport.write(error_answer(refused.status, str(refused), close=True))
            return False
        client.upstream, client.answer = answer.conn, answer
        ended = await answer.done
    finally:
        client.upstream = client.answer = None
        answer.record(ended)  # unless recorded whole already
        answer.finish(ended)  # its connection pooled or cut, unless done already
    if ended is not None:
        transport.abort()  # the client sees a cut answer, not a whole one
        return False
    return not answer.close_client


async def _asked(port: PortRelay, request: Request, client: ClientConnection,
                 answer: Answer) -> None:
    """The request sent on a pooled connection (unless started already) and the answer's head
    received; _Refused with the 502/504/413 the client gets instead, naming the key that set
    the wait."""
    upstream, waits = port.upstream, port.upstream.timeouts
    key = f"proxy.{{}} of target {upstream.target}"
    try:
        async with asyncio.timeout(waits.first_byte):
            if request.started is None:
                conn = await port.pool.get(waits.connect)
                answer.carried_by(conn, port.pool)
                await _send(conn, request, client, port)
            await asyncio.wait((answer.head, answer.done), return_when=asyncio.FIRST_COMPLETED)
        if not answer.head.done():
            raise ConnectionResetError("the connection closed before an answer")
    except ConnectTimeout:
        raise _Refused(504, f"upstream {upstream.origin} not connected within "
                       f"{waits.connect:g}s ({key.format('connect_timeout')})") from None
    except TimeoutError:
        raise _Refused(504, f"upstream {upstream.origin} sent no answer within "
                       f"{waits.first_byte:g}s ({key.format('first_byte_timeout')})") from None
    except OSError as exc:
        raise _Refused(502, f"upstream {upstream.origin} failed: {exc}") from None
    finally:
        if not answer.head.done() and answer.conn is not None:
            answer.conn.abort()


async def _send(conn: UpstreamConnection, request: Request, client: ClientConnection,
                port: PortRelay) -> None:
    """The request's head and body to the upstream: a small body of known length whole, any
    other streamed (chunked) as it arrives, never held past HELD bytes."""
    assert conn.transport is not None
    length = content_length(request.headers)
    if length is not None and length < SMALL_BODY:
        _send_whole(conn, request, port, b"".join([p async for p in _pieces(request, client)]))
        return
    headers = _sent_headers(request, port)
    streamed = length is not None or "chunked" in request.headers.get(
        "Transfer-Encoding", "").lower()
    if streamed:
        headers["Transfer-Encoding"] = "chunked"
    conn.transport.write(head_bytes(_first_line(request), headers))
    if streamed:
        async for piece in _pieces(request, client):
            conn.transport.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await conn.drain()
        conn.transport.write(b"0\r\n\r\n")


def _send_whole(conn: UpstreamConnection, request: Request, port: PortRelay,
                body: bytes) -> None:
    """A request with its whole body, in one write."""
    assert conn.transport is not None
    headers = _sent_headers(request, port)
    headers["Content-Length"] = str(len(body))
    conn.transport.write(head_bytes(_first_line(request), headers) + body)


def _sent_headers(request: Request, port: PortRelay) -> CIMultiDict[str]:
    headers = CIMultiDict({"Host": port.pool.netloc})
    headers.extend(sent_on(CIMultiDictProxy(request.headers), port.upstream.own_token))
    headers.popall("Expect", None)  # answered by the relay (ClientConnection)
    return headers


def _first_line(request: Request) -> bytes:
    return b"%s %s HTTP/1.1" % (request.method.encode("latin-1"), request.url)


async def _pieces(request: Request, client: ClientConnection) -> AsyncIterator[bytes]:
    while True:
        while request.pieces:
            piece = request.pieces.popleft()
            request.held -= len(piece)
            yield piece
        if request.too_large:
            raise _Refused(413, f"body is over {MAX_RELAYED_BODY} bytes (the relayed body "
                           "limit, 64 MiB)")
        client.resume_reading()
        if request.ended:
            return
        request.more = asyncio.get_running_loop().create_future()
        await request.more
