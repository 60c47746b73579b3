"""The recording proxy: relays a benchmark's OpenAI traffic to a target unchanged and records
each answer's spec-decode figures; one too big (`PARSE_LIMIT`) or unreadable is relayed all the
same and counted unreadable."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from exporter.config.model import Config
from exporter.core.perrequest import (
    PerRequest,
    RequestStats,
    from_json,
    from_sse,
    in_spans,
    span_totals,
)
from exporter.state.answertext import indented
from exporter.state.resultfiles import atomic_write
from exporter.web.edges import TrafficEdges
from exporter.web.guard import GuardedSite
from exporter.web.requesthist import RequestLengths

log = logging.getLogger(__name__)
PARSE_LIMIT = 4 * 1024 * 1024  # an answer larger than this is relayed, not parsed
SMALL_BODY = 64 * 1024  # a request body up to this size (with its length given) is sent whole
KEEP_RECORDED = 1000  # windows whose per-request figures are kept
# Headers of one hop (RFC 9110 7.6.1), and Host, which names the proxy, not the upstream.
_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
    "Transfer-Encoding", "Upgrade", "Host", "Content-Length"))
# The exporter's token on /proxy/ (handlers.auth_middleware): the client's own Authorization is
# the model server's, relayed untouched.
PROXY_TOKEN_HEADER = "X-Specdec-Token"

RecordFn = Callable[[str, RequestStats | None], None]


@dataclass(frozen=True)
class Upstream:
    """Where one target's API lives and what to call with each recorded answer."""

    target: str
    origin: str  # scheme://host:port
    record: RecordFn
    edges: TrafficEdges | None = None
    own_token: str = ""  # the exporter's token: never sent on, in whatever header it arrives


def _forwarded(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((key, value) for key, value in headers.items() if key.lower() not in _HOP)


def _sent_on(headers: CIMultiDictProxy[str], own_token: str) -> CIMultiDict[str]:
    """A request's headers for the upstream: one hop's and the exporter's own token left out."""
    out = _forwarded(headers)
    out.popall(PROXY_TOKEN_HEADER, None)
    if own_token and any(_is_token(value, own_token) for value in out.getall("Authorization", [])):
        out.popall("Authorization")
    return out


def _is_token(value: str, token: str) -> bool:
    given = value.removeprefix("Bearer ").strip().encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, token.encode("utf-8"))


def _recorded(request: web.Request) -> bool:
    """Only (chat) completion answers carry per-request figures."""
    return request.method == "POST" and request.path.rstrip("/").endswith("completions")


async def relay(request: web.Request, session: aiohttp.ClientSession, upstream: Upstream,
                path: str) -> web.StreamResponse:
    """Forward one request and relay its answer as it arrives, between the traffic edges' calls."""
    edges = upstream.edges
    tickets = await edges.arrive(upstream.target) if edges is not None else []
    url = upstream.origin + path + (f"?{request.query_string}" if request.query_string else "")
    body: bytes | aiohttp.StreamReader | None = None
    try:
        if request.body_exists:
            # A small body of known length (a prompt) goes whole: streamed, it costs more writes.
            length = request.content_length
            small = length is not None and length <= SMALL_BODY
            body = await request.read() if small else request.content
        try:
            answer = await session.request(request.method, url, data=body,
                                           headers=_sent_on(request.headers,
                                                            upstream.own_token),
                                           allow_redirects=False)
        except (aiohttp.ClientError, OSError) as exc:
            return web.json_response({"error": f"upstream {upstream.origin} failed: {exc}"},
                                     status=502)
        async with answer:
            response = web.StreamResponse(status=answer.status, reason=answer.reason,
                                          headers=_forwarded(answer.headers))
            if answer.content_length is not None:
                response.content_length = answer.content_length
            await response.prepare(request)
            kept: list[bytes] | None = [] if _recorded(request) else None
            size = 0
            # A client gone makes write() raise: leaving the block cancels the upstream request.
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
                if kept is not None:
                    size += len(chunk)
                    if size > PARSE_LIMIT:
                        kept = None
                        upstream.record(upstream.target, None)
                        continue
                    kept.append(chunk)
            await response.write_eof()
        if kept is not None:
            whole = b"".join(kept)
            sse = "text/event-stream" in answer.headers.get("Content-Type", "")
            upstream.record(upstream.target, from_sse(whole) if sse else from_json(whole))
        return response
    finally:
        if edges is not None:
            edges.done(tickets)


def proxy_app(upstream: Upstream, session: aiohttp.ClientSession) -> web.Application:
    """An app that forwards every path and method to one target (a per-target listen port)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        return await relay(request, session, upstream, request.raw_path.split("?")[0])

    app = web.Application(client_max_size=0)
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


class Recordings:
    """Per-request figures per window and target; kept after a stop (the newest KEEP_RECORDED)."""

    def __init__(self, open_windows: Callable[[], list[tuple[str, Iterable[str]]]],
                 clock: Callable[[], float] = time.time) -> None:
        self._open_windows = open_windows
        self._clock = clock  # the exporter's, which dates the scrapes around a restart
        self._windows: dict[str, dict[str, PerRequest]] = {}

    def record(self, target: str, stats: RequestStats | None) -> None:
        """Count one proxied answer into every open window that covers its target."""
        at = self._clock()
        for window_id, targets in self._open_windows():
            if target in targets:
                per_target = self._windows.setdefault(window_id, {})
                per_target.setdefault(target, PerRequest()).record(stats, at)
                self._windows[window_id] = self._windows.pop(window_id)  # newest last
        while len(self._windows) > KEEP_RECORDED:
            del self._windows[next(iter(self._windows))]

    def block(self, window_id: str, read: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """The `per_request` block, if the proxy saw requests in the window (only then `read`)."""
        per_target = self._windows.get(window_id)
        if not per_target:
            return None
        answer = read()
        results = answer.get("results") or {}
        total = PerRequest()
        targets = {}
        holes = []
        for name, acc in sorted(per_target.items()):
            total.merge(acc)
            result = results.get(name)
            targets[name] = acc.answer(_counters(result) if results else None)
            spans = result.get("unobserved") if isinstance(result, dict) else None
            if isinstance(spans, list) and spans:
                targets[name]["unobserved"] = in_spans(acc, spans)
                holes += targets[name]["unobserved"]
        aggregate = total.answer(_counters(answer.get("aggregate")) if results else None)
        if holes:
            aggregate["unobserved"] = span_totals(holes)
        return {"targets": targets, "aggregate": aggregate}


def _counters(result: object) -> dict[str, int]:
    data = result.get("data") if isinstance(result, dict) else None
    return dict(data) if isinstance(data, dict) else {}


def origin_of(url: str) -> str:
    """scheme://host:port of a URL: where a target's OpenAI API lives beside its metrics."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


@dataclass
class Proxying:
    """The proxy on the exporter's app; its per-target ports follow the config across reloads."""

    recordings: Recordings
    config: Callable[[], Config]
    edges: TrafficEdges | None = None  # traffic-edged windows (their starts wait on requests)
    session: aiohttp.ClientSession | None = None
    # target name -> ((listen, origin), its runner)
    ports: dict[str, tuple[tuple[str, str], web.AppRunner]] = field(default_factory=dict)
    seen: Config | None = None
    pending: asyncio.Task[None] | None = None
    lengths: RequestLengths = field(default_factory=RequestLengths)  # the live histogram

    def upstream(self, name: str) -> Upstream | None:
        """The upstream of a configured target by name, or None."""
        config = self.config()
        for target in config.targets:
            if target.name == name:
                return Upstream(name, origin_of(target.api_url or target.url), self._record,
                                self.edges, os.environ.get(config.auth.token_env, ""))
        return None

    def _record(self, target: str, stats: RequestStats | None) -> None:
        self.recordings.record(target, stats)
        self.lengths.observe(target, stats)

    async def serve(self, app: web.Application) -> AsyncGenerator[None, None]:
        """cleanup_ctx: every target's `proxy.listen`; OSError naming the key for a taken port."""
        async with aiohttp.ClientSession(auto_decompress=False,
                                         timeout=aiohttp.ClientTimeout(total=None)) as session:
            self.session = session
            try:
                await self.reconcile(strict=True)
                yield
            finally:
                if self.pending is not None:
                    self.pending.cancel()
                self.session = None
                for _, runner in self.ports.values():
                    await runner.cleanup()
                self.ports.clear()

    def scraped(self, *_: object) -> None:
        """After a scrape: a reloaded config's ports are opened and closed (off this call)."""
        if self.session is not None and self.config() is not self.seen and (
                self.pending is None or self.pending.done()):
            self.pending = asyncio.get_running_loop().create_task(self.reconcile())

    async def reconcile(self, strict: bool = False) -> None:
        """Make the open ports those of the config; a taken one is logged (raised if strict)."""
        config = self.seen = self.config()
        self.lengths.keep({t.name: t.labels for t in config.targets})
        wanted = {t.name: (i, (t.proxy.listen, origin_of(t.api_url or t.url)))
                  for i, t in enumerate(config.targets) if t.proxy is not None}
        for name, (where, runner) in list(self.ports.items()):
            if name not in wanted or wanted[name][1] != where:
                del self.ports[name]
                await runner.cleanup()
        for name, (index, where) in wanted.items():
            if name in self.ports:
                continue
            try:
                self.ports[name] = (where, await self._listen(index, name, where[0]))
            except OSError as exc:
                if strict:
                    raise
                log.error("proxy listen failed target=%s error=%s", name, exc)

    async def _listen(self, index: int, name: str, listen: str) -> web.AppRunner:
        upstream = self.upstream(name)
        assert upstream is not None and self.session is not None
        runner = web.AppRunner(proxy_app(upstream, self.session), access_log=None)
        await runner.setup()
        host, _, port = listen.rpartition(":")
        try:
            # A client slow to send its head (slowloris) is cut off as on the main listener.
            await GuardedSite(runner, host.strip("[]"), int(port),
                              header_timeout=self.config().header_timeout).start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(exc.errno, f"targets.{index}.proxy.listen: cannot listen on "
                          f"{listen}: {exc.strerror}") from None
        return runner


async def main_listener_proxy(request: web.Request) -> web.StreamResponse:
    """`/proxy/<target name>/...` on the exporter's own port, for clients that take a base URL."""
    proxying = request.app[PROXYING]
    upstream = proxying.upstream(request.match_info["target"])
    if upstream is None or proxying.session is None:
        return web.json_response({"error": f'unknown target "{request.match_info["target"]}"'},
                                 status=404)
    return await relay(request, proxying.session, upstream, "/" + request.match_info["tail"])


PROXYING = web.AppKey("proxying", Proxying)


def traffic_edges(app: web.Application) -> TrafficEdges:
    """The app's traffic-edged windows (an app made with its proxy has them)."""
    proxying = app.get(PROXYING)
    if proxying is None or proxying.edges is None:
        raise RuntimeError("the app has no recording proxy")
    return proxying.edges


def proxy_blocks(app: web.Application, window_id: str,
                 answer: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The proxy's `edges` and `per_request` blocks of a window (`answer` called for the latter)."""
    proxying = app[PROXYING]
    blocks: dict[str, Any] = {}
    if proxying.edges is not None and (edges := proxying.edges.block(window_id)) is not None:
        blocks["edges"] = edges
    if (per_request := proxying.recordings.block(window_id, answer)) is not None:
        blocks["per_request"] = per_request
    return blocks


def add_to_window_file(directory: Path, blocks: dict[str, Any]) -> None:
    """window.json gets the proxy's blocks of the stop answer, rewritten whole and atomically."""
    path = directory / "window.json"
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return  # no file (results not written): the answer alone carries the blocks
    if isinstance(doc, dict) and any(doc.get(k) != v for k, v in blocks.items()):
        atomic_write(path, indented(doc | blocks))
