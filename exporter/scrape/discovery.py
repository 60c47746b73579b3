"""Targets from `file_sd` files, `http_sd` URLs and `prometheus_sd`, re-read as they change.
`_META`'s labels set a target's keys, other `__` labels are dropped; a source that breaks
(whatever it sends) keeps its last good list."""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import ValidationError
from yarl import URL

from exporter.config.documents import DocumentError, parse_json, parse_yaml, read_text
from exporter.config.model import (
    _RESERVED_LABELS,
    Config,
    HttpSDConfig,
    PrometheusSDConfig,
    TargetConfig,
)
from exporter.config.values import parse_matcher
from exporter.core.errors import ExporterError
from exporter.core.redact import redact_text, redact_url
from exporter.core.text import TextError, clean_tree
from exporter.scrape.httpget import OverCap
from exporter.scrape.scraper import REDIRECTS, proxy_for, read_capped, with_proxy_headers

log = logging.getLogger(__name__)

MAX_SD_BYTES = 8 * 1024 * 1024
MAX_REDIRECTS = 5  # as the scrape path follows
_META = {"__scheme__": "scheme", "__metrics_path__": "path", "__specdec_name__": "name",
         "__specdec_dialect__": "dialect"}


class DiscoveryError(ExporterError):
    """A discovery source whose content cannot be used; the message says where and why."""


def targets_from_document(data: Any, source: str, refused: list[str]) -> list[TargetConfig]:
    """A parsed `[{targets, labels}]` document -> targets, or `DiscoveryError` naming the entry;
    a group whose text is not Unicode (a lone surrogate) is left out, its reason in `refused`."""
    if not isinstance(data, list):
        raise DiscoveryError(f"{source}: must be a list of {{targets, labels}} groups")
    found: list[TargetConfig] = []
    for index, group in enumerate(data):
        where = f"{source}: {index}"
        try:
            group = clean_tree(group, str(index))
        except TextError as exc:
            refused.append(f"{source}: {exc}")
            log.error("discovery entry refused source=%s error=%s", source, exc)
            continue
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise DiscoveryError(f"{where}: each group needs a `targets` list")
        labels = group.get("labels")
        labels = {} if labels is None else labels
        if not isinstance(labels, dict):
            raise DiscoveryError(f"{where}.labels: must be a mapping")
        fields = {key: labels[meta] for meta, key in _META.items() if meta in labels}
        plain = {k: str(v) for k, v in labels.items() if not str(k).startswith("__")}
        for position, address in enumerate(group["targets"]):
            host, sep, port = str(address).rpartition(":")
            if not sep or not port.isdigit():
                raise DiscoveryError(f"{where}.targets.{position}: want host:port, not {address!r}")
            try:
                found.append(TargetConfig(host=host.strip("[]"), port=int(port), labels=plain,
                                          **fields))
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function"))
                raise DiscoveryError(
                    f"{where}.targets.{position}: {loc + ': ' if loc else ''}"
                    f"{first['msg'].removeprefix('Value error, ')}"
                ) from None
    return found


def read_sd_file(path: Path, refused: list[str]) -> list[TargetConfig]:
    """One file_sd file: JSON, or YAML by its `.yml`/`.yaml` name."""
    try:
        text = read_text(path, MAX_SD_BYTES)
        data = parse_yaml(text) if path.suffix in (".yml", ".yaml") else parse_json(text)
    except DocumentError as exc:
        raise DiscoveryError(f"{path}: {str(exc).splitlines()[0]}") from None
    return targets_from_document(data, str(path), refused)


# Prometheus's own labels of a scrape: our `target` names the server, and the exporter's own
# job/instance must not be overwritten when Prometheus scrapes us with honor_labels.
_PROMETHEUS_OWN = {"job", "instance"}


def _matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        have = labels.get(name, "")
        if op == "=" and have != value or op == "!=" and have == value:
            return False
        if op in ("=~", "!~") and (re.fullmatch(value, have) is None) == (op == "=~"):
            return False
    return True


def targets_from_prometheus(data: Any, source: str, sd: PrometheusSDConfig) -> list[TargetConfig]:
    """A `/api/v1/targets` answer -> the active targets of `sd.job` matching `sd.matchers`,
    each with its scrape URL and its relabelled labels (`job`, `instance` and `__` ones aside)."""
    if not isinstance(data, dict) or data.get("status") != "success":
        raise DiscoveryError(f"{source}: not a successful Prometheus API answer")
    body = data.get("data")
    active = body.get("activeTargets") if isinstance(body, dict) else None
    if not isinstance(active, list):
        raise DiscoveryError(f"{source}: data.activeTargets must be a list")
    matchers = [parse_matcher(m) for m in sd.matchers]
    found: list[TargetConfig] = []
    for index, item in enumerate(active):
        if not isinstance(item, dict) or not isinstance(item.get("labels"), dict):
            raise DiscoveryError(f"{source}: activeTargets.{index}: needs a labels mapping")
        labels = {str(k): str(v) for k, v in item["labels"].items()}
        job = str(item.get("scrapePool") or labels.get("job", ""))
        if sd.job is not None and sd.job not in (job, labels.get("job")):
            continue
        if not _matches(labels, matchers):
            continue
        kept = {k: v for k, v in labels.items()
                if not k.startswith("__") and k not in _PROMETHEUS_OWN | _RESERVED_LABELS}
        try:
            found.append(TargetConfig(url=str(item.get("scrapeUrl", "")), labels=kept))
        except ValidationError as exc:
            first = exc.errors()[0]
            raise DiscoveryError(f"{source}: activeTargets.{index}: "
                                 f"{first['msg'].removeprefix('Value error, ')}") from None
    return found


@dataclass
class _Source:
    targets: list[TargetConfig] = field(default_factory=list)
    stamp: tuple[int, int] | float | None = None  # file mtime_ns/size, or the last poll's time
    error: str | None = None


class Discovery:
    """Keeps the discovered targets of every configured source fresh; cheap to call each round."""

    def __init__(self, config: Config):
        self.config = config
        self.sources: dict[str, _Source] = {}

    def targets(self) -> list[TargetConfig]:
        """Every discovered target, first source wins on a name clash."""
        seen: dict[str, TargetConfig] = {}
        for source in self.sources.values():
            for target in source.targets:
                seen.setdefault(target.name, target)
        return list(seen.values())

    def errors(self) -> dict[str, str]:
        """Source -> the reason its last read failed (its last good list is still used)."""
        return {redact_url(name): redact_text(s.error) for name, s in self.sources.items()
                if s.error}

    async def refresh(self, session: aiohttp.ClientSession | None, now: float) -> bool:
        """Re-read changed files and due URLs; whether the target list changed."""
        before = self.targets()
        live: set[str] = set()
        for file_sd in self.config.file_sd:
            for pattern in file_sd.files:
                for name in sorted(glob.glob(pattern)):
                    live.add(name)
                    await self._refresh_file(Path(name))
        polled: list[tuple[HttpSDConfig | PrometheusSDConfig, str, str]] = [
            (sd, sd.url, sd.url) for sd in self.config.http_sd]
        for prom_sd in self.config.prometheus_sd:
            api = prom_sd.url.rstrip("/") + "/api/v1/targets?state=active"
            polled.append((prom_sd, api + (f"&job={prom_sd.job}" if prom_sd.job else ""), api))
        for sd, name, url in polled:
            live.add(name)
            source = self.sources.setdefault(name, _Source())
            stamp = source.stamp
            due = stamp is None or isinstance(stamp, tuple) or now - stamp >= sd.refresh_interval
            if due and session is not None:
                source.stamp = now
                await self._load(source, name, "unusable answer",
                                 partial(self._get, session, sd, name, url))
        for gone in set(self.sources) - live:  # a deleted file takes its targets with it
            del self.sources[gone]
        return self.targets() != before

    async def _refresh_file(self, path: Path) -> None:
        source = self.sources.setdefault(str(path), _Source())
        try:
            stat = path.stat()
        except OSError:
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == source.stamp:
            return
        source.stamp = stamp
        await self._load(source, str(path), "unusable",
                         lambda refused: asyncio.to_thread(read_sd_file, path, refused))

    async def _load(self, source: _Source, name: str, unusable: str,
                    read: Callable[[list[str]], Awaitable[list[TargetConfig]]]) -> None:
        """Read a source's targets; whatever it holds or sends, a failure keeps its last list."""
        refused: list[str] = []
        try:
            targets = await read(refused)
            if len(targets) > self.config.max_targets:  # a source gone wild (a wrong glob)
                raise DiscoveryError(f"{name}: {len(targets)} targets is over max_targets "
                                     f"({self.config.max_targets})")
            source.targets = targets
            source.error = "; ".join(refused) or None
            return
        except DiscoveryError as exc:
            source.error = str(exc)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            source.error = f"{name}: {exc or type(exc).__name__}"
        except Exception as exc:
            source.error = f"{name}: {unusable}: {type(exc).__name__}: {exc}"[:500]
        log.error("discovery failed source=%s error=%s", name, source.error)

    async def _get(self, session: aiohttp.ClientSession, sd: HttpSDConfig | PrometheusSDConfig,
                   name: str, url: str, refused: list[str]) -> list[TargetConfig]:
        headers = dict(sd.headers)
        if sd.token_env and (token := os.environ.get(sd.token_env)):
            headers["Authorization"] = f"Bearer {token}"
        timeout = aiohttp.ClientTimeout(total=min(sd.refresh_interval, 30.0))
        start = at = URL(url)
        for _ in range(MAX_REDIRECTS + 1):
            # The session does not read the proxy environment per request (see make_session).
            proxy, proxy_headers = proxy_for(at, None)
            sent, proxy_headers = with_proxy_headers(at, headers, proxy_headers)
            async with session.get(at, headers=sent, timeout=timeout, proxy=proxy,
                                   proxy_headers=proxy_headers, allow_redirects=False) as response:
                location = response.headers.get("Location")
                if response.status in REDIRECTS and location:
                    at = at.join(URL(location, encoded=True))
                    if at.origin() != start.origin():
                        # Configured headers and the token are for the configured origin only.
                        headers = {}
                    continue
                if response.status != 200:
                    raise DiscoveryError(f"{name}: HTTP {response.status}")
                try:
                    body = await read_capped(response, MAX_SD_BYTES)
                except OverCap:
                    raise DiscoveryError(f"{name}: answer over {MAX_SD_BYTES} bytes") from None
            return await asyncio.to_thread(_parsed, body, name, sd, refused)
        raise DiscoveryError(f"{name}: over {MAX_REDIRECTS} redirects")


def _parsed(body: bytes, name: str, sd: HttpSDConfig | PrometheusSDConfig,
            refused: list[str]) -> list[TargetConfig]:
    """An answer's targets (run in a thread: a large answer is CPU the loop cannot lend)."""
    try:
        data = parse_json(body)
    except DocumentError as exc:
        raise DiscoveryError(f"{name}: {exc}") from None
    if isinstance(sd, PrometheusSDConfig):
        return targets_from_prometheus(data, name, sd)
    return targets_from_document(data, name, refused)
