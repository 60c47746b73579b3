"""Sub-commands, logging setup and exit codes."""

from __future__ import annotations

import logging
import os
import sys

from exporter.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, say
from exporter.cli.logformat import setup_logging
from exporter.cli.parser import build_parser
from exporter.core.errors import ExporterError, ListenError


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    try:
        return int(args.func(args))  # every cmd_* returns its exit code
    except BrokenPipeError:
        # The reader left (`demo | head`): quiet, and stdout to /dev/null, or the exit flush raises.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except ExporterError as exc:
        say(str(exc), level=logging.ERROR)
        return EXIT_USAGE if isinstance(exc, ListenError) else EXIT_FAILED
