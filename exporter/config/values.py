"""Scalar values of a config: durations, retention periods, label matchers, parsed and bounded."""

from __future__ import annotations

import math
import re
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# Longer than a week is a typo (h for m, a stray zero); asyncio's timers misbehave near inf.
MAX_DURATION = 7 * 24 * 3600.0


def parse_duration(value: Any) -> float:
    """`250ms`, `5s`, `1m`, `1h` or a number of seconds -> seconds; finite, positive, <= 7d."""
    if isinstance(value, bool):
        raise ValueError("must be a duration like 250ms, 5s or 1m")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT[match.group(2)]
    else:
        raise ValueError(f"must be a duration like 250ms, 5s or 1m, not {value!r}")
    if not math.isfinite(seconds):
        raise ValueError(f"must be a finite duration, not {value!r}")
    if seconds <= 0:
        raise ValueError("must be greater than 0")
    if seconds > MAX_DURATION:
        raise ValueError(f"must be at most 7 days ({MAX_DURATION:g}s), not {seconds:g}s")
    return seconds


_DAYS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*d\s*$")
MAX_RETENTION = 3650 * 24 * 3600.0  # ten years: past that, keep the result files instead


def parse_retention(value: Any) -> float:
    """`30d`, `12h`, `90m` ... or a number of seconds -> seconds; finite, positive, <= 3650d."""
    if isinstance(value, str) and (match := _DAYS.match(value)):
        seconds = float(match.group(1)) * 86400.0
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNIT[match.group(2)]
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(f"must be a duration like 30d, 12h or 90m, not {value!r}")
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_RETENTION:
        raise ValueError(f"must be greater than 0 and at most 3650d, not {value!r}")
    return seconds


_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*$')


def parse_matcher(text: str) -> tuple[str, str, str]:
    """`name="v"`, `name!="v"`, `name=~"re"`, `name!~"re"` -> (name, op, value); regexes checked."""
    match = _MATCHER.match(text)
    if match is None:
        raise ValueError(
            f'must be a label matcher like name="value" or name=~"regex", not {text!r}')
    name, op, value = match.groups()
    value = re.sub(r"\\(.)", r"\1", value)
    if op in ("=~", "!~"):
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{text!r}: bad regex: {exc}") from None
    return name, op, value


_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # RFC 9110's token


def header_name(value: str) -> str:
    """An HTTP header name as given, or ValueError saying the rule."""
    if not _HEADER_NAME.fullmatch(value):
        raise ValueError(f"must be an HTTP header name (letters, digits, - and !#$%&'*+.^_`|~), "
                         f"not {value!r}")
    return value


def not_a_bare_port(value: Any) -> Any:
    """A HOST:PORT value as given, or ValueError for a number."""
    # YAML reads `listen: 19420` as a number: say what to write, not "must be a valid string".
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(f'must be "HOST:PORT", not the port alone: e.g. "127.0.0.1:{value}" '
                         f'(loopback only) or "0.0.0.0:{value}" (every interface)')
    return value


def implied_url(value: Any) -> Any:
    """`host:port[/path]` as a target's url: `http://` implied, and `/metrics` without a path,
    as `--target` on the command line reads it."""
    if not isinstance(value, str) or "://" in value or not value:
        return value
    address, slash, path = value.partition("/")
    host, sep, port = address.rpartition(":")
    if not (sep and host and port.isdigit()):
        raise ValueError(f"must be an http:// or https:// URL, or host:port, not {value!r}")
    return f"http://{address}/{path}" if slash else f"http://{address}/metrics"
