"""A lean HTTP/1.1 GET client for plain-HTTP `/metrics` without a proxy (TLS and proxies stay
with aiohttp): a request prebuilt once per target, parsed by llhttp (`httptools`)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass
from typing import cast

import httptools


class GetError(Exception):
    """A request that produced no usable answer; the message is the scrape's reason."""


class CutOff(GetError):
    """The body ended early (connection closed mid-body, or a bad chunk)."""


class OverCap(GetError):
    """The body is bigger than the caller's cap."""


class _Disconnected(GetError):
    """Closed before a status line: on a reused connection, the server had dropped it idle."""


@dataclass(slots=True)
class Answer:
    """A response: status, reason, the headers a scrape reads, and the body as sent."""

    status: int
    reason: str
    encoding: bytes  # Content-Encoding, lowercased; b"" if none
    location: bytes
    body: bytes


class _Connection(asyncio.Protocol):
    """One TCP connection and its llhttp parser; one request in flight at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0  # monotonic time it was put back idle
        self.parser = httptools.HttpResponseParser(self)
        self.open = True
        self._waiter: asyncio.Future[Answer] | None = None
        self._cap = 0
        self._reset()

    def _reset(self) -> None:
        self._reason = b""
        self._chunks: list[bytes] = []
        self._size = 0
        self._declared: int | None = None
        self._chunked = False
        self._encoding = b""
        self._location = b""
        self._status_seen = False
        self._headers_done = False
        self._keep_alive = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP connection's transport has all of `Transport` (uvloop's without subclassing
        # it, so a cast and not an isinstance check).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            pass  # a callback already failed the request (over the cap)
        except httptools.HttpParserError as exc:
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
            self._fail(GetError(f"invalid HTTP response: {reason}"))

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost settles the request

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._waiter is None or self._waiter.done():
            return
        if not self._status_seen:
            self._fail(_Disconnected("Server disconnected"))
        elif not self._headers_done:
            self._fail(GetError("Server disconnected"))
        elif self._chunked:
            self._fail(CutOff("Not enough data to satisfy transfer length header."))
        elif self._declared is not None:
            self._fail(CutOff(
                "Not enough data to satisfy content length header "
                f"(received {self._size} of {self._declared} bytes)."
            ))
        else:  # no length: the close ends the body
            self._finish()

    def on_status(self, status: bytes) -> None:
        self._status_seen = True
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self._declared = int(value)  # llhttp has checked it is a number
        elif name == b"content-encoding":
            self._encoding = value.strip().lower()
        elif name == b"location":
            self._location = value.strip()
        elif name == b"transfer-encoding":
            self._chunked = b"chunked" in value.lower()

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._keep_alive = self.parser.should_keep_alive()
        status = self.parser.get_status_code()
        if status != 200:
            # Not a page: the caller needs the status (and Location) only; the connection is
            # not reused, so its body is never read.
            self._keep_alive = False
            self._finish()
        elif self._declared is not None and self._declared > self._cap:
            self._fail(OverCap(
                f"response of {self._declared} bytes is over the {self._cap} byte cap"
            ))

    def on_body(self, body: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            return
        self._size += len(body)
        if self._size > self._cap:
            self._fail(OverCap(f"response is over the {self._cap} byte cap"))
            raise _Stop  # stop parsing: llhttp reports it as a callback error
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self._finish()

    def _finish(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        waiter.set_result(Answer(
            self.parser.get_status_code(), self._reason.decode("latin-1"), self._encoding,
            self._location, body,
        ))

    def _fail(self, error: GetError) -> None:
        self._keep_alive = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
        self.close()

    async def request(self, data: bytes, cap: int) -> Answer:
        """Send a prebuilt request and wait for its answer."""
        self._reset()
        self._cap = cap
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            assert self.transport is not None, "request before the connection was made"
            self.transport.write(data)
            answer = await self._waiter
        except BaseException:
            self.close()  # cancelled (timeout) or failed mid-answer: never reused
            raise
        finally:
            self._waiter = None
            self._chunks = []
        if not self._keep_alive:
            self.close()
        return answer

    @property
    def reusable(self) -> bool:
        return (
            self.open and self._keep_alive
            and self.transport is not None and not self.transport.is_closing()
        )

    def close(self) -> None:
        """Close the transport now (idempotent)."""
        self.open = False
        if self.transport is not None:
            self.transport.close()


class _Stop(Exception):
    """Raised from `on_body` to make llhttp stop parsing an answer we refused."""


_IDLE_PER_HOST = 2


class Pool:
    """Idle connections by (host, port): a scrape takes one, or opens one, and puts it back; one
    idle past `idle_timeout` is closed at the next request to any host, not only to its own."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self.idle_timeout = 60.0
        self._swept = time.monotonic()

    def _expire(self) -> None:
        now = time.monotonic()
        if now - self._swept < self.idle_timeout / 2:
            return
        self._swept = now
        for key, connections in list(self._idle.items()):
            expired = [c for c in connections if now - c.idle_since > self.idle_timeout]
            for connection in expired:
                connection.close()
            if kept := [c for c in connections if c not in expired]:
                self._idle[key] = kept
            else:
                del self._idle[key]

    async def get(self, host: str, port: int, request: bytes, cap: int) -> Answer:
        """One GET over a kept-alive connection if there is one, else over a new one; one the
        server closed while idle fails before a status line and is retried on a new one."""
        self._expire()
        key = (host, port)
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if not connection.reusable:
                connection.close()
                continue
            try:
                answer = await connection.request(request, cap)
            except _Disconnected:
                break
            self._put_back(key, connection)
            return answer
        connection = await _connect(host, port)
        try:
            answer = await connection.request(request, cap)
        except _Disconnected as exc:
            raise GetError(str(exc)) from None
        self._put_back(key, connection)
        return answer

    def _put_back(self, key: tuple[str, int], connection: _Connection) -> None:
        if not connection.reusable:
            return
        idle = self._idle.setdefault(key, [])
        if len(idle) < _IDLE_PER_HOST:
            connection.idle_since = time.monotonic()
            idle.append(connection)
        else:
            connection.close()

    def forget(self, keep: set[tuple[str, int]]) -> None:
        """Close idle connections to hosts no longer scraped (after a reload)."""
        for key in [k for k in self._idle if k not in keep]:
            for connection in self._idle.pop(key):
                connection.close()

    def close(self) -> None:
        """Close every idle connection."""
        self.forget(set())


async def _connect(host: str, port: int) -> _Connection:
    loop = asyncio.get_running_loop()
    try:
        _, connection = await loop.create_connection(_Connection, host, port)
    except socket.gaierror as exc:
        raise GetError(f"connection failed: {exc.strerror or exc}") from None
    except OSError as exc:
        if exc.errno:
            # asyncio says "Connect call failed ('127.0.0.1', 9)"; the errno says why.
            raise GetError(f"connection failed: {os.strerror(exc.errno)}") from None
        raise GetError(f"connection failed: {exc}") from None
    return connection
