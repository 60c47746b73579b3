"""A pydantic error as a config problem line: `key.path: what is wrong`, the key as written."""

from __future__ import annotations

from typing import Any

from pydantic_core import ErrorDetails


def problem_line(error: ErrorDetails, data: Any) -> str:
    """One `key.path: what is wrong` line of a validation error over the document `data`."""
    return f"{_location(error, data)}: {_message(error)}"


_ALIASES = {"host": "host_ip", "port": "host_port", "scheme": "enable_ssl"}


def _location(error: ErrorDetails, data: Any) -> str:
    """The key path as the user wrote it: AISBench's `host_port`, not the `port` it became."""
    # pydantic puts validator names like "function-after[...]" in loc for model validators.
    parts = [str(part) for part in error["loc"] if not str(part).startswith("function-")]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(key := getattr(cause, "key", None), str):  # a whole-model check's own key
        parts.append(key)
    if len(parts) == 3 and parts[0] == "targets" and parts[1].isdigit() and parts[2] in _ALIASES:
        targets = data.get("targets") if isinstance(data, dict) else None
        raw = targets[int(parts[1])] if isinstance(targets, list) else None
        if isinstance(raw, dict) and _ALIASES[parts[2]] in raw:
            parts[2] = _ALIASES[parts[2]]
    return ".".join(parts) or "(top)"


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "field required"
    message = error["msg"].removeprefix("Value error, ")
    # pydantic's own checks say "Input should be ..."; match the voice of ours.
    if message.startswith("Input should be "):
        message = "must be " + message.removeprefix("Input should be ")
    return message
