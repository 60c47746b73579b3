"""The `history` command's time arguments and usage errors."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from exporter.cli.history import parse_time


def test_times_in_every_accepted_form() -> None:
    assert parse_time("now", now=1000.0) == 1000.0
    assert parse_time("-30m", now=10000.0) == 8200.0
    assert parse_time("-2h", now=10000.0) == 2800.0
    assert parse_time("1700000000") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20Z") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20") == 1700000000.0
    with pytest.raises(argparse.ArgumentTypeError, match="ISO 8601"):
        parse_time("yesterday")


def test_a_bad_range_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "exporter", "history", "--prometheus",
                           "http://127.0.0.1:1", "--from", "now", "--to=-1h"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--from must be before --to" in done.stderr
    done = subprocess.run([sys.executable, "-m", "exporter", "history", "--prometheus",
                           "http://127.0.0.1:1", "--from", "soon", "--to", "now"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
