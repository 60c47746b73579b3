"""The per-target ports' relay, bytes in = bytes out: requests and answers framed by httptools
(llhttp), an answer's head rewritten for its hop, its body handed to the client as the upstream
framed it, from the upstream connection's callback (no task woken per chunk); a recorded answer's
figures read from what it carried once it has ended."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from functools import partial

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from exporter.core.perrequest import Unreadable
from exporter.core.segments import RequestContext
from exporter.web.guard import MAX_CONNECTIONS, ConnectionGuard
from exporter.web.relay import MAX_RELAYED_BODY, SMALL_BODY, Kept, Upstream, forwarded, sent_on
from exporter.web.relayloop import (
    ConnectTimeout,
    Pool,
    UpstreamConnection,
    content_length,
    error_answer,
    head_bytes,
    head_end,
)

KEEPALIVE = 75.0  # an idle client connection is closed after this (aiohttp's default)
HELD = 1 << 20  # request body bytes held before the client's reading pauses


class _Refused(Exception):
    """The request gets an error answer of ours instead of the upstream's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Request:
    """One client request as parsed: its head, and its body as it arrives (the relay's one
    place where a request's headers and body are known)."""

    def __init__(self, method: str, url: bytes, headers: CIMultiDict[str],
                 keep_alive: bool) -> None:
        self.method, self.url, self.headers, self.keep_alive = method, url, headers, keep_alive
        self.pieces: deque[bytes] = deque()
        self.held = self.size = 0
        self.ended = self.too_large = False
        self.more: asyncio.Future[None] | None = None
        self.started: Started | None = None  # sent on from the callback that completed it
        self.taken = False  # its task relays it: too late to start it from a callback

    @property
    def recorded(self) -> bool:
        """Only (chat) completion answers carry per-request figures (and move the edges)."""
        return self.method == "POST" and self.path.rstrip(b"/").endswith(b"completions")

    @property
    def path(self) -> bytes:
        """The request's path without its query."""
        return self.url.split(b"?", 1)[0]

    def add(self, piece: bytes) -> None:
        """A piece of the body, held until sent on; past MAX_RELAYED_BODY, none is."""
        self.size += len(piece)
        if self.size > MAX_RELAYED_BODY:
            self.too_large = True
            self.pieces.clear()
        else:
            self.pieces.append(piece)
            self.held += len(piece)
        self._wake()

    def end(self) -> None:
        """The body is whole."""
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        if self.more is not None and not self.more.done():
            self.more.set_result(None)


class Answer:
    """One upstream answer, parsed as it passes: its head rewritten for the client once whole,
    its body's bytes written on unchanged, what a recorded one carried kept for its figures."""

    def __init__(self, request: Request, client: asyncio.Transport, idle: float) -> None:
        self.request, self.client, self.idle = request, client, idle
        self.sent = time.monotonic()  # the request goes now (connect included), as Kept's clock
        self.parser = httptools.HttpResponseParser(self)
        self.buffer = bytearray()
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.reason = b""
        self.status = 0
        # Kept: asyncio.get_running_loop() costs a getpid() system call, once per chunk here.
        self.loop = asyncio.get_running_loop()
        self.head: asyncio.Future[None] = self.loop.create_future()
        self.done: asyncio.Future[Unreadable | None] = self.loop.create_future()
        self.kept: Kept | None = None
        self.on_whole: Callable[[Unreadable | None], None] | None = None  # records it once
        self.complete = self.paused = self.framed = self.reusable = False
        self.close_client = not request.keep_alive
        self.bodiless = request.method == "HEAD"
        self.last = 0.0
        self.conn: UpstreamConnection | None = None
        self.pool: Pool | None = None
        self.interim = 0  # 1xx heads before the answer's own (dropped: the client asked none)

    # httptools' callbacks
    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer: the next head is the answer's
            self.headers, self.reason = CIMultiDict(), b""
            self.interim += 1
            return
        self.bodiless = self.bodiless or self.status in (204, 304)
        self.reusable = self.parser.should_keep_alive()
        if self.request.recorded:
            self.kept = Kept("text/event-stream" in self.headers.get("Content-Type", ""),
                             content_length(self.headers), self.sent)

    def on_body(self, body: bytes) -> None:
        if self.kept is not None:
            self.kept.add(body)

    def on_message_complete(self) -> None:
        if self.status >= 200:
            self.complete = True
            self.reusable = self.parser.should_keep_alive()  # llhttp forgets it once past

    # from the upstream connection
    def received(self, data: bytes) -> None:
        """Bytes from the upstream: before the head, parsed and held; after, passed on."""
        if self.done.done():
            return  # cut already: nothing more goes to the client
        self.last = self.loop.time()
        if self.head.done():
            self._feed(data)
            self._recorded_if_whole()
            self.client.write(data)
        else:
            self.buffer += data
            self._feed(data)
            if self.status >= 200 and not self.done.done():
                self._recorded_if_whole()
                self._head_out()
        if self.complete or (self.bodiless and self.head.done()):
            self.finish(None)

    def _recorded_if_whole(self) -> None:
        """Before its last bytes reach the client: what the client sends next finds it."""
        if self.complete:
            self.record(None)

    def record(self, ended: Unreadable | None) -> None:
        """Hand its figures on, once."""
        if (on_whole := self.on_whole) is not None:
            self.on_whole = None
            on_whole(ended)

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.finish(Unreadable.CUT)

    def _head_out(self) -> None:
        """The client's head (this hop's headers out, the upstream's framing kept), then the
        body bytes that came with the upstream's head."""
        end = head_end(self.buffer, self.interim)
        headers = forwarded(CIMultiDictProxy(self.headers))
        framed = self.bodiless or content_length(self.headers) is not None
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            headers["Transfer-Encoding"] = "chunked"
            framed = True
        elif (length := self.headers.get("Content-Length")) is not None:
            headers["Content-Length"] = length
        self.framed = framed
        self.close_client = self.close_client or not framed
        if self.close_client:
            headers["Connection"] = "close"
        self.client.write(head_bytes(b"HTTP/1.1 %d %s" % (self.status, self.reason), headers)
                          + (b"" if self.bodiless else bytes(self.buffer[end:])))
        self.buffer = bytearray()
        self.head.set_result(None)
        self._arm_idle()

    def _arm_idle(self) -> None:
        """One timer per answer, re-armed from the last byte's time: nothing done per chunk."""
        if self.done.done():
            return
        loop = self.loop
        if self.paused:  # a client slow to read is not a stalled upstream
            self.last = loop.time()
        wait = self.last + self.idle - loop.time()
        if wait <= 0:
            self.finish(Unreadable.STALLED)
        else:
            loop.call_later(wait, self._arm_idle)

    def lost(self) -> None:
        """The upstream connection closed: the end of an answer without a length, else a cut."""
        unframed = self.head.done() and not self.complete and not self.bodiless and (
            "chunked" not in self.headers.get("Transfer-Encoding", "").lower()
            and content_length(self.headers) is None)
        self.finish(None if unframed or self.complete else Unreadable.CUT)

    def finish(self, why: Unreadable | None) -> None:
        """The answer has ended: whole (None), or why not. A whole answer's connection goes
        back to the pool now, so that the client's next request finds it."""
        if not self.done.done():
            self.done.set_result(why)
        if self.conn is not None:  # the first end decides (a cancelled wait ends `done` too)
            if why is None and self.framed and self.reusable and self.pool is not None:
                self.pool.put(self.conn)
            else:
                self.conn.abort()
            self.conn = None

    @property
    def whole(self) -> bool:
        """It has ended, every byte relayed."""
        return self.done.done() and not self.done.cancelled() and self.done.result() is None


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


@dataclass
class Started:
    """A request sent on before its task ran: its answer, and its place in the in-flight count."""

    answer: Answer
    flight: contextlib.ExitStack  # leaves the port's in-flight count when closed

    def cancel(self) -> None:
        """The client left before its task took the request: the answer ends there."""
        self.answer.record(Unreadable.CLIENT_LEFT)
        self.answer.finish(Unreadable.CLIENT_LEFT)
        self.flight.close()


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
    answer = Answer(request, client, upstream.timeouts.idle)
    answer.conn, answer.pool, conn.answer = conn, port.pool, answer
    flight, body = contextlib.ExitStack(), b"".join(request.pieces)
    context = flight.enter_context(
        upstream.flight.counted(request.headers, body if request.recorded else None))
    answer.on_whole = partial(_record, upstream, answer, context)
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
            answer = Answer(request, transport, upstream.timeouts.idle)
            answer.on_whole = partial(_record, upstream, answer, context)
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
    conn: UpstreamConnection | None = None
    try:
        async with asyncio.timeout(waits.first_byte):
            if request.started is None:
                conn = await port.pool.get(waits.connect)
                answer.conn, answer.pool, conn.answer = conn, port.pool, answer
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
