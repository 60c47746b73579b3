"""`json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)`, the same bytes, faster.

Result files are indented as AISBench writes them. On Python < 3.14 the stdlib encodes an
indented document in pure Python generators (~0.7 s for a 1000-target window.json); this
recursive writer gives the same text about 3x faster: containers of scalars only (per-position
rates, counters, speed-ups: most values) go to the C encoder with the separators of their level,
and `Encoded` reuses a value's text already encoded (each result file inside window.json)
instead of encoding it twice.
`tests/test_jsontext.py` checks it against `json.dumps` on real answers and odd values.
"""

from __future__ import annotations

import json.encoder
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring  # the C version when available
from operator import itemgetter
from typing import Any

_float_repr = float.__repr__
_int_repr = int.__repr__
_INF = float("inf")
# Exact types whose text the C encoder gives as `json.dumps` does (subclasses take the long way).
_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})
# The stdlib's C encoder; None without the `_json` accelerator (then the long way).
_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_NEWLINES = ["\n" + "  " * level for level in range(32)]
_LEAF_ENCODERS: dict[int, Callable[[Any, int], Any]] = {}
_KEYS: dict[str, str] = {}  # a key's text and ": " (a few dozen distinct keys, met 100,000 times)
_MAX_KEYS = 10_000
_CONSTANTS = {True: "true", False: "false", None: "null"}
_RECORDS: dict[tuple[Any, ...], str] = {}  # a list of records' template, by shape
_MAX_RECORDS = 256


class Encoded:
    """A value's text from `pretty` at nesting level 0, to be placed inside a bigger document."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


def pretty(value: Any) -> str:
    """The text `json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)` gives.

    `Encoded` values anywhere inside are written as their text, re-indented to their level.
    """
    out: list[str] = []
    _write(value, 0, out)
    return "".join(out)


def _float(value: float) -> str:
    if value != value or value in (_INF, -_INF):
        raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
    return _float_repr(value)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return encode_basestring(key)
    if key is True:
        return '"true"'
    if key is False:
        return '"false"'
    if key is None:
        return '"null"'
    if isinstance(key, int):
        return '"' + _int_repr(key) + '"'
    if isinstance(key, float):
        return '"' + _float(key) + '"'
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _indent(level: int) -> str:
    return _NEWLINES[level] if level < len(_NEWLINES) else "\n" + "  " * level


def _leaves_encoder(level: int) -> Callable[[Any, int], Any]:
    """The C encoder writing a container of scalars at `level` (items one per line)."""
    encoder = _LEAF_ENCODERS.get(level)
    if encoder is None:
        encoder = _LEAF_ENCODERS[level] = _MAKE_ENCODER(
            None, _refuse, encode_basestring, None, ": ", "," + _indent(level), False, False,
            False,
        )
    return encoder


def _scalars_only(values: Iterable[Any]) -> bool:
    """Every value's exact type one the C encoder writes as `json.dumps` does (at C speed)."""
    return _MAKE_ENCODER is not None and _SCALARS.issuperset(map(type, values))


def _refuse(value: Any) -> None:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# Scalars' texts in one call, split on a character no JSON text has raw (strings escape it).
_LEAF_TEXTS: Any = _MAKE_ENCODER and _MAKE_ENCODER(
    None, _refuse, encode_basestring, None, ": ", "\x00", False, False, False)


def _write(value: Any, level: int, out: list[str]) -> None:
    kind = type(value)
    if kind is dict:
        if not value:
            out.append("{}")
            return
        inner = _indent(level + 1)
        if _scalars_only(value.values()) and _scalars_only(value):
            # Only scalars inside: the C encoder writes it (same text, a fraction of the time).
            body = "".join(_leaves_encoder(level + 1)(value, 0))
            out.append("{" + inner + body[1:-1] + _indent(level) + "}")
            return
        separator = "{" + inner
        for key, item in value.items():
            text = _KEYS.get(key) if type(key) is str else None
            if text is None:
                text = _key(key) + ": "
                if type(key) is str and len(_KEYS) < _MAX_KEYS:
                    _KEYS[key] = text
            item_kind = type(item)
            if item_kind is float and -_INF < item < _INF:
                out.append(separator + text + _float_repr(item))
            elif item_kind is int:
                out.append(separator + text + _int_repr(item))
            elif item_kind is str:
                out.append(separator + text + encode_basestring(item))
            elif item_kind is bool or item is None:
                out.append(separator + text + _CONSTANTS[item])
            else:
                out.append(separator + text)
                _write(item, level + 1, out)
            separator = "," + inner
        out.append(_indent(level) + "}")
    elif kind is list or kind is tuple:
        if not value:
            out.append("[]")
            return
        inner = _indent(level + 1)
        if _scalars_only(value):
            body = "".join(_leaves_encoder(level + 1)(value, 0))
            out.append("[" + inner + body[1:-1] + _indent(level) + "]")
            return
        if type(value[0]) is dict and len(value) > 1:
            records = _records(value, level)
            if records is not None:
                out.append(records)
                return
        separator = "[" + inner
        for item in value:
            out.append(separator)
            separator = "," + inner
            _write(item, level + 1, out)
        out.append(_indent(level) + "]")
    elif isinstance(value, str):
        out.append(encode_basestring(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(_int_repr(value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, dict):
        _write(dict(value), level, out)
    elif isinstance(value, list | tuple):
        _write(list(value), level, out)
    elif isinstance(value, Encoded):
        out.append(value.text.replace("\n", _indent(level)) if level else value.text)
    else:
        _refuse(value)


def _records(rows: list[Any] | tuple[Any, ...], level: int) -> str | None:
    """A list of records alike (the advisor's rows: 2k per target, most of a window.json), or
    None for any other list.

    Alike: dicts with the same keys in the same order, scalars first, then dicts of scalars
    with the same keys. Every value goes to the C encoder in one call and into a template made
    once per shape: a fraction of the time a row takes the long way.
    """
    first = rows[0]
    keys = tuple(first)
    kinds = [type(first[key]) for key in keys]
    scalars = sum(1 for kind in kinds if kind in _SCALARS)
    if _MAKE_ENCODER is None or not (0 < scalars < len(keys)) or not all(
            kind is dict for kind in kinds[scalars:]) or not _STR.issuperset(map(type, keys)):
        return None
    nested = keys[scalars:]
    inner_keys = tuple(tuple(first[key]) for key in nested)
    if not all(_STR.issuperset(map(type, names)) for names in inner_keys):
        return None  # (keys of other rows equal to these are str too: str == 1 is never true)
    take = itemgetter(*keys[:scalars]) if scalars > 1 else lambda row: (row[keys[0]],)
    leaves: list[Any] = []
    for row in rows:
        if type(row) is not dict or tuple(row) != keys:
            return None
        leaves.extend(take(row))
        for key, expected in zip(nested, inner_keys, strict=True):
            inner = row[key]
            if type(inner) is not dict or tuple(inner) != expected:
                return None
            leaves.extend(inner.values())
    if not _scalars_only(leaves):
        return None
    shape = (level, len(rows), keys, inner_keys)
    template = _RECORDS.get(shape)
    if template is None:
        if len(_RECORDS) >= _MAX_RECORDS:
            _RECORDS.clear()
        template = _RECORDS[shape] = _records_template(shape, scalars)
    texts = "".join(_LEAF_TEXTS(leaves, 0))[1:-1].split("\x00")
    return template % tuple(texts)


def _records_template(shape: tuple[int, int, tuple[str, ...], tuple[tuple[str, ...], ...]],
                      scalars: int) -> str:
    """The text of the records with `%s` for each value (a literal `%` doubled)."""
    level, count, keys, inner_keys = shape

    def key(name: str) -> str:
        return encode_basestring(name).replace("%", "%%") + ": "

    at = _indent(level + 2)
    fields = [key(name) + "%s" for name in keys[:scalars]]
    for name, names in zip(keys[scalars:], inner_keys, strict=True):
        deeper = _indent(level + 3)
        body = ("," + deeper).join(key(n) + "%s" for n in names)
        fields.append(key(name) + ("{" + deeper + body + at + "}" if names else "{}"))
    row = "{" + at + ("," + at).join(fields) + _indent(level + 1) + "}"
    inner = _indent(level + 1)
    return "[" + inner + ("," + inner).join([row] * count) + _indent(level) + "]"
