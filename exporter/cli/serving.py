"""The long-running sub-commands: serve, check-config, fake-vllm, demo."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from exporter import __version__
from exporter.cli.common import EXIT_USAGE, say
from exporter.cli.hints import with_hint
from exporter.core.errors import ConfigError, ListenError

if TYPE_CHECKING:
    from exporter.config.model import Config
    from exporter.server.service import ExporterService

log = logging.getLogger("exporter")


def env_overrides() -> dict[str, Any]:
    """Config keys set by the environment, kept across reloads (Helm sets these per replica)."""
    overrides: dict[str, Any] = {}
    index = os.environ.get("SPECDEC_SHARD_INDEX")
    pod = os.environ.get("SPECDEC_POD_NAME")
    if index is None and pod and (match := re.search(r"-(\d+)$", pod)):
        index = match.group(1)
    if shards := os.environ.get("SPECDEC_SHARDS"):
        overrides["shards"] = shards
    if peers := os.environ.get("SPECDEC_PEERS"):
        overrides["peers"] = [url.strip() for url in peers.split(",") if url.strip()]
    if index is not None:
        overrides["shard_index"] = index
    if listen := os.environ.get("SPECDEC_LISTEN"):
        overrides["listen"] = listen
    return overrides


def cmd_check_config(args: argparse.Namespace) -> int:
    from exporter.config.model import load_config

    try:
        config = load_config(args.file, allow_empty=args.allow_empty)
    except ConfigError as exc:
        for problem in exc.problems:
            print(with_hint(problem))
        return 1
    print(f"{args.file}: ok, {len(config.targets)} target(s); results in "
          f"{Path(config.output_dir).resolve()} (output_dir, relative to the working directory)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from exporter.config.model import load_config
    from exporter.state.lock import hold_state_dir, release_state_dir

    path = args.config or os.environ.get("SPECDEC_CONFIG") or "config/exporter.yaml"
    try:
        overrides = env_overrides()
        if args.listen:
            overrides["listen"] = args.listen  # the flag beats SPECDEC_LISTEN and the file
        # Empty is allowed at start (a Helm install before any target is set), not on a reload.
        config = load_config(path, overrides, allow_empty=True)
    except ConfigError as exc:
        for problem in exc.problems:
            # A bad --listen is the flag's fault, not the file's.
            key, _, what = problem.partition(": ")
            if args.listen and key == "listen":
                say(what, prefix="--listen", level=logging.ERROR, key="--listen")
            else:
                say(with_hint(problem), prefix=path, level=logging.ERROR, file=path, key=key)
        return 1
    host, _, port = config.listen.rpartition(":")
    state_dir = config.state_path.parent
    made = not state_dir.exists()
    lock = hold_state_dir(state_dir)
    try:
        # Before the first log line: a taken port is the one line that matters.
        _probe_listen(host.strip("[]"), int(port), config.listen)
        return _serve(config, path, overrides, host, port)
    finally:
        # A serve that never ran leaves nothing behind: not its lock, not a folder it made.
        release_state_dir(lock, state_dir, remove_directory=made)


def _serve(config: Config, path: str, overrides: dict[str, Any], host: str, port: str) -> int:
    from exporter.core.redact import redact_logs
    from exporter.server.eventloop import new_event_loop
    from exporter.server.memory import keep_big_blocks_apart
    from exporter.web.app import make_app
    from exporter.web.guard import run_guarded
    from exporter.web.handlers import SERVICE

    app = make_app(config, config_path=path, overrides=overrides)
    redact_logs(lambda: app[SERVICE].config)  # before the first line that could quote one
    keep_big_blocks_apart()  # a long-running server: freed stop texts go back to the system

    async def on_startup(app: web.Application) -> None:
        loop = asyncio.get_running_loop()
        reloads: set[asyncio.Task[None]] = set()  # held until done: the loop keeps weak references

        def on_hup() -> None:
            task = asyncio.ensure_future(_reload_on_signal(app[SERVICE]))
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, on_hup)

    app.on_startup.append(on_startup)
    loop = new_event_loop()
    log.info("starting version=%s listen=http://%s:%s/ targets=%d loop=%s", __version__, host,
             port, len(config.targets), type(loop).__module__.split(".")[0])
    # A relative output_dir is the working directory's, not the config file's: say where.
    log.info("results output_dir=%s", Path(config.output_dir).resolve())
    # Read per request, so setting the variable later needs no restart; say how it is now.
    if os.environ.get(config.auth.token_env):
        log.info("auth on: every POST needs the token of token_env=%s", config.auth.token_env)
    else:
        log.info("auth off: set %s to require a bearer token on every POST", config.auth.token_env)
    # As web.run_app (SIGTERM/SIGINT finish requests, then open windows are saved), guarded.
    try:
        run_guarded(app, host.strip("[]"), int(port), loop=loop,
                    scrape_concurrency=config.scrape_concurrency,
                    header_timeout=config.header_timeout,
                    access_log=logging.getLogger("aiohttp.access"), shutdown_timeout=30.0)
    except OSError as exc:
        raise ListenError(config.listen, exc, "--listen HOST:PORT") from None
    log.info("stopped: open windows saved")
    return 0


def _probe_listen(host: str, port: int, listen: str) -> None:
    """Raise ListenError now if the address cannot be bound (as aiohttp binds: SO_REUSEADDR)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise ListenError(listen, exc, "--listen HOST:PORT") from None


async def _reload_on_signal(service: ExporterService) -> None:
    from exporter.web.handlers import reload_config

    # A refused reload is logged by the service, for SIGHUP and POST /-/reload alike.
    with contextlib.suppress(ConfigError):
        await reload_config(service)


def cmd_fake_vllm(args: argparse.Namespace) -> int:
    from exporter.fakevllm import FakeServer, NameFilter, serve_fake_vllm

    try:
        server = FakeServer(k=args.k, acceptance=args.acceptance, engines=args.engines,
                            dialect=args.dialect, model_name=args.model_name, seed=args.seed,
                            spec_decode=not args.no_spec_decode, ngram=args.ngram,
                            per_request_metrics=args.per_request_spec_decode_metrics or "",
                            request_timing=args.enable_per_request_metrics,
                            step_seconds=args.step_ms / 1000)
    except ValueError as exc:
        say(str(exc), prefix="specdec-exporter fake-vllm", level=logging.ERROR)
        return EXIT_USAGE
    address = f"{args.host}:{args.port}"

    async def started() -> None:
        speculation = f"k={args.k}" if not args.no_spec_decode else "no spec decode"
        print(f"fake-vllm on http://{address}{server.metrics_path} {speculation} "
              f"engines={args.engines} dialect={args.dialect}; OpenAI API at "
              f"http://{address}/v1", flush=True)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_fake_vllm(args.host, args.port, server, args.drafts_per_second,
                                        on_started=started,
                                        name_filter=NameFilter(args.name_filter)))
    except OSError as exc:
        raise ListenError(address, exc, "--port P") from None
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from exporter.cli.demo import run_demo

    # `timeout`, `kill` and supervisors send SIGTERM: the same clean end as Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_demo(args.port, args.duration, args.output_dir))
    return 0

