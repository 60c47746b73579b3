"""The recording proxy: its ports and route, which relay a benchmark's OpenAI traffic to a
target unchanged (passthrough.py on a target's port, relay.py on `/proxy/`), and the
per-request figures recorded per window."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from exporter.config.model import Config, ProxyConfig
from exporter.core.perrequest import RequestStats
from exporter.core.shards import owner
from exporter.server.edges import TrafficEdges
from exporter.web.passthrough import PortRelay
from exporter.web.relay import RecordFn, Timeouts, Upstream, relay
from exporter.web.relayloop import HandedEdges, RelayLoop, handed_record
from exporter.web.requesthist import RequestLengths

log = logging.getLogger(__name__)


def _for(upstream: Upstream, request: web.Request) -> Upstream:
    """The upstream as one request sees it: only a generation request (a completion) moves
    the traffic edges; `GET /v1/models` or `/metrics` through the proxy does not."""
    generation = request.method == "POST" and request.path.rstrip("/").endswith("completions")
    return upstream if generation or upstream.edges is None else replace(upstream, edges=None)


def _ours(config: Config, name: str) -> bool:
    """A target's proxy lives on the shard that scrapes it (whose windows count it)."""
    return config.shards <= 1 or owner(name, config.shards) == config.shard_index


def origin_of(url: str) -> str:
    """scheme://host:port of a URL: where a target's OpenAI API lives beside its metrics."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


@dataclass
class Proxying:
    """The proxy on the exporter's app; its per-target ports follow the config across reloads,
    served on their own thread and loop (`relays`), `/proxy/` on the exporter's."""

    record: RecordFn  # the window book's: each answer's figures go to its windows
    config: Callable[[], Config]
    edges: TrafficEdges | None = None  # traffic-edged windows (their starts wait on requests)
    session: aiohttp.ClientSession | None = None  # `/proxy/`'s, on the exporter's loop
    relays: RelayLoop | None = None  # the per-target ports' thread and loop
    # target name -> ((listen, origin), its relay on the relay loop)
    ports: dict[str, tuple[tuple[str, str], PortRelay]] = field(default_factory=dict)
    seen: Config | None = None
    pending: asyncio.Task[None] | None = None
    lengths: RequestLengths = field(default_factory=RequestLengths)  # the live histogram

    def upstream(self, name: str) -> Upstream | None:
        """The upstream of a configured target by name, or None."""
        config = self.config()
        for target in config.targets:
            if target.name == name and _ours(config, name):
                return Upstream(name, origin_of(target.api_url or target.url), self._record,
                                self.edges, os.environ.get(config.auth.token_env, ""),
                                _timeouts(target.proxy))
        return None

    def _record(self, target: str, stats: RequestStats) -> None:
        self.record(target, stats)
        self.lengths.observe(target, stats)

    def _port_upstream(self, name: str) -> Upstream | None:
        """A target's upstream for its port's relay loop: records and edges handed back here."""
        upstream = self.upstream(name)
        if upstream is None:
            return None
        home = asyncio.get_running_loop()
        edges = HandedEdges(self.edges, home) if self.edges is not None else None
        return replace(upstream, record=handed_record(home, self._record), edges=edges)

    async def serve(self, app: web.Application) -> AsyncGenerator[None, None]:
        """cleanup_ctx: every target's `proxy.listen`; OSError naming the key for a taken port."""
        async with aiohttp.ClientSession(auto_decompress=False,
                                         timeout=aiohttp.ClientTimeout(total=None)) as session:
            self.session = session
            self.relays = relays = RelayLoop()
            await relays.start()
            try:
                await self.reconcile(strict=True)
                yield
            finally:
                if self.pending is not None:
                    self.pending.cancel()
                self.session = None
                for _, port in self.ports.values():
                    await relays.call(port.close())
                self.ports.clear()
                await relays.stop()
                self.relays = None

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
                  for i, t in enumerate(config.targets)
                  if t.proxy and t.proxy.listen and _ours(config, t.name)}
        for name, (where, port) in list(self.ports.items()):
            if name not in wanted or wanted[name][1] != where:
                del self.ports[name]
                assert self.relays is not None
                await self.relays.call(port.close())
        for name, (index, where) in wanted.items():
            if name in self.ports:
                continue
            try:
                self.ports[name] = (where, await self._listen(index, name, where[0]))
            except OSError as exc:
                if strict:
                    raise
                log.error("proxy listen failed target=%s error=%s", name, exc)

    async def _listen(self, index: int, name: str, listen: str) -> PortRelay:
        upstream = self._port_upstream(name)
        relays = self.relays
        assert upstream is not None and relays is not None
        port = PortRelay(upstream)
        host, _, number = listen.rpartition(":")
        try:
            await relays.call(port.open(host.strip("[]"), int(number),
                                        self.config().header_timeout))
        except OSError as exc:
            raise OSError(exc.errno, f"targets.{index}.proxy.listen: cannot listen on "
                          f"{listen}: {exc.strerror}") from None
        return port


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
    return await relay(request, proxying.session, _for(upstream, request),
                       "/" + request.match_info["tail"])


PROXYING = web.AppKey("proxying", Proxying)
