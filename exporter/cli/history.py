"""The `history` command: a window over a past range, from a Prometheus-compatible store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from exporter.cli.common import EXIT_FAILED, EXIT_NO_RESULT, EXIT_OK, one_line, say
from exporter.core.errors import ExporterError
from exporter.core.isotime import parse_time


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
