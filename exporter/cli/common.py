"""What the sub-commands share: exit codes, the stderr voice, the exporter flags' readers."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used, so each sub-command loads only what it needs
    from exporter.client import FleetClient

# Exit codes, documented in README's "Commands" section.
EXIT_OK = 0
EXIT_FAILED = 1  # the exporter unreachable or refusing; an invalid config
EXIT_USAGE = 2  # bad arguments; an address already in use
EXIT_NO_RESULT = 3  # every target failed at start, or none has a result at stop


def exporter_urls(args: argparse.Namespace) -> list[str]:
    from exporter.client import exporter_base_url

    return [exporter_base_url(url) for item in args.exporter for url in item.split(",")
            if url.strip()]


def fleet_client(args: argparse.Namespace) -> FleetClient:
    # Several exporters (shards of one fleet) act as one: same window id, merged results.
    from exporter.client import FleetClient

    return FleetClient(exporter_urls(args), token=args.token)


def say(message: str, *, prefix: str = "specdec-exporter", level: int = logging.INFO,
        **fields: Any) -> None:
    """A message on stderr: `prefix: message`, or under `--log-format json` a JSON line with
    `fields` as keys of their own."""
    from exporter.cli.logformat import json_messages, say_json

    if json_messages():
        say_json(message, level, fields)
    else:
        print(f"{prefix}: {message}" if prefix else message, file=sys.stderr, flush=True)


def one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def benchmark_command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.cmd)[1:] if args.cmd[:1] == ["--"] else list(args.cmd)
    if not cmd:
        args.parser.error("give the command to run after --, e.g. -- ais_bench --models ...")
    return cmd


def window_labels(items: list[str] | None) -> dict[str, str]:
    labels = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"specdec-exporter: --label wants key=value, not {item!r}")
        labels[key] = value
    return labels

