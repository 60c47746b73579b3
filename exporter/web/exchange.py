"""One request and its answer as the pass-through relay parses them: the client's request
(its head, its body as it arrives), the upstream's answer (its head rewritten for the client,
its body's bytes passed on unchanged from the upstream connection's callback, what a recorded
one carried kept for its figures), and a request sent on before its task took it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from exporter.core.perrequest import Unreadable
from exporter.web.relay import MAX_RELAYED_BODY, Kept, forwarded
from exporter.web.relayloop import Pool, UpstreamConnection, content_length, head_bytes, head_end


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

    def carried_by(self, conn: UpstreamConnection, pool: Pool) -> None:
        """The connection it comes on, back to `pool` when it ends whole."""
        self.conn, self.pool, conn.answer = conn, pool, self

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
