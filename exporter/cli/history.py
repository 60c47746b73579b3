"""The `history` command: a window over a past range, from a Prometheus-compatible store."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.cli.common import EXIT_FAILED, EXIT_NO_RESULT, EXIT_OK, one_line, say
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
    p.add_argument("--allow-na", action="store_true",
                   help="exit 0 even when no target has a result (otherwise exit 3)")
    p.add_argument("--token-env", metavar="VAR", help="bearer token from this variable")
    p.add_argument("--username", help="basic auth user (password from $SPECDEC_STORE_PASSWORD)")
    p.add_argument("--ca-file", metavar="FILE", help="CA bundle for an https store")
    p.add_argument("--tenant", help="X-Scope-OrgID (Mimir, Cortex)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per query (default 30)")
    p.set_defaults(func=cmd_history, parser=p)


def _answer(args: argparse.Namespace, frm: float, to: float) -> dict[str, Any]:
    """The window the store's samples make; `ExporterError` when the store cannot give them."""
    from exporter.config.model import StoreAuth
    from exporter.core.storecount import history_answer
    from exporter.scrape.storequery import HistoryQuery, fetch_series

    auth = StoreAuth(token_env=args.token_env, username=args.username,
                     password_env="SPECDEC_STORE_PASSWORD", ca_file=args.ca_file,
                     tenant=args.tenant)
    query = HistoryQuery(args.prometheus, frm, to, args.match, auth, timeout=args.timeout)
    read = fetch_series(query)
    return history_answer(read.series, frm, to, query_url=args.prometheus, by=args.by,
                          notes=read.notes, scraped=read.scraped)


def cmd_history(args: argparse.Namespace) -> int:
    from exporter.core.console import format_window
    from exporter.core.isotime import iso_utc
    from exporter.scrape.storequery import check_range
    from exporter.state.answertext import AnswerTexts
    from exporter.state.resultfiles import write_results

    try:
        frm, to = parse_time(args.frm), parse_time(args.to)
        check_range(frm, to)
    except (ValueError, ExporterError) as exc:
        args.parser.error(f"--from/--to: {exc}")
    try:
        answer = _answer(args, frm, to)
    except ExporterError as exc:
        say(f"history: {one_line(exc)}")
        return EXIT_FAILED
    for note in answer["store_notes"]:
        say(f"history: {note}")
    if args.output_dir:
        write_results(Path(args.output_dir), AnswerTexts.of(answer))
    print(json.dumps(answer, indent=2) + "\n" if args.json else format_window(answer), end="")
    if args.allow_na or any(r["status"] == "ok" for r in answer["results"].values()):
        return EXIT_OK
    what = (f"{len(answer['results'])} target(s), none with spec-decode activity"
            if answer["results"] else "no spec-decode series")
    say(f"history: {what} between {iso_utc(frm)} and {iso_utc(to)} in the store at "
        f"{answer['query']} (--allow-na to accept that)")
    return EXIT_NO_RESULT
