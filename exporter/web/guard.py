"""Against slowloris and socket floods: aiohttp's protocol factory, wrapped, closes a connection
whose request head is not complete within `header_timeout`; at `max_connections` the oldest one
still waiting for its head makes room (a client being answered is never cut)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections.abc import Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

# File descriptors kept for what is not a client connection: scrapes (scrape_concurrency),
# the state database, result files, discovery, the log.
FD_RESERVE = 128
MAX_CONNECTIONS = 4096  # past this many open clients something else is wrong
_HEAD_END = (b"\r\n\r\n", b"\n\n")


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (as Go does for Prometheus); the new soft one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("file descriptor limit not raised soft=%d hard=%d error=%s",
                        soft, hard, exc)
    return soft


def connection_cap(fd_limit: int, scrape_concurrency: int) -> int:
    """How many client connections fit beside the scrapes and files under `fd_limit`."""
    return max(8, min(MAX_CONNECTIONS, fd_limit - scrape_concurrency - FD_RESERVE))


class _Guarded(asyncio.Protocol):
    """One client connection: aiohttp's protocol behind a head deadline."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.head_done = False
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.guard.admit(self)
        self._timer = asyncio.get_running_loop().call_later(
            self.guard.header_timeout, self._too_slow)
        self.inner.connection_made(transport)

    def _too_slow(self) -> None:
        if not self.head_done and self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self.head_done:
            seen = self._tail + data
            if any(end in seen for end in _HEAD_END):
                self.head_done = True
                self._cancel_timer()
            else:
                self._tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.guard.release(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class ConnectionGuard:
    """Protocol factory around aiohttp's: head deadline and a cap on open connections."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], *, header_timeout: float,
                 max_connections: int):
        self.factory = factory
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.open: dict[_Guarded, None] = {}  # insertion order: oldest first

    def __call__(self) -> asyncio.Protocol:
        return _Guarded(self, self.factory())

    def admit(self, conn: _Guarded) -> None:
        if len(self.open) >= self.max_connections:
            waiting = next((c for c in self.open if not c.head_done), None)
            if waiting is not None and waiting.transport is not None:
                self.release(waiting)
                waiting.transport.abort()
            elif conn.transport is not None:
                # Every slot is answering a request: refuse the newcomer, not a client.
                conn.transport.abort()
                return
        self.open[conn] = None

    def release(self, conn: _Guarded) -> None:
        self.open.pop(conn, None)


class GuardedSite(web.TCPSite):
    """aiohttp's TCP site with its connections behind a `ConnectionGuard`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 header_timeout: float, max_connections: int) -> None:
        super().__init__(runner, host, port)
        self.guard: ConnectionGuard | None = None
        self._guard_args = (header_timeout, max_connections)

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        timeout, cap = self._guard_args
        self.guard = ConnectionGuard(server, header_timeout=timeout, max_connections=cap)
        self._server = await asyncio.get_running_loop().create_server(
            self.guard, self._host, self._port, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port)


def run_guarded(app: web.Application, host: str, port: int, *,
                loop: asyncio.AbstractEventLoop, scrape_concurrency: int,
                header_timeout: float, **runner_kwargs: Any) -> None:
    """`web.run_app` with the guard: serve until SIGTERM/SIGINT, then clean up the same way."""
    fd_limit = raise_fd_limit()
    cap = connection_cap(fd_limit, scrape_concurrency)

    async def main() -> None:
        runner = web.AppRunner(app, handle_signals=True, keepalive_timeout=header_timeout,
                               **runner_kwargs)
        await runner.setup()
        try:
            site = GuardedSite(runner, host, port, header_timeout=header_timeout,
                               max_connections=cap)
            await site.start()
            log.info("listening host=%s port=%d max_connections=%d fd_limit=%d "
                     "header_timeout=%gs", host, port, cap, fd_limit, header_timeout)
            await asyncio.Event().wait()  # until GracefulExit (SIGTERM) or Ctrl-C
        finally:
            await runner.cleanup()

    asyncio.set_event_loop(loop)
    task = loop.create_task(main())
    try:
        with contextlib.suppress(web.GracefulExit, KeyboardInterrupt):
            loop.run_until_complete(task)
    finally:
        try:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, web.GracefulExit):
                    loop.run_until_complete(task)
        finally:
            for pending in asyncio.all_tasks(loop):
                pending.cancel()
            loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(loop),
                                                   return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
