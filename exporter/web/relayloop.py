"""The per-target proxy ports' own thread and event loop, and their pooled upstream connections:
a relay there never waits behind the exporter's scrapes, stops and page renders; what it records
and the traffic edges it passes are handed to the exporter's loop, which owns the book."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from multidict import CIMultiDict

from exporter.core.perrequest import RequestStats
from exporter.server.edges import Ticket, TrafficEdges
from exporter.server.eventloop import new_event_loop

T = TypeVar("T")


class RelayLoop:
    """A thread running its own event loop (uvloop where installed)."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name="specdec-relay", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        """`work` run on the relay loop, awaited from the caller's loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    async def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    async def stop(self) -> None:
        """Stop the loop and wait for the thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join)


def handed_record(home: asyncio.AbstractEventLoop,
                  record: Callable[[str, RequestStats], None]
                  ) -> Callable[[str, RequestStats], None]:
    """`record` called on `home` (the exporter's loop), in the order the relays recorded."""
    def hand(target: str, stats: RequestStats) -> None:
        with contextlib.suppress(RuntimeError):  # the exporter's loop has closed: shutting down
            home.call_soon_threadsafe(record, target, stats)
    return hand


class HandedEdges:
    """Traffic edges as a relay on another loop sees them: each call made on the exporter's."""

    def __init__(self, edges: TrafficEdges, home: asyncio.AbstractEventLoop) -> None:
        self.edges = edges
        self.home = home

    @property
    def registered(self) -> bool:
        """Whether a traffic-edged window waits on arrivals."""
        return self.edges.registered

    async def arrive(self, target: str, model: str) -> list[Ticket]:
        """`TrafficEdges.arrive` on the exporter's loop; no hop there while no window waits."""
        if not self.registered:
            return []
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self.edges.arrive(target, model), self.home))

    def done(self, tickets: list[Ticket]) -> None:
        """`TrafficEdges.done` on the exporter's loop, after the answer's record."""
        if tickets:
            with contextlib.suppress(RuntimeError):
                self.home.call_soon_threadsafe(self.edges.done, tickets)


class Receiver(Protocol):
    """What an upstream connection hands its bytes to: the answer it carries."""

    def received(self, data: bytes) -> None:
        """Bytes from the upstream."""

    def lost(self) -> None:
        """The connection closed."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to the upstream; the answer it carries, when it carries one."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.answer: Receiver | None = None
        self.gone = False
        self.writable: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.answer is not None:
            self.answer.received(data)
        elif self.transport is not None:
            self.transport.abort()  # bytes nobody asked for: the connection is not reusable

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        if self.answer is not None:
            self.answer.lost()
        self.resume_writing()

    def pause_writing(self) -> None:
        self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    async def drain(self) -> None:
        if self.writable is not None:
            await self.writable
        if self.gone:
            raise ConnectionResetError("the upstream closed the connection")

    def abort(self) -> None:
        self.gone = True
        if self.transport is not None:
            self.transport.abort()


class Pool:
    """Idle keep-alive connections to one origin."""

    def __init__(self, origin: str) -> None:
        parts = urlsplit(origin)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.netloc = parts.netloc
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.idle: list[UpstreamConnection] = []

    def take(self) -> UpstreamConnection | None:
        """An idle connection, if one is open."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.gone:
                return conn
        return None

    async def get(self, connect: float) -> UpstreamConnection:
        """An idle connection, or a new one within `connect` seconds."""
        if (idle := self.take()) is not None:
            return idle
        try:
            _, conn = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                UpstreamConnection, self.host, self.port, ssl=self.tls), connect)
        except TimeoutError:
            raise ConnectTimeout from None
        return conn

    def put(self, conn: UpstreamConnection) -> None:
        conn.answer = None
        if not conn.gone:
            self.idle.append(conn)

    def close(self) -> None:
        for conn in self.idle:
            conn.abort()
        self.idle.clear()


class ConnectTimeout(Exception):
    """The upstream's connect took longer than `connect_timeout`."""


HEAD_ENDS = (b"\r\n\r\n", b"\n\n")


def content_length(headers: CIMultiDict[str]) -> int | None:
    """A message's declared body length, or None."""
    value = headers.get("Content-Length")
    return int(value) if value is not None and value.strip().isdigit() else None


def head_end(buffer: bytearray, skip: int) -> int:
    """Where the answer's head ends in `buffer`, after `skip` interim heads."""
    start = 0
    for _ in range(skip + 1):
        ends = [i + len(e) for e in HEAD_ENDS if (i := buffer.find(e, start)) >= 0]
        start = min(ends) if ends else len(buffer)
    return start


def head_bytes(first: bytes, headers: CIMultiDict[str]) -> bytes:
    """A message head on the wire."""
    lines = [first] + [f"{k}: {v}".encode("latin-1") for k, v in headers.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def error_answer(status: int, message: str, close: bool) -> bytes:
    """An answer of the relay's own: `{"error": message}`."""
    body = json.dumps({"error": message}).encode()
    headers = CIMultiDict({"Content-Type": "application/json; charset=utf-8",
                           "Content-Length": str(len(body))})
    if close:
        headers["Connection"] = "close"
    return head_bytes(f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode(), headers) + body
