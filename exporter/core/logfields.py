"""A log line's `event key=%s ...` message as an event and its fields, each value as given:
what `--log-format json` puts in keys of their own."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# A key is a word right after a space (or the start) and before `=`: `target=%s`, `error=x`.
_KEY = re.compile(r"(?:(?<=\s)|^)([a-z_][a-z0-9_]*)=")
_CONVERSION = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[diouxXeEfFgGcrsa%]")
_NUMERIC = {"d", "i", "u", "f", "F", "g", "G", "e", "E"}


def message_fields(fmt: Any, args: Any) -> tuple[str, dict[str, Any]]:
    """(event, {key: value}) of a `logging` message `fmt % args`: the text before the first
    `key=`, then each key's value; a lone `%d`/`%s` of a number stays a number. A message
    that does not split so is all event, without fields."""
    if not isinstance(fmt, str) or isinstance(args, Mapping):
        return _render(fmt, args), {}
    keys = list(_KEY.finditer(fmt))
    bounds = [0, *(k.start() for k in keys), len(fmt)]
    starts = [0, *(k.end() for k in keys)]
    values: list[Any] = []
    rest = list(args or ())
    try:
        for start, end in zip(starts, bounds[1:], strict=True):
            values.append(_value(fmt[start:end], rest))
    except (TypeError, ValueError):
        return _render(fmt, args), {}
    if rest:  # more arguments than conversions: logging would have said so; keep it whole
        return _render(fmt, args), {}
    event = str(values[0]).strip().rstrip(":")
    return event, {k.group(1): v for k, v in zip(keys, values[1:], strict=True)}


def _value(segment: str, rest: list[Any]) -> Any:
    """The segment rendered with as many of `rest`'s arguments as it converts (taken off)."""
    conversions = [c for c in _CONVERSION.findall(segment) if c != "%%"]
    if len(conversions) > len(rest):
        raise ValueError("fewer arguments than conversions")
    taken = [rest.pop(0) for _ in conversions]
    lone = segment.strip()
    if (len(taken) == 1 and lone == conversions[0] and lone[-1] in _NUMERIC | {"s"}
            and isinstance(taken[0], int | float) and not isinstance(taken[0], bool)):
        return taken[0]
    return (segment % tuple(taken) if conversions or "%%" in segment else segment).strip()


def _render(fmt: Any, args: Any) -> str:
    try:
        return str(fmt) % args if args else str(fmt)
    except (TypeError, ValueError):
        return str(fmt)
