"""Sub-commands, logging setup and exit codes."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from exporter import __version__
from exporter.errors import ConfigError, ExporterError
from exporter.fakevllm import DIALECTS as FAKE_DIALECTS

if TYPE_CHECKING:  # imported where used, so each sub-command loads only what it needs
    from exporter.client import FleetClient
    from exporter.service import ExporterService

log = logging.getLogger("exporter")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"ts": record.created, "level": record.levelname.lower(),
                           "logger": record.name, "msg": record.getMessage()})


def _setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
    # Access logs only at debug.
    logging.getLogger("aiohttp.access").setLevel(
        logging.DEBUG if level == "debug" else logging.WARNING
    )


def _config_path(arg: str | None) -> str:
    return arg or os.environ.get("SPECDEC_CONFIG") or "config/exporter.yaml"


def env_overrides() -> dict[str, Any]:
    """Config keys set by the environment, kept across reloads (Helm sets these per replica).

    `SPECDEC_SHARDS`, `SPECDEC_SHARD_INDEX` (or the StatefulSet ordinal at the end of
    `SPECDEC_POD_NAME`) and `SPECDEC_LISTEN`.
    """
    overrides: dict[str, Any] = {}
    index = os.environ.get("SPECDEC_SHARD_INDEX")
    pod = os.environ.get("SPECDEC_POD_NAME")
    if index is None and pod and (match := re.search(r"-(\d+)$", pod)):
        index = match.group(1)
    if shards := os.environ.get("SPECDEC_SHARDS"):
        overrides["shards"] = shards
    if index is not None:
        overrides["shard_index"] = index
    if listen := os.environ.get("SPECDEC_LISTEN"):
        overrides["listen"] = listen
    return overrides


def cmd_check_config(args: argparse.Namespace) -> int:
    from exporter.config import load_config

    try:
        config = load_config(args.file, allow_empty=args.allow_empty)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem)
        return 1
    print(f"{args.file}: ok, {len(config.targets)} target(s)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from exporter.api import SERVICE
    from exporter.app import make_app
    from exporter.config import load_config
    from exporter.eventloop import new_event_loop
    from exporter.guard import run_guarded
    from exporter.redact import redact_logs

    path = _config_path(args.config)
    try:
        overrides = env_overrides()
        # At start an empty config is allowed (a Helm install before any target is set);
        # a reload to one is refused.
        config = load_config(path, overrides, allow_empty=True)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{path}: {problem}", file=sys.stderr)
        return 1
    app = make_app(config, config_path=path, overrides=overrides)
    redact_logs(lambda: app[SERVICE].config)  # before the first line that could quote one

    async def on_startup(app: web.Application) -> None:
        loop = asyncio.get_running_loop()
        reloads: set[asyncio.Task[None]] = set()  # held until done: the loop keeps weak references

        def on_hup() -> None:
            task = asyncio.ensure_future(_reload_on_signal(app[SERVICE]))
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, on_hup)

    app.on_startup.append(on_startup)
    host, _, port = config.listen.rpartition(":")
    loop = new_event_loop()
    log.info("starting version=%s listen=http://%s:%s/ targets=%d loop=%s", __version__, host,
             port, len(config.targets), type(loop).__module__.split(".")[0])
    # As web.run_app: SIGTERM/SIGINT finish in-flight requests, then the cleanup context
    # saves every open window; in front, the guard against slow and excess connections.
    run_guarded(app, host.strip("[]"), int(port), loop=loop,
                scrape_concurrency=config.scrape_concurrency,
                header_timeout=config.header_timeout,
                access_log=logging.getLogger("aiohttp.access"), shutdown_timeout=30.0)
    return 0


async def _reload_on_signal(service: ExporterService) -> None:
    from exporter.app import reload_config

    try:
        await reload_config(service)
    except ConfigError as exc:
        log.error("config reload refused problems=%s", "; ".join(exc.problems))


def cmd_fake_vllm(args: argparse.Namespace) -> int:
    from exporter.fakevllm import FakeServer, serve_fake_vllm

    server = FakeServer(k=args.k, acceptance=args.acceptance, engines=args.engines,
                        dialect=args.dialect, model_name=args.model_name, seed=args.seed,
                        spec_decode=not args.no_spec_decode, ngram=args.ngram)
    print(f"fake-vllm on http://{args.host}:{args.port}{server.metrics_path} k={args.k} "
          f"engines={args.engines} dialect={args.dialect}", flush=True)
    try:
        asyncio.run(serve_fake_vllm(args.host, args.port, server, args.drafts_per_second))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from exporter.demo import run_demo

    try:
        asyncio.run(run_demo(args.port, args.duration, args.output_dir))
    except KeyboardInterrupt:
        pass
    return 0


def _exporters(args: argparse.Namespace) -> list[str]:
    return [url for item in args.exporter for url in item.split(",") if url]


def _client(args: argparse.Namespace) -> FleetClient:
    # Several exporters (shards of one fleet) act as one: same window id, merged results.
    from exporter.client import FleetClient

    return FleetClient(_exporters(args), token=args.token)


def cmd_window_start(args: argparse.Namespace) -> int:
    from exporter.client import ClientError

    try:
        window = _client(args).start(args.id, args.name, args.target, _labels(args.label))
    except ClientError as exc:
        print(f"specdec-exporter: {exc}", file=sys.stderr)
        return 1
    print(window["id"])
    return 0


def cmd_window_stop(args: argparse.Namespace) -> int:
    from exporter.client import ClientError

    try:
        answer = _client(args).stop(args.id)
    except ClientError as exc:
        print(f"specdec-exporter: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer.body, indent=2) if args.json else answer.console(), end="")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from exporter.client import ClientError, unreachable_answer
    from exporter.console import format_window
    from exporter.measure import run_command

    cmd = _command(args)
    client = _client(args)
    window_id = None
    failure = None
    try:
        window_id = client.start(args.id, args.name, args.target, _labels(args.label))["id"]
    except ClientError as exc:
        failure = str(exc)
        print(f"specdec-exporter: no window recorded: {exc}", file=sys.stderr, flush=True)
    code = asyncio.run(run_command(cmd))
    if window_id is not None:
        try:
            print(client.stop(window_id).console(), end="", flush=True)
            return code
        except ClientError as exc:
            failure = f"{exc} (window {window_id} may still be open)"
    label = ",".join(_exporters(args))
    print(format_window(unreachable_answer(window_id, label, failure or "")), end="")
    return code


def cmd_measure(args: argparse.Namespace) -> int:
    from exporter.console import format_window
    from exporter.measure import measure, run_command, target_from_spec, targets_from_model_config

    cmd = _command(args)
    try:
        targets = [target_from_spec(spec) for spec in args.target]
        if args.model_config:
            targets += targets_from_model_config(args.model_config)
        if not targets:
            raise ExporterError("give --target HOST:PORT|URL or --model-config FILE")
    except (ExporterError, OSError, ValueError) as exc:
        # Collection is best-effort: the benchmark still runs.
        print(f"specdec-exporter: spec-decode collection off: {exc}", file=sys.stderr, flush=True)
        return asyncio.run(run_command(cmd))
    work_dir = Path(args.work_dir)
    code, answer = asyncio.run(
        measure(targets, cmd, work_dir, interval=args.interval, timeout=args.timeout)
    )
    if answer is not None:
        print(format_window(answer), end="")
        print(f"spec-decode results in {work_dir / 'performances'}")
    return code


def cmd_compare(args: argparse.Namespace) -> int:
    from exporter.compare import GateError, apply_gates, compare_answers, parse_gate
    from exporter.sources import SourceError, load_source
    from exporter.tables import format_comparison

    # 2 for anything that keeps the comparison from being made: a CI gate must not read a
    # typo or an unreachable exporter as a regression (1).
    try:
        gates = [parse_gate(text) for text in args.fail_if_worse]
        a = load_source(args.a, args.exporter, args.token)
        b = load_source(args.b, args.exporter, args.token)
    except (GateError, SourceError) as exc:
        print(f"specdec-exporter compare: {exc}", file=sys.stderr)
        return 2
    body = apply_gates({"a": a.label, "b": b.label} | compare_answers(a.answer, b.answer), gates)
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print(format_comparison(body), end="")
    return 1 if body["tripped"] else 0


def cmd_advise(args: argparse.Namespace) -> int:
    from exporter.advise import DEFAULT_COSTS, window_advice
    from exporter.sources import SourceError, load_source
    from exporter.tables import format_window_advice

    costs = args.draft_cost or list(DEFAULT_COSTS)
    try:
        source = load_source(args.window, args.exporter, args.token)
    except SourceError as exc:
        print(f"specdec-exporter advise: {exc}", file=sys.stderr)
        return 2
    body = window_advice(source.answer, costs)
    if args.json:
        print(json.dumps({"window": source.label} | body, indent=2))
    else:
        print(format_window_advice(source.label, body), end="")
    advised = [a for a in [*body["results"].values(), body["aggregate"]] if a and "error" not in a]
    return 0 if advised else 1


def _draft_cost(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1e6:
        raise argparse.ArgumentTypeError(f"{text!r}: a draft cost is a number >= 0")
    return value


def _command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise SystemExit("specdec-exporter: give the command to run after --")
    return cmd


def _labels(items: list[str] | None) -> dict[str, str]:
    labels = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"specdec-exporter: --label wants key=value, not {item!r}")
        labels[key] = value
    return labels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdec-exporter",
        description="Speculative-decoding counters of vLLM servers: live gauges and "
                    "benchmark windows.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="plain", choices=["plain", "json"])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the exporter")
    serve.add_argument("--config",
                       help="YAML config (default $SPECDEC_CONFIG or config/exporter.yaml)")
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser("check-config", help="validate a config file")
    check.add_argument("file")
    check.add_argument("--allow-empty", action="store_true",
                       help="accept a file with no targets and no discovery")
    check.set_defaults(func=cmd_check_config)

    demo = sub.add_parser("demo", help="simulated servers plus the exporter, no network needed")
    demo.add_argument("--port", type=int, default=9400)
    demo.add_argument("--duration", type=float, help="seconds to run (default: until Ctrl-C)")
    demo.add_argument("--output-dir", help="where window results go (default: a temp dir)")
    demo.set_defaults(func=cmd_demo)

    fake = sub.add_parser("fake-vllm", help="a simulated vLLM server with growing counters")
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--port", type=int, required=True)
    fake.add_argument("--k", type=int, default=3)
    fake.add_argument("--acceptance", type=float, default=0.8)
    fake.add_argument("--engines", type=int, default=1)
    fake.add_argument("--dialect", default="vllm", choices=list(FAKE_DIALECTS))
    fake.add_argument("--model-name", default="fake/llama-3-8b")
    fake.add_argument("--drafts-per-second", type=float, default=50.0)
    fake.add_argument("--ngram", action="store_true", help="drafts may be shorter than k")
    fake.add_argument("--no-spec-decode", action="store_true")
    fake.add_argument("--seed", type=int, default=0)
    fake.set_defaults(func=cmd_fake_vllm)

    def exporter_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--exporter", required=True, action="append",
                       help="exporter base URL, e.g. http://127.0.0.1:9400; repeat (or separate "
                            "with commas) for the shards of one fleet")
        p.add_argument("--token", help="bearer token (default $SPECDEC_TOKEN)")

    def window_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--id")
        p.add_argument("--name")
        p.add_argument("--target", action="append", help="target name or host:port (repeatable)")
        p.add_argument("--label", action="append", help="key=value label of the window")

    window = sub.add_parser("window", help="start or stop a benchmark window")
    wsub = window.add_subparsers(dest="window_command", required=True)
    start = wsub.add_parser("start", help="open a window; prints its id")
    exporter_args(start)
    window_args(start)
    start.set_defaults(func=cmd_window_start)
    stop = wsub.add_parser("stop", help="close a window; prints the console blocks")
    exporter_args(stop)
    stop.add_argument("id")
    stop.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    stop.set_defaults(func=cmd_window_stop)

    run = sub.add_parser("run", help="open a window, run CMD, close the window")
    exporter_args(run)
    window_args(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    run.set_defaults(func=cmd_run)

    measure = sub.add_parser("measure", help="snapshot, run CMD, snapshot: no exporter needed")
    measure.add_argument("--target", action="append", default=[], help="HOST:PORT or URL")
    measure.add_argument("--model-config", help="AISBench model config (host_ip/host_port/url)")
    measure.add_argument("--work-dir", default=".", help="results go to DIR/performances/")
    measure.add_argument("--interval", type=float, default=5.0,
                         help="seconds between scrapes while CMD runs")
    measure.add_argument("--timeout", type=float, default=10.0)
    measure.add_argument("cmd", nargs=argparse.REMAINDER)
    measure.set_defaults(func=cmd_measure)

    compare = sub.add_parser(
        "compare", help="is B better than A? per target and overall, with 95% intervals",
        description="Compare two stopped windows (ids on --exporter) or two result folders "
                    "holding performances/spec_decode_*.json (ours or AISBench's). Exit 0, "
                    "1 when a --fail-if-worse gate trips, 2 when they cannot be compared.")
    compare.add_argument("a", metavar="A", help="window id (with --exporter) or result folder")
    compare.add_argument("b", metavar="B", help="window id (with --exporter) or result folder")
    compare.add_argument("--exporter", help="exporter base URL: A and B are window ids on it")
    compare.add_argument("--token", help="bearer token (default $SPECDEC_TOKEN)")
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")
    compare.add_argument(
        "--fail-if-worse", action="append", default=[], metavar="METRIC=LIMIT",
        help="exit 1 when B is significantly worse than A by more than LIMIT: "
             "acceptance_length=2%% (relative) or acceptance_rate=1.5 (absolute, in the "
             "metric's unit); metrics: acceptance_rate, acceptance_length, position_<i>")
    compare.set_defaults(func=cmd_compare)

    advise = sub.add_parser(
        "advise", help="which number of speculative tokens to run, from a stopped window",
        description="Expected tokens per step L(k') and speed-up S(k') = L / (1 + c k') for "
                    "k' = 1..2k (past k: a geometric-tail estimate), best k' per draft cost c.")
    advise.add_argument("window", metavar="WINDOW",
                        help="window id (with --exporter) or result folder")
    advise.add_argument("--exporter", help="exporter base URL: WINDOW is a window id on it")
    advise.add_argument("--token", help="bearer token (default $SPECDEC_TOKEN)")
    advise.add_argument("--draft-cost", action="append", type=_draft_cost, metavar="C",
                        help="cost of drafting one token relative to one target forward pass "
                             "(repeatable; default 0, 0.05, 0.1, 0.25)")
    advise.add_argument("--json", action="store_true", help="print the advice as JSON")
    advise.set_defaults(func=cmd_advise)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level, args.log_format)
    try:
        code: int = args.func(args)  # every cmd_* returns its exit code
        return code
    except ExporterError as exc:
        print(f"specdec-exporter: {exc}", file=sys.stderr)
        return 1
