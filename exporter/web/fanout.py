"""Transparent shards: a window start, stop, GET or DELETE sent to any shard acts on every shard.

Wraps the local window API: the shard that takes the request calls its own service directly
and every peer over HTTP (with the token, and a marker header so the peer acts locally and
does not fan out again), then answers one merged body (`exporter.core.shards`). A peer that cannot
be reached makes its targets N/A with the reason; a start is idempotent per id on every shard.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from exporter.web.handlers import WindowRequest, _json_body, _validation_message
from exporter.config.model import Config, TargetConfig
from exporter.core.errors import RequestError, StoreError, UnknownTargetError, UnknownWindowError
from exporter.server.service import ExporterService
from exporter.core.shards import (
    ShardPart,
    merge_delete,
    merge_open,
    merge_start,
    merge_stop,
    owner,
    split,
)
from exporter.core.window import check_window_id, new_window_id

log = logging.getLogger(__name__)

PEER_HEADER = "X-Specdec-Peer"  # set on calls between shards: act locally, do not fan out
PEER_TIMEOUT = 120.0  # a stop scrapes every target of the peer once; generous, but bounded
MAX_PEER_ANSWER = 64 * 1024 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def fleet_targets(config: Config, discovered: list[TargetConfig]) -> dict[str, TargetConfig]:
    """Every target of the fleet, before the split: static ones first, as each shard merges."""
    merged = {t.name: t for t in config.targets}
    for target in discovered:
        merged.setdefault(target.name, target)
    return merged


class Fanout:
    """The fan-out of one shard: its peers, one HTTP session, and the three window calls."""

    def __init__(self, service: ExporterService):
        self.service = service
        self.session: aiohttp.ClientSession | None = None

    @property
    def config(self) -> Config:
        """The service's current config (peers can change on reload)."""
        return self.service.config

    def active(self, request: web.Request) -> bool:
        """Whether this request fans out: peers configured and not itself a peer's call."""
        return len(self.config.peers) > 1 and PEER_HEADER not in request.headers

    def _fleet(self) -> dict[str, TargetConfig]:
        return fleet_targets(self.config, self.service.discovered_targets())

    def _expected(self, names: list[str] | None) -> dict[int, list[str]]:
        fleet = self._fleet()
        return split(fleet if names is None else names, self.config.shards)

    def _resolve(self, names: list[str], window_id: str) -> list[str]:
        fleet = self._fleet()
        by_host_port = {t.host_port: t.name for t in fleet.values()}
        chosen: dict[str, None] = {}
        for name in names:
            found = name if name in fleet else by_host_port.get(name)
            if found is None:
                raise UnknownTargetError(name, window_id, sorted(fleet))
            chosen[found] = None
        return list(chosen)

    def _urls(self) -> dict[str, tuple[str, str]]:
        return {n: (t.url, t.host_port) for n, t in self._fleet().items()}

    async def _call(self, index: int, method: str, path: str,
                    body: dict[str, Any] | None) -> ShardPart:
        url = self.config.peers[index]
        part = ShardPart(index, url)
        assert self.session is not None, "the session starts with the app"
        headers = {PEER_HEADER: "1"}
        if token := os.environ.get(self.config.auth.token_env):
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with self.session.request(
                method, url + path, json=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT),
            ) as response:
                raw = await response.content.read(MAX_PEER_ANSWER + 1)
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            part.error = str(exc) or type(exc).__name__
        else:
            part.status = status
            try:
                data = json.loads(raw) if len(raw) <= MAX_PEER_ANSWER else None
            except ValueError:
                data = None
            if not isinstance(data, dict):
                part.error = "its answer is not a JSON object (or is over 64 MiB)"
            elif status >= 400:
                part.error = str(data.get("error") or f"HTTP {status}")
            else:
                part.answer = data
        if part.answer is None:
            log.warning("peer call failed shard=%d url=%s error=%s", index, url, part.error)
        return part

    async def _local(self, call: Callable[[], Awaitable[dict[str, Any]]],
                     refusals: tuple[type[RequestError], ...] = (UnknownWindowError,)
                     ) -> ShardPart:
        # `refusals`: what this shard may refuse and the merged answer still report (a start's
        # own refusal starts nothing anywhere, so it is raised instead).
        index = self.config.shard_index
        part = ShardPart(index, self.config.peers[index])
        try:
            part.answer = await call()
            part.status = 200
        except refusals as exc:
            part.status, part.error = exc.status, str(exc)
        return part

    async def _everywhere(self, local: Callable[[], Awaitable[dict[str, Any]]], method: str,
                          path: str, bodies: dict[int, dict[str, Any] | None],
                          refusals: tuple[type[RequestError], ...] = (UnknownWindowError,)
                          ) -> list[ShardPart]:
        me = self.config.shard_index
        calls = [self._local(local, refusals) if i == me
                 else self._call(i, method, path, bodies.get(i))
                 for i in range(len(self.config.peers))]
        return list(await asyncio.gather(*calls))

    def _with_expected(self, parts: list[ShardPart], expected: dict[int, list[str]]) -> None:
        urls = self._urls()
        for part in parts:
            part.expected = expected.get(part.index, [])
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
        try:
            body = WindowRequest.model_validate(await _json_body(request))
        except ValidationError as exc:
            raise RequestError(_validation_message(exc)) from None
        window_id = body.id or new_window_id(self.service.clock())
        names = self._resolve(body.targets, window_id) if body.targets is not None else None
        shares = self._expected(names)
        created: list[bool] = []

        async def local() -> dict[str, Any]:
            mine = shares[self.config.shard_index] if names is not None else None
            was_created, window = await self.service.start_window(
                window_id, body.name, mine, body.labels)
            created.append(was_created)
            return window.summary() | {"start_errors": dict(window.start_errors)}

        peer_bodies: dict[int, dict[str, Any] | None] = {}
        for index in range(len(self.config.peers)):
            peer_body: dict[str, Any] = {"id": window_id, "labels": body.labels}
            if body.name is not None:
                peer_body["name"] = body.name
            if names is not None:
                peer_body["targets"] = shares[index]
            peer_bodies[index] = peer_body
        # The local start first: a refusal here (a bad name, too many windows) starts nothing.
        mine = await self._local(local)
        others = [self._call(i, "POST", "/api/v1/windows", peer_bodies[i])
                  for i in range(len(self.config.peers)) if i != self.config.shard_index]
        parts = sorted([mine, *await asyncio.gather(*others)], key=lambda p: p.index)
        self._with_expected(parts, shares)
        self._refuse_if_retry_needed(parts, window_id)
        created += [p.status == 201 for p in parts if p.index != self.config.shard_index]
        return web.json_response(merge_start(parts), status=201 if any(created) else 200)

    async def stop(self, request: web.Request) -> web.Response:
        """Stop the window on every shard; one stop answer, aggregate from every count."""
        window_id = check_window_id(request.match_info["id"])

        async def local() -> dict[str, Any]:
            window = await self.service.stop_window(window_id)
            assert window.answer is not None
            where = Path(self.config.output_dir).resolve() / window.id
            return window.answer | {"results_dir": str(where)}

        parts = await self._everywhere(local, "POST", f"/api/v1/windows/{window_id}/stop", {})
        self._with_expected(parts, self._expected(None))
        self._refuse_if_retry_needed(parts, window_id)
        return web.json_response(merge_stop(parts))

    async def get(self, request: web.Request) -> web.Response:
        """The window on every shard: merged stop answer once all stopped, else open state."""
        window_id = check_window_id(request.match_info["id"])

        async def local() -> dict[str, Any]:
            return self.service.get_window(window_id).state()

        parts = await self._everywhere(local, "GET", f"/api/v1/windows/{window_id}", {})
        self._with_expected(parts, self._expected(None))
        self._refuse_if_retry_needed(parts, window_id)
        answered = [p.answer for p in parts if p.answer is not None]
        if all("results" in a for a in answered):
            return web.json_response(merge_stop(parts))
        return web.json_response(merge_open(parts))

    async def delete(self, request: web.Request) -> web.Response:
        """Forget a stopped window on every shard (each keeps its files)."""
        window_id = check_window_id(request.match_info["id"])

        async def local() -> dict[str, Any]:
            self.service.delete_window(window_id)
            return {"id": window_id, "deleted": True}

        parts = await self._everywhere(local, "DELETE", f"/api/v1/windows/{window_id}", {},
                                       refusals=(RequestError,))
        self._refuse_if_retry_needed(parts, window_id)
        status, body = merge_delete(parts, window_id)
        return web.json_response(body, status=status)


FANOUT = web.AppKey("fanout", Fanout)


@web.middleware
async def fanout_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Window start, stop, GET and DELETE go to every shard when peers are configured."""
    fanout = request.app[FANOUT]
    if not fanout.active(request):
        return await handler(request)
    route = request.match_info.route.resource
    canonical = route.canonical if route is not None else ""
    if request.method == "POST" and canonical == "/api/v1/windows":
        return await fanout.start(request)
    if request.method == "POST" and canonical == "/api/v1/windows/{id}/stop":
        return await fanout.stop(request)
    if request.method == "GET" and canonical == "/api/v1/windows/{id}":
        return await fanout.get(request)
    if request.method == "DELETE" and canonical == "/api/v1/windows/{id}":
        return await fanout.delete(request)
    return await handler(request)


async def peer_session(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the one session for calls to peers (no proxy: peers are our own shards)."""
    fanout = app[FANOUT]
    fanout.session = aiohttp.ClientSession(trust_env=False)
    try:
        yield
    finally:
        await fanout.session.close()


__all__ = ["FANOUT", "Fanout", "fanout_middleware", "owner", "peer_session"]
