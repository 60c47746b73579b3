"""Sub-commands, logging setup and exit codes."""

from __future__ import annotations

import json
import logging
import sys

from exporter.cli.common import EXIT_FAILED, EXIT_USAGE
from exporter.cli.parser import build_parser
from exporter.cli.serving import cmd_serve, env_overrides
from exporter.core.errors import ExporterError, ListenError

__all__ = ["build_parser", "cmd_serve", "env_overrides", "main"]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"ts": record.created, "level": record.levelname.lower(),
                           "logger": record.name, "msg": record.getMessage()})


def _setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
    access = logging.DEBUG if level == "debug" else logging.WARNING
    logging.getLogger("aiohttp.access").setLevel(access)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level, args.log_format)
    try:
        return int(args.func(args))  # every cmd_* returns its exit code
    except ListenError as exc:
        print(f"specdec-exporter: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ExporterError as exc:
        print(f"specdec-exporter: {exc}", file=sys.stderr)
        return EXIT_FAILED
