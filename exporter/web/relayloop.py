"""The per-target proxy ports' own thread and event loop: a relay there never waits behind the
exporter's scrapes, stops and page renders; what it records and the traffic edges it passes are
handed to the exporter's loop, which owns the book."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aiohttp

from exporter.core.perrequest import RequestStats
from exporter.server.edges import Ticket, TrafficEdges
from exporter.server.eventloop import new_event_loop

T = TypeVar("T")


class RelayLoop:
    """A thread running its own event loop (uvloop where installed) and one client session."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self.session: aiohttp.ClientSession | None = None
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
        """Start the thread and open the relays' client session on it."""
        self._thread.start()
        self.session = await self.call(_new_session())

    async def stop(self) -> None:
        """Close the session, stop the loop and wait for the thread."""
        if self.session is not None:
            await self.call(self.session.close())
            self.session = None
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join)


async def _new_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(auto_decompress=False,
                                 timeout=aiohttp.ClientTimeout(total=None))


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

    async def arrive(self, target: str, model: str) -> list[Ticket]:
        """`TrafficEdges.arrive` on the exporter's loop; no hop there while no window waits."""
        if not self.edges.registered:
            return []
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self.edges.arrive(target, model), self.home))

    def done(self, tickets: list[Ticket]) -> None:
        """`TrafficEdges.done` on the exporter's loop, after the answer's record."""
        if tickets:
            with contextlib.suppress(RuntimeError):
                self.home.call_soon_threadsafe(self.edges.done, tickets)
