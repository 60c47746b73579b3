"""The command line: one builder per sub-command, so each reads as its --help does."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from exporter import __version__
from exporter.cli.history import cmd_history
from exporter.cli.reports import cmd_advise, cmd_compare, draft_cost, speed_ratio
from exporter.cli.serving import cmd_check_config, cmd_demo, cmd_fake_vllm, cmd_serve
from exporter.cli.windows import cmd_measure, cmd_run, cmd_window_start, cmd_window_stop
from exporter.core.dialects import SIMULATED_DIALECTS

Command = Callable[..., argparse.ArgumentParser]


def _logging_options(parser: argparse.ArgumentParser, top: bool) -> None:
    # Defaults on the top parser only: `serve --log-level debug` and `--log-level debug serve`.
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
               "1 when a --fail-if-worse gate trips, 2 when the two cannot be compared.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    _logging_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, description: str | None = None,
                usage: str | None = None, parent: Any = sub) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(
            name, help=help_text, description=description or help_text, usage=usage)
        _logging_options(p, top=False)
        return p

    for add in (_serve, _check_config, _demo, _fake_vllm, _window, _run, _measure, _compare,
                _advise, _history):
        add(command)
    return parser


def _serve(command: Command) -> None:
    serve = command("serve", "run the exporter")
    serve.add_argument("--config",
                       help="YAML config file (default $SPECDEC_CONFIG, else config/exporter.yaml)")
    serve.add_argument("--listen", metavar="HOST:PORT",
                       help="address of the exporter's HTTP server; overrides the config's "
                            "listen and $SPECDEC_LISTEN")
    serve.set_defaults(func=cmd_serve)


def _check_config(command: Command) -> None:
    check = command("check-config", "validate a config file, listing every problem")
    check.add_argument("file", help="the YAML config file to check")
    check.add_argument("--allow-empty", action="store_true",
                       help="accept a file with no targets and no discovery")
    check.set_defaults(func=cmd_check_config)


def _demo(command: Command) -> None:
    demo = command("demo", "simulated servers plus the exporter, no network needed")
    demo.add_argument("--port", type=int, default=9400,
                      help="port of the exporter's page and /metrics on 127.0.0.1 (default 9400)")
    demo.add_argument("--duration", type=float,
                      help="seconds to run, then exit (default: until Ctrl-C)")
    demo.add_argument("--output-dir",
                      help="keep the window's results in this folder (default: a temporary "
                           "folder, removed at exit)")
    demo.set_defaults(func=cmd_demo)


def _fake_vllm(command: Command) -> None:
    fake = command("fake-vllm",
                   "a simulated vLLM server: /metrics with growing spec-decode counters and "
                   "an OpenAI-compatible /v1/completions and /v1/chat/completions")
    fake.add_argument("--host", default="127.0.0.1",
                      help="address to listen on (default 127.0.0.1)")
    fake.add_argument("--port", type=int, required=True, help="port to listen on")
    fake.add_argument("--k", type=int, default=3,
                      help="draft tokens proposed per step, the speculation length (default 3)")
    fake.add_argument("--acceptance", type=float, default=0.8,
                      help="0..1: chance that the first draft token is accepted; position i is "
                           "accepted with chance acceptance**(i+1) once i-1 was (default 0.8)")
    fake.add_argument("--engines", type=int, default=1,
                      help="data-parallel engines, each with its own counters (default 1)")
    fake.add_argument("--dialect", default="vllm", choices=list(SIMULATED_DIALECTS),
                      help="whose metric names the page uses, and whose per-request figures "
                           "the answers carry: sglang's sglext (asked with "
                           "return_spec_tokens_details), llamacpp's timings (default vllm)")
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
    fake.add_argument("--per-request-spec-decode-metrics", choices=["summary", "detailed"],
                      help="put vLLM's per-request metrics.speculative_decoding in each answer")
    fake.add_argument("--enable-per-request-metrics", action="store_true",
                      help="put vLLM's per-request timings (metrics.mean_itl_ms, "
                           "tokens_per_second, time_to_first_token_ms) in each answer")
    fake.add_argument("--step-ms", type=float, default=0.0,
                      help="milliseconds of one forward pass: answers take the time a server's "
                           "would (default 0: at once)")
    fake.add_argument("--name-filter", default="honour", choices=["honour", "empty", "ignore"],
                      help="what the prometheus_client route (vLLM's /metrics/, SGLang's "
                           "/metrics) does with ?name[]=: honour it, answer nothing as a "
                           "multiprocess registry does, or ignore it (default honour)")
    fake.add_argument("--seed", type=int, default=0,
                      help="random seed of the simulated acceptance (default 0)")
    fake.set_defaults(func=cmd_fake_vllm)


def _exporter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exporter", required=True, action="append", metavar="URL",
                   help="exporter base URL, e.g. http://127.0.0.1:9400 (http:// when no scheme "
                        "is given); repeat (or separate with commas) for the shards of one fleet")
    p.add_argument("--token", help="bearer token for the exporter (default $SPECDEC_TOKEN)")


def _window_args(p: argparse.ArgumentParser, bounds: str) -> None:
    p.add_argument("--id", help="window id to use (default: one made from the start time)")
    p.add_argument("--name", help="a name for the window, shown on its page and results")
    p.add_argument("--target", action="append", metavar="T",
                   help="only this target: config name or host:port (repeatable; "
                        "default every target)")
    p.add_argument("--label", action="append", metavar="KEY=VALUE",
                   help="a label of the window (repeatable)")
    p.add_argument("--edges", choices=["command", "traffic"], default="command",
                   help=f"what bounds the window: {bounds} (default), or the traffic"
                        " through the exporter's recording proxy (opened as the first "
                        "measured request arrives, closed on the counts right after the last "
                        "response)")
    p.add_argument("--skip-requests", type=int, default=None, metavar="N",
                   help="with --edges traffic: leave each model's first N requests out "
                        "(warm-up; AISBench's --num-warmups)")


def _allow_na(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-na", action="store_true",
                   help="exit 0 even when no target has a result (otherwise exit 3)")


def _window(command: Command) -> None:
    window = command("window", "start or stop a benchmark window on an exporter")
    wsub = window.add_subparsers(dest="window_command", required=True, metavar="start|stop")
    start = command("start", "open a window; prints its id",
                    "open a window; prints its id on stdout, failed targets on stderr", parent=wsub)
    _exporter_args(start)
    _window_args(start, "this start and the `window stop` of its id")
    _allow_na(start)
    start.set_defaults(func=cmd_window_start)
    stop = command("stop", "close a window; prints the console blocks",
                   "close a window; prints the console blocks on stdout, targets without a "
                   "result and where results were written on stderr", parent=wsub)
    _exporter_args(stop)
    stop.add_argument("id", help="the id printed by window start")
    stop.add_argument("--json", action="store_true",
                      help="print the whole stop answer as JSON instead of the blocks")
    _allow_na(stop)
    stop.set_defaults(func=cmd_window_stop)


def _run(command: Command) -> None:
    run = command("run", "open a window, run the command given after --, close the window",
                  usage="%(prog)s --exporter URL [options] -- CMD [ARGS...]")
    _exporter_args(run)
    _window_args(run, "the command's start and exit")
    run.add_argument("--require-window", action="store_true",
                     help="exit 1 without running the command when the window cannot open "
                          "(for CI: a mistyped --exporter fails the job)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                     help="the benchmark command, after --; run exits with its exit code")
    run.set_defaults(func=cmd_run, parser=run)


def _measure(command: Command) -> None:
    measure = command("measure",
                      "snapshot, run the command given after --, snapshot: no exporter needed",
                      usage="%(prog)s --target HOST:PORT|URL [options] -- CMD [ARGS...]")
    measure.add_argument("--target", action="append", default=[], metavar="HOST:PORT|URL",
                         help="a server to read (repeatable); a URL without a path gets /metrics")
    measure.add_argument("--model-config", metavar="FILE",
                         help="AISBench model config whose host_ip/host_port or url name the "
                              "servers")
    measure.add_argument("--work-dir", default=".", metavar="DIR",
                         help="each run's results go to a new DIR/YYYYMMDD_HHMMSS/performances/, "
                              "as AISBench names its runs (default .)")
    measure.add_argument("--interval", type=float, default=1.0,
                         help="seconds between scrapes while the command runs (default 1): "
                              "a server restart loses the window at most this span")
    measure.add_argument("--timeout", type=float, default=10.0,
                         help="seconds each scrape may take (default 10)")
    measure.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                         help="the benchmark command, after --; measure exits with its code")
    measure.set_defaults(func=cmd_measure, parser=measure)


def _compare(command: Command) -> None:
    compare = command(
        "compare", "is B better than A? per target and overall, with 95%% intervals",
        description="Compare two stopped windows (ids on --exporter) or two result folders "
                    "holding performances/spec_decode_*.json (ours or AISBench's). Exit 0, "
                    "1 when a --fail-if-worse or --fail-if-slower gate trips, 2 when they cannot "
                    "be compared.")
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
    compare.add_argument(
        "--fail-if-slower", nargs="?", const=1.0, type=speed_ratio, metavar="RATIO",
        help="A ran without speculative decoding, B with it: exit 1 when B's speed-up in "
             "tokens per second per request lies, with 95%% confidence, below RATIO (default "
             "1: B slower than A), per target and overall, not per concurrency band or tag; "
             "2 when the windows carry no timings")
    compare.set_defaults(func=cmd_compare)


def _advise(command: Command) -> None:
    advise = command(
        "advise", "which number of speculative tokens to run, from a stopped window",
        description="Expected tokens per step L(k') and speed-up S(k') = L / (1 + c k') for "
                    "k' = 1..2k (past k: a geometric-tail estimate), best k' per draft cost c.")
    advise.add_argument("window", metavar="WINDOW",
                        help="window id (with --exporter) or result folder")
    advise.add_argument("--exporter", help="exporter base URL: WINDOW is a window id on it")
    advise.add_argument("--token", help="bearer token (default $SPECDEC_TOKEN)")
    advise.add_argument("--draft-cost", action="append", type=draft_cost, metavar="C",
                        help="cost of drafting one token relative to one target forward pass "
                             "(repeatable; default 0, 0.05, 0.1, 0.25)")
    advise.add_argument("--baseline", metavar="A",
                        help="a window of the same server without speculative decoding: the "
                             "draft cost is measured from the two windows' timings (TPOT) "
                             "instead of assumed")
    advise.add_argument("--rank-by", default="speedup", choices=["speedup", "acceptance_rate"],
                        help="what ranks k (default speedup; acceptance_rate is refused, "
                             "saying why: it falls with k by arithmetic)")
    advise.add_argument("--json", action="store_true", help="print the advice as JSON")
    advise.set_defaults(func=cmd_advise)


def _history(command: Command) -> None:
    p = command("history", "a window over a past range, from the raw samples in Prometheus",
                description="Exact, reset-safe counts over [--from, --to] from the raw samples "
                            "a Prometheus-compatible store holds (never rate()/increase()).")
    p.add_argument("--prometheus", required=True, metavar="URL", help="the store's base URL")
    p.add_argument("--from", dest="frm", required=True, metavar="T",
                   help="start: ISO 8601, Unix seconds, now, or -30m (write --from=-30m)")
    p.add_argument("--to", required=True, metavar="T", help="end, as --from")
    p.add_argument("--match", action="append", default=[], metavar="SELECTOR",
                   help='label matchers, e.g. {job="vllm"} (repeatable: the union)')
    p.add_argument("--by", action="append", default=[], metavar="LABEL",
                   help="labels that name a target (default instance)")
    p.add_argument("--output-dir", metavar="DIR", help="write performances/ and window.json")
    p.add_argument("--json", action="store_true", help="print the window as JSON")
    _allow_na(p)
    p.add_argument("--token-env", metavar="VAR", help="bearer token from this variable")
    p.add_argument("--username", help="basic auth user (password from $SPECDEC_STORE_PASSWORD)")
    p.add_argument("--ca-file", metavar="FILE", help="CA bundle for an https store")
    p.add_argument("--tenant", help="X-Scope-OrgID (Mimir, Cortex)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per query (default 30)")
    p.set_defaults(func=cmd_history, parser=p)
