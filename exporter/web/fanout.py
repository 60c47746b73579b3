"""Transparent shards: a window call to any shard covers every shard's targets (the peers' over
HTTP, vetted, merged); a peer unreachable, late or garbled makes its targets N/A with the reason."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from exporter.analysis.advise import window_advice
from exporter.config.model import Config, TargetConfig
from exporter.core.errors import RequestError, StoreError, UnknownWindowError
from exporter.core.isotime import with_iso_times
from exporter.core.shards import (
    ShardPart,
    merge_delete,
    merge_list,
    merge_open,
    merge_series,
    merge_start,
    merge_stop,
    split,
    vet_list,
    vet_open,
    vet_stop,
)
from exporter.core.stopanswer import window_series
from exporter.core.window import check_window_id, new_window_id
from exporter.server.service import ExporterService
from exporter.state.answertext import compact
from exporter.web.bodies import resolve_targets, window_request
from exporter.web.handlers import MAX_LIST, compare_response, list_query, local_list
from exporter.web.pages.window import render_window_page
from exporter.web.peers import PEER_HEADER, Peers

Local = Callable[[], Awaitable[dict[str, Any]]]
Fleet = dict[str, TargetConfig]


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=compact(value), status=status, content_type="application/json")


class Fanout:
    """The fan-out of one shard: its peers and the window calls that cover every shard."""

    def __init__(self, service: ExporterService):
        self.service = service
        self.peers = Peers(lambda: self.service.config)

    @property
    def config(self) -> Config:
        return self.service.config

    def sharded(self) -> bool:
        """Whether this exporter is one of several shards that know each other."""
        return len(self.config.peers) > 1

    def active(self, request: web.Request) -> bool:
        """Whether this request fans out: peers configured and not itself a peer's call."""
        return self.sharded() and PEER_HEADER not in request.headers

    def _fleet(self) -> Fleet:
        """Every target of the fleet, before the split: static ones first, as shards merge."""
        merged = {t.name: t for t in self.config.targets}
        for target in self.service.discovered_targets():
            merged.setdefault(target.name, target)
        return merged

    async def _local(self, call: Local,
                     refusals: tuple[type[RequestError], ...] = (UnknownWindowError,)
                     ) -> ShardPart:
        # `refusals`: what this shard may refuse and the merged answer still report.
        index = self.config.shard_index
        part = ShardPart(index, self.config.peers[index], local=True)
        try:
            part.answer = await call()
            part.status = 200
        except refusals as exc:
            part.status, part.error = exc.status, str(exc)
        return part

    async def _everywhere(self, local: Local, method: str, path: str,
                          refusals: tuple[type[RequestError], ...] = (UnknownWindowError,)
                          ) -> list[ShardPart]:
        me = self.config.shard_index
        calls = [self._local(local, refusals) if i == me
                 else self.peers.call(i, method, path, {} if method != "GET" else None)
                 for i in range(len(self.config.peers))]
        return list(await asyncio.gather(*calls))

    def _vetted(self, parts: list[ShardPart], vet: Callable[[ShardPart, Fleet], None],
                expected: dict[int, list[str]] | None = None) -> None:
        """Each peer's part vetted; each told its targets (by default its share of the fleet)."""
        fleet = self._fleet()
        for part in parts:
            if not part.local:
                vet(part, fleet)
        shares = split(fleet, self.config.shards) if expected is None else expected
        urls = {n: (t.url, t.host_port) for n, t in fleet.items()}
        for part in parts:
            part.expected = shares.get(part.index, [])
            part.urls = urls

    @staticmethod
    def _refuse_if_retry_needed(parts: list[ShardPart], window_id: str) -> None:
        # A shard that could not save (503) keeps its window open: the caller retries.
        for part in parts:
            if part.status == 503:
                raise StoreError(part.reason)
        if all(p.status == 404 for p in parts):
            raise UnknownWindowError(window_id)

    async def start(self, request: web.Request) -> web.Response:
        """Open the same window id on every shard; one start answer for the fleet."""
        body = await window_request(request)
        if body.edges == "traffic":  # its proxy and its start live on one shard (server/edges.py)
            raise RequestError('"edges": "traffic" needs one exporter, not a fleet of shards')
        window_id = body.id or new_window_id(self.service.clock())
        fleet = self._fleet()
        names = None if body.targets is None else resolve_targets(
            body.targets, {n: t.host_port for n, t in fleet.items()}, window_id)
        shares = split(fleet if names is None else names, self.config.shards)
        created: list[bool] = []

        async def local() -> dict[str, Any]:
            mine = shares[self.config.shard_index] if names is not None else None
            was_created, window = await self.service.start_window(
                window_id, body.name, mine, body.labels)
            created.append(was_created)
            return window.summary() | {"start_errors": dict(window.start_errors)}

        def peer_body(index: int) -> dict[str, Any]:
            sent: dict[str, Any] = {"id": window_id, "labels": body.labels}
            if body.name is not None:
                sent["name"] = body.name
            if names is not None:
                sent["targets"] = shares[index]
            return sent

        # The local start first: a refusal here (a bad name, too many windows) starts nothing.
        mine = await self._local(local)
        others = [self.peers.call(i, "POST", "/api/v1/windows", peer_body(i))
                  for i in range(len(self.config.peers)) if i != self.config.shard_index]
        parts = sorted([mine, *await asyncio.gather(*others)], key=lambda p: p.index)
        self._vetted(parts, vet_open, shares)
        self._refuse_if_retry_needed(parts, window_id)
        created += [p.status == 201 for p in parts if not p.local and p.answer is not None]
        return _json(merge_start(parts), status=201 if any(created) else 200)

    def _stopped(self, parts: list[ShardPart]) -> dict[str, Any]:
        self._vetted(parts, lambda part, fleet: vet_stop(part, self.config.shards, fleet))
        body = merge_stop(parts)
        # Each shard's advice covers its own targets only: advise again over the merged whole.
        return body | {"advice": window_advice(body)}

    async def stop(self, request: web.Request) -> web.Response:
        """Stop the window on every shard; one stop answer, aggregate from every count."""
        window_id = check_window_id(request.match_info["id"])

        async def local() -> dict[str, Any]:
            window = await self.service.stop_window(window_id)
            assert window.answer is not None
            return window.answer

        parts = await self._everywhere(local, "POST", f"/api/v1/windows/{window_id}/stop")
        self._refuse_if_retry_needed(parts, window_id)
        return _json(self._stopped(parts))

    async def window(self, window_id: str) -> dict[str, Any]:
        """The window on every shard: the merged stop answer once all stopped, else open."""

        async def local() -> dict[str, Any]:
            return self.service.book.get(window_id).state()

        parts = await self._everywhere(local, "GET", f"/api/v1/windows/{window_id}")
        self._refuse_if_retry_needed(parts, window_id)
        answered = [p.answer for p in parts if p.answer is not None]
        if all("results" in a for a in answered):
            return self._stopped(parts)
        self._vetted(parts, vet_open)
        return merge_open(parts)

    async def get(self, request: web.Request) -> web.Response:
        return _json(await self.window(check_window_id(request.match_info["id"])))

    async def delete(self, request: web.Request) -> web.Response:
        """Forget a stopped window on every shard (each keeps its files)."""
        window_id = check_window_id(request.match_info["id"])

        async def local() -> dict[str, Any]:
            self.service.book.delete(window_id)
            return {"id": window_id, "deleted": True}

        parts = await self._everywhere(local, "DELETE", f"/api/v1/windows/{window_id}",
                                       refusals=(RequestError,))
        self._refuse_if_retry_needed(parts, window_id)
        status, body = merge_delete(parts, window_id)
        return _json(body, status=status)

    async def windows(self, limit: int, state: str | None) -> dict[str, Any]:
        """The window list of every shard, merged: each id once, over all its targets."""

        async def local() -> dict[str, Any]:
            return local_list(self.service, limit, state)

        query = urlencode({"limit": limit} | ({"state": state} if state else {}))
        parts = await self._everywhere(local, "GET", f"/api/v1/windows?{query}")
        for part in parts:
            if not part.local:
                vet_list(part)
        answer: dict[str, Any] = with_iso_times(merge_list(parts, limit))
        return answer

    async def list(self, request: web.Request) -> web.Response:
        return _json(await self.windows(*list_query(request)))

    async def series(self, window_id: str) -> dict[str, Any]:
        """A window's per-scrape series from every shard, each target's from its owner."""

        async def local() -> dict[str, Any]:
            return window_series(self.service.book.with_series(window_id))

        parts = await self._everywhere(local, "GET", f"/api/v1/windows/{window_id}/series")
        self._refuse_if_retry_needed(parts, window_id)
        return merge_series(parts, self.config.shards)

    async def series_answer(self, request: web.Request) -> web.Response:
        return _json(await self.series(check_window_id(request.match_info["id"])))

    async def window_page(self, request: web.Request) -> web.Response:
        window_id = check_window_id(request.match_info["id"])
        state, series = await asyncio.gather(self.window(window_id), self.series(window_id))
        text = render_window_page(state, series | {"now": self.service.clock()})
        return web.Response(text=text, content_type="text/html")

    async def compare_page(self, request: web.Request) -> web.Response:

        async def answer(window_id: str) -> dict[str, Any] | None:
            found = await self.window(window_id)
            return found if "results" in found else None

        windows = (await self.windows(MAX_LIST, None))["windows"]
        return await compare_response(request, windows, answer)


FANOUT = web.AppKey("fanout", Fanout)
