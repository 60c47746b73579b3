"""Documents from outside (the config file, discovery files and answers) read within limits of
size, depth and count of values, checked before anything walks them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

MAX_DEPTH = 64  # a config or a target group is a handful of levels deep
# Values reached by a walk, an alias once per use.
MAX_VALUES = 1_000_000


class DocumentError(ValueError):
    """A document that cannot be used; the message says why (without where: the caller's)."""


def check_bounds(data: Any) -> None:
    """`DocumentError` when `data` is over `MAX_DEPTH` or `MAX_VALUES`; walked without recursion."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    values = 0
    while stack:
        value, depth = stack.pop()
        values += 1
        if values > MAX_VALUES:
            raise DocumentError(f"over {MAX_VALUES} values (YAML aliases count at each use)")
        if depth > MAX_DEPTH:
            raise DocumentError(f"nested over {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)


def parse_json(text: str | bytes) -> Any:
    """JSON text -> data within the bounds, or `DocumentError`."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise DocumentError("nested too deeply to read") from None
    except ValueError as exc:
        raise DocumentError(f"not valid JSON: {exc}") from None
    check_bounds(data)
    return data


def parse_yaml(text: str) -> Any:
    """YAML text -> data within the bounds, or `DocumentError` (`invalid YAML at line L...`)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc)
        raise DocumentError(f"invalid YAML at {where}: {problem}") from None
    except RecursionError:
        raise DocumentError("nested too deeply to read") from None
    check_bounds(data)
    return data


def read_text(path: Path, max_bytes: int) -> str:
    """A file's UTF-8 text, `DocumentError` when unreadable, over `max_bytes` or not UTF-8."""
    try:
        with open(path, "rb") as file:
            raw = file.read(max_bytes + 1)
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise DocumentError(f"over {max_bytes} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}") from None
