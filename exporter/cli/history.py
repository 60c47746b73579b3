"""The `history` command: a window over a past range, from a Prometheus-compatible store."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from exporter.cli.common import EXIT_FAILED, EXIT_OK, one_line, say
from exporter.core.errors import ExporterError
from exporter.core.isotime import parse_time


def add_history(command: Callable[..., argparse.ArgumentParser]) -> None:
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
    p.add_argument("--token-env", metavar="VAR", help="bearer token from this variable")
    p.add_argument("--username", help="basic auth user (password from $SPECDEC_STORE_PASSWORD)")
    p.add_argument("--ca-file", metavar="FILE", help="CA bundle for an https store")
    p.add_argument("--tenant", help="X-Scope-OrgID (Mimir, Cortex)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per query (default 30)")
    p.set_defaults(func=cmd_history, parser=p)


def cmd_history(args: argparse.Namespace) -> int:
    from exporter.config.model import StoreAuth
    from exporter.core.console import format_window
    from exporter.core.history import history_answer
    from exporter.scrape.history import HistoryQuery, fetch_series
    from exporter.state.answertext import AnswerTexts
    from exporter.state.resultfiles import write_results

    try:
        frm, to = parse_time(args.frm), parse_time(args.to)
    except ValueError as exc:
        args.parser.error(f"--from/--to: {exc}")
    if frm >= to:
        args.parser.error("--from must be before --to")
    auth = StoreAuth(token_env=args.token_env, username=args.username,
                         password_env="SPECDEC_STORE_PASSWORD", ca_file=args.ca_file,
                         tenant=args.tenant)
    query = HistoryQuery(args.prometheus, frm, to, args.match, auth, timeout=args.timeout)
    try:
        read = fetch_series(query)
        answer = history_answer(read.series, frm, to, query_url=args.prometheus, by=args.by,
                                notes=read.notes)
    except ExporterError as exc:
        say(f"history: {one_line(exc)}")
        return EXIT_FAILED
    for note in read.notes:
        say(f"history: {note}")
    if args.output_dir:
        write_results(Path(args.output_dir), AnswerTexts.of(answer))
    print(json.dumps(answer, indent=2) + "\n" if args.json else format_window(answer), end="")
    return EXIT_OK
