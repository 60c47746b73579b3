"""The sub-commands of a benchmark window: window start/stop, run, measure."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.cli.common import (
    EXIT_FAILED,
    EXIT_NO_RESULT,
    EXIT_OK,
    EXIT_USAGE,
    benchmark_command,
    exporter_urls,
    fleet_client,
    one_line,
    say,
    window_labels,
)
from exporter.core.errors import ExporterError

if TYPE_CHECKING:
    from exporter.client import FleetClient


def _say_start_failures(started: dict[str, Any]) -> bool:
    """Name each target whose start scrape failed; True when every target failed."""
    failed = started.get("start_errors") or {}
    for name, reason in failed.items():
        say(f"target {name} failed at window start: {reason}", level=logging.WARNING,
            target=name, error=reason)
    for url, reason in (started.get("errors") or {}).items():
        say(f"exporter {url} did not open the window: {reason}", level=logging.WARNING,
            exporter=url, error=reason)
    targets = started.get("targets") or []
    return bool(targets) and all(name in failed for name in targets)


def _say_stop_failures(answer: dict[str, Any]) -> bool:
    """Name each target without a result and why; True when no target has one."""
    results = answer.get("results") or {}
    for name, result in results.items():
        if result.get("status") != "ok":
            reason = result.get("error") or "unknown reason"
            say(f"target {name}: no result: {reason}", level=logging.WARNING, target=name,
                error=reason)
    for url, reason in (answer.get("errors") or {}).items():
        say(f"exporter {url} did not stop the window: {reason}", level=logging.WARNING,
            exporter=url, error=reason)
    return not any(r.get("status") == "ok" for r in results.values())


def _edges(args: argparse.Namespace) -> dict[str, Any]:
    """The start's edges options; --skip-requests without --edges traffic is a usage error."""
    skip = args.skip_requests
    if skip is not None and (args.edges != "traffic" or skip < 0):
        say("--skip-requests needs --edges traffic" if args.edges != "traffic"
            else "--skip-requests must be 0 or more")
        raise SystemExit(EXIT_USAGE)
    return {"edges": args.edges, "skip_requests": skip}


def _say_waiting(started: dict[str, Any]) -> None:
    if started.get("edges") == "traffic" and started.get("started_at") is None:
        skip = started.get("skip_requests") or 0
        say(f"window {started['id']} opens at request {skip + 1} through the exporter's "
            "proxy (--edges traffic): point the benchmark at the target's proxy port")


def _say_written(answer: dict[str, Any]) -> None:
    """Where the results were written, and the window's edges when the traffic set them."""
    if where := answer.get("results_dir"):
        say(f"results written to {where}", prefix="", results_dir=where)
    edges = answer.get("edges")
    if isinstance(edges, dict):
        say(f"window edges: the traffic, {edges.get('skipped')} request(s) skipped, "
            f"{edges.get('measured_requests')} measured, from {edges.get('first_request_at_iso')}"
            f" to {edges.get('last_response_at_iso')}; closed by {edges.get('ended_by')}")


def cmd_window_start(args: argparse.Namespace) -> int:
    # A ClientError is main's to say (exit 1), as for every sub-command.
    window = fleet_client(args).start(args.id, args.name, args.target, window_labels(args.label),
                                      **_edges(args))
    print(window["id"], flush=True)
    _say_waiting(window)
    if not window.get("created", True):
        say(f"window {window['id']} already open: this start changed nothing")
    if _say_start_failures(window) and not args.allow_na:
        say(f"every target of window {window['id']} failed at start; it stays open: close it "
            f"with `specdec-exporter window stop --allow-na --exporter URL {window['id']}` "
            "(--allow-na to accept that)")
        return EXIT_NO_RESULT
    return EXIT_OK


def _stopped_before(client: FleetClient, window_id: str) -> float | None:
    """When the window was stopped, if it was before this stop (its answer is the same)."""
    from exporter.client import ClientError

    try:
        stopped_at = client.clients[0].get(window_id).get("stopped_at")
    except ClientError:
        return None  # the stop itself says what is wrong
    return stopped_at if isinstance(stopped_at, int | float) else None


def cmd_window_stop(args: argparse.Namespace) -> int:
    from exporter.core.isotime import iso_utc

    client = fleet_client(args)
    earlier = _stopped_before(client, args.id)
    answer = client.stop(args.id)
    print(json.dumps(answer.body, indent=2) if args.json else answer.console(), end="")
    if earlier is None:
        _say_written(answer.body)
    else:
        say(f"window {args.id} was already stopped at {iso_utc(earlier)}: nothing written now; "
            f"its results are in {answer.body.get('results_dir')}", window=args.id,
            stopped_at=iso_utc(earlier))
    if _say_stop_failures(answer.body) and not args.allow_na:
        say(f"window {args.id} has no result for any target (--allow-na to accept that)")
        return EXIT_NO_RESULT
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from exporter.cli.measure import run_command
    from exporter.client import ClientError

    cmd = benchmark_command(args)
    if shutil.which(cmd[0]) is None:
        # A command that cannot start would record an empty window: record none.
        say(f"cannot run {cmd[0]!r}: no such command; no window recorded")
        return 127
    client = fleet_client(args)
    try:
        started = client.start(args.id, args.name, args.target, window_labels(args.label),
                               **_edges(args))
    except ClientError as exc:
        if args.require_window:
            say(f"{exc}; not running the command (--require-window)")
            return EXIT_FAILED
        # Best effort, as AISBench's collection: the benchmark runs, said once, no N/A block.
        say(f"no window recorded: {exc}; running the command anyway (--require-window to "
            "refuse)", level=logging.WARNING, exporter=",".join(exporter_urls(args)),
            error=str(exc))
        return asyncio.run(run_command(cmd))
    window_id = started["id"]
    say(f"window {window_id} started", window=window_id)
    _say_waiting(started)
    _say_start_failures(started)
    code = asyncio.run(run_command(cmd))
    try:
        answer = client.stop(window_id)
    except ClientError as exc:
        say(f"window {window_id} has no result: {exc} (it may still be open)",
            level=logging.WARNING, window=window_id, error=str(exc))
        return code
    print(answer.console(), end="", flush=True)
    _say_written(answer.body)
    if _say_stop_failures(answer.body):
        say(f"window {window_id} has no result")
    return code


def cmd_measure(args: argparse.Namespace) -> int:
    from exporter.cli.measure import (
        measure,
        run_folder,
        target_from_spec,
        targets_from_model_config,
    )
    from exporter.core.console import format_window

    cmd = benchmark_command(args)
    try:
        targets = [target_from_spec(spec) for spec in args.target]
        if args.model_config:
            targets += targets_from_model_config(args.model_config)
    except (ExporterError, OSError, ValueError) as exc:
        # A target we cannot parse is a command-line mistake: said before the benchmark runs.
        args.parser.error(f"--target/--model-config: {one_line(exc)}")
    if not targets:
        args.parser.error("give --target HOST:PORT|URL or --model-config FILE")
    try:
        work_dir = run_folder(Path(args.work_dir), time.time())
    except (ExporterError, OSError) as exc:
        args.parser.error(f"--work-dir: {one_line(exc)}")
    code, answer = asyncio.run(
        measure(targets, cmd, work_dir, interval=args.interval, timeout=args.timeout)
    )
    if answer is not None:
        print(format_window(answer), end="")
        print(f"spec-decode results in {work_dir / 'performances'}")
        if _say_stop_failures(answer):
            say("measure has no result for any target (the command's exit code stands)")
    return code
