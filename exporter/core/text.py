"""Text at the boundary: surrogate pairs joined (PyYAML does not), lone UTF-16 surrogates (JSON
and YAML let them through; no UTF-8 encoder takes them) refused with their place.
"""

from __future__ import annotations

import re
from typing import Any

from exporter.core.errors import ExporterError

_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


class TextError(ExporterError):
    """A string that is not Unicode text at `where`, its `.`-separated key path."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where or '(top)'}: {message}")


def _join(match: re.Match[str]) -> str:
    high, low = (ord(c) for c in match.group())
    return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))


def clean_text(text: str, where: str = "") -> str:
    """`text` with surrogate pairs joined as JSON parsers do; `TextError` for a lone one."""
    if _SURROGATE.search(text) is None:
        return text
    text = _PAIR.sub(_join, text)
    if lone := _SURROGATE.search(text):
        raise TextError(
            where,
            f"not valid Unicode text: lone UTF-16 surrogate \\u{ord(lone.group()):04x} "
            f"at character {lone.start()}",
        )
    return text


def clean_tree(data: Any, where: str = "") -> Any:
    """Every string (keys too) of a parsed JSON/YAML document through `clean_text`."""
    if isinstance(data, str):
        return clean_text(data, where)
    if isinstance(data, dict):
        return {
            clean_text(k, where) if isinstance(k, str) else k: clean_tree(v, _at(where, k))
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [clean_tree(v, _at(where, i)) for i, v in enumerate(data)]
    return data


def _at(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)
