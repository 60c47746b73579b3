"""The targets of this shard: static and discovered, their states and live tracks, scraped one
at a time each (so a target's snapshots reach its windows in order)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from exporter.config.model import Config, TargetConfig
from exporter.core.counting import LiveTrack
from exporter.core.errors import UnknownTargetError
from exporter.core.shards import owner
from exporter.core.snapshot import ScrapeResult
from exporter.scrape.discovery import Discovery
from exporter.scrape.scraper import Scraper

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TargetState:
    """What we know of one target now; replaced whole after every scrape."""

    config: TargetConfig
    last: ScrapeResult | None = None
    errors_total: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    # The last successful scrape (`last` while up): a down target's model is still known.
    last_ok: ScrapeResult | None = None

    def scraped(self, result: ScrapeResult) -> TargetState:
        """This state after a successful scrape (built directly: `replace` is slower)."""
        usable = usable_only(result)
        return TargetState(self.config, usable, self.errors_total, self.last_error,
                           self.last_error_at, usable)

    @property
    def up(self) -> bool:
        return self.last is not None and self.last.ok


class _Turn:
    """One target's scrapes one at a time; dropped once none is in flight or waiting (a lock
    kept per target keeps its waiters' deque, allocated among long-lived objects)."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


def usable_only(result: ScrapeResult) -> ScrapeResult:
    """Drop NaN, infinite and negative counter values: no counter has them, none is exposed."""
    snapshot = result.snapshot
    if snapshot is None:
        return result
    # A min and a sum in C: a NaN makes the sum NaN, a negative or -inf value the min, +inf
    # the sum; a sum that only overflows takes the slow path, which keeps every value.
    numbers = snapshot.values.values()
    if not numbers or (min(numbers) >= 0.0 and sum(numbers) < math.inf):
        return result
    values = {k: v for k, v in snapshot.values.items() if math.isfinite(v) and v >= 0}
    return replace(result, snapshot=replace(snapshot, values=values))


def resolve_names(asked: list[str], host_ports: Mapping[str, str],
                  window_id: str | None) -> list[str]:
    """Targets asked by name or host:port (`host_ports`: name -> host:port) as names, each
    once; else `UnknownTargetError`."""
    by_host_port = {host_port: name for name, host_port in host_ports.items()}
    chosen: dict[str, None] = {}
    for name in asked:
        found = name if name in host_ports else by_host_port.get(name)
        if found is None:
            raise UnknownTargetError(name, window_id, sorted(host_ports))
        chosen[found] = None
    return list(chosen)


def _log_state_change(name: str, state: TargetState, result: ScrapeResult) -> None:
    """Say once when a target goes down (with why) or comes back, not at every failed scrape."""
    if not result.ok and (state.last is None or state.up):
        log.warning("target down target=%s url=%s error=%s", name, state.config.display_url,
                    result.error)
    elif result.ok and state.last is not None and not state.up:
        log.info("target up target=%s url=%s after=%s", name, state.config.display_url,
                 state.last_error)


class Targets:
    """Target states by name; `version` changes with every state, `set_version` only when the
    set of targets or their configs (labels) change."""

    def __init__(self, config: Config, clock: Callable[[], float]):
        self.config = config
        self.clock = clock
        self.discovery = Discovery(config)
        self.scraper: Scraper | None = None  # set when the app's session starts
        self.states: dict[str, TargetState] = {}
        self.live: dict[str, LiveTrack] = {}
        self.version = 0
        self.set_version = 0
        self._turns: dict[str, _Turn] = {}  # per target, while it is scraped (`scrape`)
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Take a (re)loaded config: the targets it and discovery give that this shard owns."""
        self.config = config
        self.discovery.config = config
        if self.scraper is not None:
            self.scraper.reconfigure(
                max_bytes=config.max_response_bytes, concurrency=config.scrape_concurrency
            )
        self._rebuild()

    def _rebuild(self) -> None:
        config = self.config
        owned = [t for t in self.fleet().values()  # rendezvous hashing on the name (shards.py)
                 if config.shards <= 1 or owner(t.name, config.shards) == config.shard_index]
        old = self.states
        self.states = {
            t.name: replace(old[t.name], config=t) if t.name in old else TargetState(t)
            for t in owned
        }
        self.live = {t.name: self.live.get(t.name) or LiveTrack(config.live_window) for t in owned}
        if self.scraper is not None:  # close kept-alive sockets to targets that left
            self.scraper.forget(owned)
        for track in self.live.values():
            # Scrapes closer than half an interval (window markers') are thinned from the
            # track: its memory follows the scrape interval, not how often windows come.
            track.span, track.spacing = config.live_window, config.scrape_interval / 2
        self.version += 1
        self.set_version += 1

    async def refresh_discovery(self) -> bool:
        """Re-read discovery sources; whether the targets changed."""
        session = self.scraper.session if self.scraper else None
        if not await self.discovery.refresh(session, self.clock()):
            return False
        self._rebuild()
        log.info("discovery changed targets=%d", len(self.states))
        return True

    def fleet(self) -> dict[str, TargetConfig]:
        """Every target of the fleet by name, before the split into shards: static ones first,
        a discovered one with the same name does not replace it."""
        merged = {t.name: t for t in self.config.targets}
        for target in self.discovery.targets():
            merged.setdefault(target.name, target)
        return merged

    def gone_reason(self, name: str, why: str) -> str:
        """Why a target left: `why`, or the shard that scrapes it now (the shards changed)."""
        config = self.config
        if config.shards > 1 and name in self.fleet():
            return f"moved to shard {owner(name, config.shards)} of {config.shards}"
        return why

    def resolve(self, names: list[str] | None, window_id: str | None) -> list[TargetConfig]:
        """Targets by name or host:port (all when None), or `UnknownTargetError`."""
        if names is None:
            return [s.config for s in self.states.values()]
        host_ports = {name: s.config.host_port for name, s in self.states.items()}
        return [self.states[n].config for n in resolve_names(names, host_ports, window_id)]

    async def scrape(self, name: str, then: Callable[[ScrapeResult], None]) -> ScrapeResult:
        """Scrape one target now, record it, and hand the result to `then` before the next
        scrape of the same target may record its own."""
        assert self.scraper is not None, "scraper starts with the app"
        state = self.states.get(name)
        if state is None:  # a reload dropped it between the caller's look and this scrape
            return ScrapeResult(name, self.clock(), 0.0, None, "target removed from the config")
        turn = self._turns.get(name)
        if turn is None:
            turn = self._turns[name] = _Turn()
        turn.users += 1
        try:
            async with turn.lock:
                timeout = state.config.timeout or self.config.scrape_timeout
                result = await self.scraper.scrape(state.config, timeout, self.clock)
                if self._record(name, result):
                    then(result)
        finally:
            turn.users -= 1
            if not turn.users:
                del self._turns[name]
        return result

    def busy(self, name: str) -> bool:
        """A scrape of that target is in flight or waiting."""
        return name in self._turns

    def _record(self, name: str, result: ScrapeResult) -> bool:
        state = self.states.get(name)
        if state is None:  # removed by a reload while the scrape was in flight
            return False
        _log_state_change(name, state, result)
        if result.snapshot is not None:  # `ok`, spelled out so the type checker narrows
            # Windows and the live track see the page as it was (a NaN is their anomaly).
            self.states[name] = state.scraped(result)
            self.live[name].feed(result.snapshot, result.at)
        else:
            log.debug("scrape failed target=%s error=%s", name, result.error)
            self.states[name] = replace(
                state, last=result, errors_total=state.errors_total + 1,
                last_error=result.error, last_error_at=result.at,
            )
        self.version += 1
        return True
