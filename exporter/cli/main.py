"""Sub-commands, logging setup and exit codes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from exporter.core.dialects import SIMULATED_DIALECTS
from exporter.core.errors import ConfigError, ExporterError, ListenError

if TYPE_CHECKING:  # imported where used, so each sub-command loads only what it needs
    from exporter.client import FleetClient
    from exporter.server.service import ExporterService

log = logging.getLogger("exporter")

# Exit codes, documented in README's "Commands" section.
EXIT_OK = 0
EXIT_FAILED = 1  # the exporter unreachable or refusing; an invalid config
EXIT_USAGE = 2  # bad arguments; an address already in use
EXIT_NO_RESULT = 3  # every target failed at start, or none has a result at stop


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
    `SPECDEC_POD_NAME`), `SPECDEC_PEERS` (comma-separated shard URLs) and `SPECDEC_LISTEN`.
    """
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
            print(problem)
        return 1
    print(f"{args.file}: ok, {len(config.targets)} target(s)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from exporter.web.handlers import SERVICE
    from exporter.web.app import make_app
    from exporter.config.model import load_config
    from exporter.server.eventloop import new_event_loop
    from exporter.web.guard import run_guarded
    from exporter.server.memory import keep_big_blocks_apart
    from exporter.core.redact import redact_logs

    path = _config_path(args.config)
    try:
        overrides = env_overrides()
        if args.listen:
            overrides["listen"] = args.listen  # the flag beats SPECDEC_LISTEN and the file
        # At start an empty config is allowed (a Helm install before any target is set);
        # a reload to one is refused.
        config = load_config(path, overrides, allow_empty=True)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{path}: {problem}", file=sys.stderr)
        return 1
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
    host, _, port = config.listen.rpartition(":")
    loop = new_event_loop()
    log.info("starting version=%s listen=http://%s:%s/ targets=%d loop=%s", __version__, host,
             port, len(config.targets), type(loop).__module__.split(".")[0])
    _log_auth(config.auth.token_env)
    # As web.run_app: SIGTERM/SIGINT finish in-flight requests, then the cleanup context
    # saves every open window; in front, the guard against slow and excess connections.
    try:
        run_guarded(app, host.strip("[]"), int(port), loop=loop,
                    scrape_concurrency=config.scrape_concurrency,
                    header_timeout=config.header_timeout,
                    access_log=logging.getLogger("aiohttp.access"), shutdown_timeout=30.0)
    except OSError as exc:
        raise ListenError(config.listen, exc, "--listen HOST:PORT") from None
    log.info("stopped: open windows saved")
    return 0


def _log_auth(token_env: str) -> None:
    # Read per request, so setting the variable later needs no restart; say how it is now.
    if os.environ.get(token_env):
        log.info("auth on: every POST needs the token of token_env=%s", token_env)
    else:
        log.info("auth off: set %s to require a bearer token on every POST", token_env)


async def _reload_on_signal(service: ExporterService) -> None:
    from exporter.web.app import reload_config

    # A refused reload is logged by the service, for SIGHUP and POST /-/reload alike.
    with contextlib.suppress(ConfigError):
        await reload_config(service)


def cmd_fake_vllm(args: argparse.Namespace) -> int:
    from exporter.fakevllm import FakeServer, serve_fake_vllm

    try:
        server = FakeServer(k=args.k, acceptance=args.acceptance, engines=args.engines,
                            dialect=args.dialect, model_name=args.model_name, seed=args.seed,
                            spec_decode=not args.no_spec_decode, ngram=args.ngram)
    except ValueError as exc:
        print(f"specdec-exporter fake-vllm: {exc}", file=sys.stderr)
        return EXIT_USAGE
    address = f"{args.host}:{args.port}"

    async def started() -> None:
        print(f"fake-vllm on http://{address}{server.metrics_path} k={args.k} "
              f"engines={args.engines} dialect={args.dialect}; OpenAI API at "
              f"http://{address}/v1", flush=True)

    try:
        asyncio.run(serve_fake_vllm(args.host, args.port, server, args.drafts_per_second,
                                    on_started=started))
    except OSError as exc:
        raise ListenError(address, exc, "--port P") from None
    except KeyboardInterrupt:
        pass
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from exporter.cli.demo import run_demo

    try:
        asyncio.run(run_demo(args.port, args.duration, args.output_dir))
    except KeyboardInterrupt:
        pass
    return 0


def _exporters(args: argparse.Namespace) -> list[str]:
    urls = [url.strip() for item in args.exporter for url in item.split(",") if url.strip()]
    # `--exporter 127.0.0.1:9400` means what it says: plain HTTP, as everywhere else here.
    return [url if "://" in url else f"http://{url}" for url in urls]


def _client(args: argparse.Namespace) -> FleetClient:
    # Several exporters (shards of one fleet) act as one: same window id, merged results.
    from exporter.client import FleetClient

    return FleetClient(_exporters(args), token=args.token)


def _say(message: str) -> None:
    print(f"specdec-exporter: {message}", file=sys.stderr, flush=True)


def _say_start_failures(started: dict[str, Any]) -> bool:
    """Name each target whose start scrape failed; True when every target failed."""
    failed = started.get("start_errors") or {}
    for name, reason in failed.items():
        _say(f"target {name} failed at window start: {reason}")
    for url, reason in (started.get("errors") or {}).items():
        _say(f"exporter {url} did not open the window: {reason}")
    targets = started.get("targets") or []
    return bool(targets) and all(name in failed for name in targets)


def _say_stop_failures(answer: dict[str, Any]) -> bool:
    """Name each target without a result and why; True when no target has one."""
    results = answer.get("results") or {}
    for name, result in results.items():
        if result.get("status") != "ok":
            _say(f"target {name}: no result: {result.get('error') or 'unknown reason'}")
    for url, reason in (answer.get("errors") or {}).items():
        _say(f"exporter {url} did not stop the window: {reason}")
    return not any(r.get("status") == "ok" for r in results.values())


def _say_written(answer: dict[str, Any]) -> None:
    where = answer.get("results_dir")
    if where:
        print(f"results written to {where}", file=sys.stderr, flush=True)


def cmd_window_start(args: argparse.Namespace) -> int:
    from exporter.client import ClientError

    try:
        window = _client(args).start(args.id, args.name, args.target, _labels(args.label))
    except ClientError as exc:
        _say(str(exc))
        return EXIT_FAILED
    print(window["id"], flush=True)
    if _say_start_failures(window) and not args.allow_na:
        _say(f"every target of window {window['id']} failed at start (it stays open; "
             "--allow-na to accept that)")
        return EXIT_NO_RESULT
    return EXIT_OK


def cmd_window_stop(args: argparse.Namespace) -> int:
    from exporter.client import ClientError

    try:
        answer = _client(args).stop(args.id)
    except ClientError as exc:
        _say(str(exc))
        return EXIT_FAILED
    print(json.dumps(answer.body, indent=2) if args.json else answer.console(), end="")
    _say_written(answer.body)
    if _say_stop_failures(answer.body) and not args.allow_na:
        _say(f"window {args.id} has no result for any target (--allow-na to accept that)")
        return EXIT_NO_RESULT
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from exporter.client import ClientError, unreachable_answer
    from exporter.core.console import format_window
    from exporter.cli.measure import run_command

    cmd = _command(args)
    client = _client(args)
    window_id = None
    failure = None
    try:
        started = client.start(args.id, args.name, args.target, _labels(args.label))
        window_id = started["id"]
        _say(f"window {window_id} started")
        _say_start_failures(started)
    except ClientError as exc:
        failure = str(exc)
        _say(f"no window recorded: {exc}")
    code = asyncio.run(run_command(cmd))
    if window_id is not None:
        try:
            answer = client.stop(window_id)
        except ClientError as exc:
            failure = f"{exc} (window {window_id} may still be open)"
        else:
            print(answer.console(), end="", flush=True)
            _say_written(answer.body)
            if _say_stop_failures(answer.body):
                _say(f"window {window_id} has no result")
            return code
    _say(f"window has no result: {failure}")
    label = ",".join(_exporters(args))
    print(format_window(unreachable_answer(window_id, label, failure or "")), end="")
    return code


def cmd_measure(args: argparse.Namespace) -> int:
    from exporter.core.console import format_window
    from exporter.cli.measure import measure, target_from_spec, targets_from_model_config

    cmd = _command(args)
    try:
        targets = [target_from_spec(spec) for spec in args.target]
        if args.model_config:
            targets += targets_from_model_config(args.model_config)
    except (ExporterError, OSError, ValueError) as exc:
        # A target we cannot even parse is a mistake in the command line: say so before the
        # benchmark runs, not after it.
        args.parser.error(f"--target/--model-config: {_one_line(exc)}")
    if not targets:
        args.parser.error("give --target HOST:PORT|URL or --model-config FILE")
    work_dir = Path(args.work_dir)
    code, answer = asyncio.run(
        measure(targets, cmd, work_dir, interval=args.interval, timeout=args.timeout)
    )
    if answer is not None:
        print(format_window(answer), end="")
        print(f"spec-decode results in {work_dir / 'performances'}")
    return code


def cmd_compare(args: argparse.Namespace) -> int:
    from exporter.analysis.compare import GateError, apply_gates, compare_answers, parse_gate
    from exporter.cli.sources import SourceError, load_source
    from exporter.cli.tables import format_comparison

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
    from exporter.analysis.advise import DEFAULT_COSTS, window_advice
    from exporter.cli.sources import SourceError, load_source
    from exporter.cli.tables import format_window_advice

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


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        args.parser.error("give the command to run after --, e.g. -- ais_bench --models ...")
    return cmd


def _labels(items: list[str] | None) -> dict[str, str]:
    labels = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"specdec-exporter: --label wants key=value, not {item!r}")
        labels[key] = value
    return labels


def _logging_options(parser: argparse.ArgumentParser, top: bool) -> None:
    # On the top parser they carry the defaults; on sub-commands they default to "not given",
    # so `specdec-exporter serve --log-level debug` and `--log-level debug serve` both work.
    default = {"level": "info", "format": "plain"} if top else {}
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        default=default.get("level", argparse.SUPPRESS),
                        help="what to log on stderr (default info; debug adds access logs)")
    parser.add_argument("--log-format", choices=["plain", "json"],
                        default=default.get("format", argparse.SUPPRESS),
                        help="plain text lines, or one JSON object per line (default plain)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdec-exporter",
        description="Speculative-decoding counters of vLLM servers: live gauges and "
                    "benchmark windows.",
        epilog="exit codes: 0 ok; 1 exporter unreachable or refusing, invalid config; "
               "2 usage error or address in use; 3 no result (window start/stop, unless "
               "--allow-na). run and measure exit with the command's own code; compare exits "
               "1 when a --fail-if-worse gate trips.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    _logging_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, description: str | None = None,
                usage: str | None = None) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=description or help_text,
                           usage=usage)
        _logging_options(p, top=False)
        return p

    serve = command("serve", "run the exporter")
    serve.add_argument("--config",
                       help="YAML config file (default $SPECDEC_CONFIG, else "
                            "config/exporter.yaml)")
    serve.add_argument("--listen", metavar="HOST:PORT",
                       help="address of the exporter's HTTP server; overrides the config's "
                            "listen and $SPECDEC_LISTEN")
    serve.set_defaults(func=cmd_serve)

    check = command("check-config", "validate a config file, listing every problem")
    check.add_argument("file", help="the YAML config file to check")
    check.add_argument("--allow-empty", action="store_true",
                       help="accept a file with no targets and no discovery")
    check.set_defaults(func=cmd_check_config)

    demo = command("demo", "simulated servers plus the exporter, no network needed")
    demo.add_argument("--port", type=int, default=9400,
                      help="port of the exporter's page and /metrics on 127.0.0.1 "
                           "(default 9400)")
    demo.add_argument("--duration", type=float,
                      help="seconds to run, then exit (default: until Ctrl-C)")
    demo.add_argument("--output-dir",
                      help="keep the window's results in this folder (default: a temporary "
                           "folder, removed at exit)")
    demo.set_defaults(func=cmd_demo)

    fake = command("fake-vllm",
                   "a simulated vLLM server: /metrics with growing spec-decode counters and "
                   "an OpenAI-compatible /v1/completions and /v1/chat/completions")
    fake.add_argument("--host", default="127.0.0.1",
                      help="address to listen on (default 127.0.0.1)")
    fake.add_argument("--port", type=int, required=True, help="port to listen on")
    fake.add_argument("--k", type=int, default=3,
                      help="draft tokens proposed per step, the speculation length (default 3)")
    fake.add_argument("--acceptance", type=float, default=0.8,
                      help="0..1: chance that the first draft token is accepted; position i "
                           "is accepted with chance acceptance**(i+1) once i-1 was "
                           "(default 0.8)")
    fake.add_argument("--engines", type=int, default=1,
                      help="data-parallel engines, each with its own counters (default 1)")
    fake.add_argument("--dialect", default="vllm", choices=list(SIMULATED_DIALECTS),
                      help="whose metric names the page uses (default vllm)")
    fake.add_argument("--model-name", default="fake/llama-3-8b",
                      help="the model_name label, and the model the OpenAI API serves")
    fake.add_argument("--drafts-per-second", type=float, default=50.0,
                      help="background traffic in drafts per second; 0 for counters that grow "
                           "only with the OpenAI requests and /control/add (default 50)")
    fake.add_argument("--ngram", action="store_true",
                      help="drafts may be shorter than k, as with n-gram speculation")
    fake.add_argument("--no-spec-decode", action="store_true",
                      help="serve a page without spec-decode series, as a server without "
                           "speculation does")
    fake.add_argument("--seed", type=int, default=0,
                      help="random seed of the simulated acceptance (default 0)")
    fake.set_defaults(func=cmd_fake_vllm)

    def exporter_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--exporter", required=True, action="append", metavar="URL",
                       help="exporter base URL, e.g. http://127.0.0.1:9400 (http:// when no "
                            "scheme is given); repeat (or separate with commas) for the "
                            "shards of one fleet")
        p.add_argument("--token", help="bearer token for the exporter (default $SPECDEC_TOKEN)")

    def window_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--id", help="window id to use (default: one made from the start time)")
        p.add_argument("--name", help="a name for the window, shown on its page and results")
        p.add_argument("--target", action="append", metavar="T",
                       help="only this target: config name or host:port (repeatable; "
                            "default every target)")
        p.add_argument("--label", action="append", metavar="KEY=VALUE",
                       help="a label of the window (repeatable)")

    def allow_na(p: argparse.ArgumentParser) -> None:
        p.add_argument("--allow-na", action="store_true",
                       help="exit 0 even when no target has a result (otherwise exit 3)")

    window = command("window", "start or stop a benchmark window on an exporter")
    wsub = window.add_subparsers(dest="window_command", required=True, metavar="start|stop")
    start = wsub.add_parser("start", help="open a window; prints its id",
                            description="open a window; prints its id on stdout, failed "
                                        "targets on stderr")
    _logging_options(start, top=False)
    exporter_args(start)
    window_args(start)
    allow_na(start)
    start.set_defaults(func=cmd_window_start)
    stop = wsub.add_parser("stop", help="close a window; prints the console blocks",
                           description="close a window; prints the console blocks on stdout, "
                                       "targets without a result and where results were "
                                       "written on stderr")
    _logging_options(stop, top=False)
    exporter_args(stop)
    stop.add_argument("id", help="the id printed by window start")
    stop.add_argument("--json", action="store_true",
                      help="print the whole stop answer as JSON instead of the blocks")
    allow_na(stop)
    stop.set_defaults(func=cmd_window_stop)

    run = command("run", "open a window, run the command given after --, close the window",
                  usage="%(prog)s --exporter URL [options] -- CMD [ARGS...]")
    exporter_args(run)
    window_args(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                     help="the benchmark command, after --; run exits with its exit code")
    run.set_defaults(func=cmd_run, parser=run)

    measure = command("measure",
                      "snapshot, run the command given after --, snapshot: no exporter needed",
                      usage="%(prog)s --target HOST:PORT|URL [options] -- CMD [ARGS...]")
    measure.add_argument("--target", action="append", default=[], metavar="HOST:PORT|URL",
                         help="a server to read (repeatable); a URL without a path gets "
                              "/metrics")
    measure.add_argument("--model-config", metavar="FILE",
                         help="AISBench model config whose host_ip/host_port or url name the "
                              "servers")
    measure.add_argument("--work-dir", default=".", metavar="DIR",
                         help="results go to DIR/performances/ (default .)")
    measure.add_argument("--interval", type=float, default=5.0,
                         help="seconds between scrapes while the command runs (default 5)")
    measure.add_argument("--timeout", type=float, default=10.0,
                         help="seconds each scrape may take (default 10)")
    measure.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                         help="the benchmark command, after --; measure exits with its code")
    measure.set_defaults(func=cmd_measure, parser=measure)

    compare = command(
        "compare", "is B better than A? per target and overall, with 95%% intervals",
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

    advise = command(
        "advise", "which number of speculative tokens to run, from a stopped window",
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
    except ListenError as exc:
        print(f"specdec-exporter: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ExporterError as exc:
        print(f"specdec-exporter: {exc}", file=sys.stderr)
        return EXIT_FAILED
