"""The recording proxy: its ports and route, which relay a benchmark's OpenAI traffic to a
target unchanged (relay.py), and the per-request figures recorded per window."""

from __future__ import annotations

import asyncio
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

from exporter.config.model import Config, ProxyConfig
from exporter.core.perrequest import PerRequest, RequestStats, in_spans, span_totals
from exporter.state.answertext import indented
from exporter.state.resultfiles import atomic_write
from exporter.web.edges import TrafficEdges
from exporter.web.guard import GuardedSite
from exporter.web.relay import Timeouts, Upstream, relay
from exporter.web.requesthist import RequestLengths

log = logging.getLogger(__name__)
KEEP_RECORDED = 1000  # windows whose per-request figures are kept


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

    def record(self, target: str, stats: RequestStats) -> None:
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
                                self.edges, os.environ.get(config.auth.token_env, ""),
                                _timeouts(target.proxy))
        return None

    def _record(self, target: str, stats: RequestStats) -> None:
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
                  for i, t in enumerate(config.targets) if t.proxy and t.proxy.listen}
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


def _timeouts(proxy: ProxyConfig | None) -> Timeouts:
    if proxy is None:
        return Timeouts()
    return Timeouts(proxy.connect_timeout, proxy.first_byte_timeout, proxy.idle_timeout)


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
