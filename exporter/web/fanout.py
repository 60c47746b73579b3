"""Transparent shards: a fleet route's one answer, given by this shard alone or asked of every
shard (the peers over HTTP, vetted) and merged by the route's merge; a peer unreachable, late or
garbled makes its targets N/A with the reason."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from exporter.analysis.advise import window_advice
from exporter.core.errors import RequestError, UnknownWindowError
from exporter.core.shards import Asked, Merge, ShardPart, settle, split
from exporter.core.window import check_window_id
from exporter.server.service import ExporterService
from exporter.server.targets import resolve_names
from exporter.web.bodies import json_body
from exporter.web.peers import PEER_HEADER, Peers, decode_answer


@dataclass(frozen=True)
class Ask:
    """A fleet route's call as every shard reads it: what a peer is asked, the window id, the
    query and the body; `fleet` when it covers every shard (not a peer's call, not one alone)."""

    method: str
    path: str
    window_id: str = ""  # "" for a route without one
    query: Mapping[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    fleet: bool = False


@dataclass(frozen=True)
class Reply:
    """A shard's answer: its JSON object, or the text it is encoded to already; its status."""

    body: Mapping[str, Any] | None
    status: int = 200
    text: bytes | None = None

    def json(self) -> dict[str, Any]:
        """The answer as an object (the text decoded)."""
        if self.body is not None:
            return dict(self.body)
        decoded = decode_answer(self.text or b"")
        assert isinstance(decoded, dict), "our own answer is an object"
        return decoded


Answer = Callable[[web.Request, Ask], Awaitable[Reply]]


@dataclass(frozen=True)
class Fleet:
    """How a fleet route covers every shard: the merge of their answers (core/shards.py)."""

    merge: Merge
    # Opens a window: asked here first (a refusal opens nothing), then the peers with its id.
    opens: bool = False
    # What a shard may refuse and the merged answer still report.
    refuses: tuple[type[RequestError], ...] = (UnknownWindowError,)


def shares(service: ExporterService, names: list[str] | None,
           window_id: str | None) -> dict[int, list[str]]:
    """Each shard's share of a start's `targets` (names or host:ports), else of the fleet."""
    fleet = service.fleet_targets()
    if names is not None:
        names = resolve_names(names, {n: t.host_port for n, t in fleet.items()}, window_id)
    return split(fleet if names is None else names, service.config.shards)


class Fanout:
    """The fan-out of one shard: its peers, and every fleet route's answer over them."""

    def __init__(self, service: ExporterService):
        self.service = service
        self.peers = Peers(lambda: self.service.config)

    def sharded(self) -> bool:
        """Whether this exporter is one of several shards that know each other."""
        return len(self.service.config.peers) > 1

    def active(self, request: web.Request) -> bool:
        """Whether this request covers the fleet: peers configured, not itself a peer's call."""
        return self.sharded() and PEER_HEADER not in request.headers

    async def ask(self, request: web.Request, fleet: Fleet) -> Ask:
        """What `request` asks of a fleet route (its window id checked, an opening's body read)."""
        match = request.match_info.get("id")
        return Ask("GET" if request.method == "HEAD" else request.method, request.path_qs,
                   "" if match is None else check_window_id(match), request.query,
                   await json_body(request) if fleet.opens else None, self.active(request))

    async def answer(self, request: web.Request, answer: Answer, fleet: Fleet,
                     ask: Ask) -> Reply:
        """`answer` of this shard alone, or of every shard merged when `ask.fleet`."""
        if not ask.fleet:
            return await answer(request, ask)
        me = self.service.config.shard_index
        first = [await self._local(request, answer, fleet, ask)] if fleet.opens else []
        window_id = first[0].answer["id"] if first and first[0].answer else ask.window_id
        body = None if ask.method == "GET" else (ask.body or {}) | (
            {"id": window_id} if fleet.opens else {})
        calls = [self._local(request, answer, fleet, ask) if i == me
                 else self.peers.call(i, ask.method, ask.path, body)
                 for i in range(len(self.service.config.peers)) if not (first and i == me)]
        parts = sorted([*first, *await asyncio.gather(*calls)], key=lambda p: p.index)
        asked = self._asked(ask, window_id)
        settle(parts, asked)
        status, merged = fleet.merge(parts, asked)
        if "results" in merged:  # each shard advised on its own targets: advise on the whole
            merged["advice"] = window_advice(merged)
        return Reply(merged, status)

    async def _local(self, request: web.Request, answer: Answer, fleet: Fleet,
                     ask: Ask) -> ShardPart:
        index = self.service.config.shard_index
        part = ShardPart(index, self.service.config.peers[index], local=True)
        try:
            reply = await answer(request, ask)
            part.answer, part.status = reply.json(), reply.status
        except fleet.refuses as exc:
            part.status, part.error = exc.status, str(exc)
        return part

    def _asked(self, ask: Ask, window_id: str) -> Asked:
        """The fleet as the merge reads it; each shard's targets: its share of those asked."""
        fleet = {n: (t.url, t.host_port) for n, t in self.service.fleet_targets().items()}
        return Asked(self.service.config.shards, fleet,
                     shares(self.service, (ask.body or {}).get("targets"), window_id),
                     window_id or None, ask.query)


FANOUT = web.AppKey("fanout", Fanout)
