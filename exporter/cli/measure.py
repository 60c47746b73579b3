"""`measure`: AISBench's --spec-decode (snapshot, run, snapshot) without an exporter, scraping
while the command runs (a restart mid-run is counted); the command's exit code stands."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import logging
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from exporter.cli.common import say
from exporter.config.model import TargetConfig
from exporter.core.errors import ExporterError
from exporter.core.snapshot import ScrapeResult
from exporter.core.window import TargetRef, Window
from exporter.scrape.scraper import Scraper, make_session
from exporter.server.book import WindowBook
from exporter.server.windowstart import StartRequest
from exporter.state.store import StateStore

_AISBENCH_KEYS = ("host_ip", "host_port", "url", "enable_ssl")


def target_from_spec(spec: str) -> TargetConfig:
    """`host:port` or a URL -> target; a URL without a path gets `/metrics`."""
    if "://" in spec:
        scheme, rest = spec.split("://", 1)
        if "/" not in rest:
            spec = f"{scheme}://{rest}/metrics"
        return TargetConfig(url=spec)
    host, _, port = spec.rpartition(":")
    if not host or not port.isdigit():
        raise ExporterError(f"target {spec!r}: give host:port or a URL")
    return TargetConfig(host=host.strip("[]"), port=int(port))


def targets_from_model_config(path: str | Path) -> list[TargetConfig]:
    """Targets from an AISBench model config: Python (read by mmengine where installed, for
    its `read_base()` inheritance; else the file's literal `dict(...)` entries), or YAML/JSON."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        entries = _entries_from_data(text)
    else:
        read = _entries_from_mmengine(path)
        entries = read if read is not None else _entries_from_python(text)
    targets = []
    for entry in entries:
        if entry.get("host_ip") and entry.get("host_port"):
            targets.append(TargetConfig(host=str(entry["host_ip"]), port=int(entry["host_port"]),
                                        scheme="https" if entry.get("enable_ssl") else "http"))
        elif entry.get("url"):
            # AISBench's url is the inference endpoint; the metrics live at its server's root.
            scheme, rest = str(entry["url"]).split("://", 1)
            targets.append(target_from_spec(f"{scheme}://{rest.split('/', 1)[0]}"))
    if not targets:
        hint = (" (the config inherits through read_base(): install mmengine, e.g. pip "
                "install 'specdec-exporter[aisbench]', to read it)") if "read_base" in text else ""
        raise ExporterError(f"{path}: no model entry with host_ip/host_port or url{hint}")
    return targets


def _entries_from_mmengine(path: Path) -> list[dict[str, Any]] | None:
    """The config's `models` as mmengine evaluates them; None without mmengine."""
    try:
        from mmengine.config import Config  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        # Lazy import: AISBench's classes named in the config need not be importable here.
        config = Config.fromfile(str(path))
        models = config.get("models") or []
    except Exception as exc:  # mmengine raises whatever the config's code raises
        raise ExporterError(f"{path}: mmengine cannot read it: {exc}") from exc
    # Only the address keys: reading the others (`type=VLLMCustomAPIChat`) would import them.
    return [{key: model[key] for key in _AISBENCH_KEYS if key in model}
            for model in models if isinstance(model, Mapping)]


def distinct_names(targets: Sequence[TargetConfig]) -> list[TargetConfig]:
    """The same target given twice is one; two on one host:port get host:port + path names."""
    unique = list({t.url: t for t in targets}.values())
    seen = Counter(t.name for t in unique)
    return [t.model_copy(update={"name": t.host_port + urlsplit(t.url).path})
            if seen[t.name] > 1 else t for t in unique]


def _entries_from_python(text: str) -> list[dict[str, Any]]:
    entries = []
    for node in ast.walk(ast.parse(text)):
        fields: dict[str, Any] = {}
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
            pairs = [(k.arg, k.value) for k in node.keywords if k.arg]
        elif isinstance(node, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values, strict=True)
                     if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        else:
            continue
        for key, value in pairs:
            if key in _AISBENCH_KEYS:
                with contextlib.suppress(ValueError):
                    fields[key] = ast.literal_eval(value)
        if fields:
            entries.append(fields)
    return entries


def _entries_from_data(text: str) -> list[dict[str, Any]]:
    data = yaml.safe_load(text)  # YAML is a superset of JSON
    if isinstance(data, dict):
        data = data.get("models", [data])
    return [d for d in data or [] if isinstance(d, dict)]


async def run_command(cmd: Sequence[str]) -> int:
    """Run CMD, forwarding SIGINT/SIGTERM to it; its exit code (128+N when killed by signal N)."""
    loop = asyncio.get_running_loop()
    forwarded = (signal.SIGINT, signal.SIGTERM)
    # Caught from before the command starts: a Ctrl-C while it starts is the command's too
    # (else asyncio's own would end us, the command left running and the window open).
    early: list[int] = []
    process: asyncio.subprocess.Process | None = None

    def forward(sig: int) -> None:
        if process is None:
            early.append(sig)
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)

    for sig in forwarded:
        loop.add_signal_handler(sig, forward, sig)
    try:
        try:
            process = await asyncio.create_subprocess_exec(*cmd)
        except OSError as exc:
            say(f"cannot run {cmd[0]!r}: {exc.strerror or exc}", level=logging.ERROR,
                command=cmd[0], error=str(exc.strerror or exc))
            return 127
        for caught in early:
            forward(caught)
        code = await process.wait()
    finally:
        for sig in forwarded:
            loop.remove_signal_handler(sig)
    return code if code >= 0 else 128 - code


def run_folder(work_dir: Path, now: float) -> Path:
    """A new folder under `work_dir` named by the local time, as AISBench names its runs
    (`YYYYMMDD_HHMMSS`, `_2`... when taken): a reused work dir never mixes or loses runs."""
    work_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now))
    for n in range(1, 1000):
        folder = work_dir / (stamp if n == 1 else f"{stamp}_{n}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise ExporterError(f"{work_dir}: no free run folder for {stamp}")


async def measure(targets: Sequence[TargetConfig], cmd: Sequence[str], work_dir: Path, *,
                  interval: float = 1.0, timeout: float = 10.0
                  ) -> tuple[int, dict[str, Any] | None]:
    """Snapshot, run CMD while scraping every `interval`, snapshot; (CMD's code, answer)."""
    targets = distinct_names(targets)
    by_name = {t.name: t for t in targets}
    # The same window protocol as `serve`, over a book that keeps its state in memory only.
    book = WindowBook(StateStore(Path(":memory:")), time.time, lambda window_id: work_dir)
    async with make_session(len(targets) + 1) as session:
        scraper = Scraper(session, max_bytes=64 * 1024 * 1024, concurrency=32)

        async def scrape_one(name: str, others: list[Window],
                             then: Callable[[ScrapeResult], None] | None) -> ScrapeResult:
            result = await scraper.scrape(by_name[name], timeout)
            book.feed((w for w in others if w.takes_scrapes_of(result.target)), result)
            if then is not None:
                then(result)
            return result

        async def scrape(names: list[str], others: list[Window],
                         then: Callable[[ScrapeResult], None] | None = None
                         ) -> list[ScrapeResult]:
            return list(await asyncio.gather(*(scrape_one(n, others, then) for n in names)))

        async def keep_scraping() -> None:
            while True:
                await asyncio.sleep(interval)
                await scrape(list(by_name), book.open_windows())

        start = StartRequest("measure", "measure",
                             [TargetRef(t.name, t.url, t.host_port) for t in targets])
        await book.start(start, scrape, max_open=1)
        poller = asyncio.create_task(keep_scraping())
        try:
            code = await run_command(cmd)
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        window = await book.stop("measure", scrape)
        await scraper.close()
    book.close()
    return code, window.answer
