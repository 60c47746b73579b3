"""Bytes of a /metrics page -> `Snapshot` of the spec-decode families: the parser jumps from
one line starting with the dialect's prefix to the next by substring search, parsing only those.
"""

from __future__ import annotations

import ctypes
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

from exporter.core.dialects import (
    DIALECTS,
    Dialect,
    DialectSpec,
    Head,
    Labels,
    SampleKind,
)
from exporter.core.errors import ExporterError
from exporter.core.snapshot import Field, SeriesKey, Snapshot

# The detection probe: every dialect's prefix holds `spec_`, preceded by its namespace.
_PROBE = b"spec_"
_NAMESPACES = tuple(
    (spec.prefix[: spec.prefix.index(_PROBE)], dialect, spec) for dialect, spec in DIALECTS.items()
)


def detect_dialect(page: bytes) -> tuple[Dialect | None, int]:
    """The dialect of the first spec-decode name on the page and the start of its line."""
    at = page.find(_PROBE)
    while at >= 0:
        for namespace, dialect, spec in _NAMESPACES:
            begin = at - len(namespace)
            if (
                begin >= 0
                and page.startswith(spec.prefix, begin)
                and (begin == 0 or page[begin - 1] in b"\n \t")
            ):
                return dialect, page.rfind(b"\n", 0, begin) + 1
        at = page.find(_PROBE, at + len(_PROBE))
    return None, -1


# name="value" pairs; values may hold escaped quotes, backslashes, commas, spaces and `/`.
# The value pattern is unrolled, so that 100k-character values stay cheap.
_LABEL = re.compile(
    rb'[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*'
)
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPE = {"n": "\n", "\\": "\\", '"': '"'}


def _unescape(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    if "\\" not in text:
        return text
    return _ESCAPE.sub(lambda m: _UNESCAPE.get(m.group(1), "\\" + m.group(1)), text)


def parse_labels(line: bytes, start: int) -> tuple[dict[str, str], int] | None:
    """Labels from `{` at `start`; returns them and the index after `}`, or None if malformed."""
    labels: dict[str, str] = {}
    pos = start + 1
    while True:
        while pos < len(line) and line[pos] in b" \t":
            pos += 1
        if pos < len(line) and line[pos] == ord("}"):
            return labels, pos + 1
        match = _LABEL.match(line, pos)
        if match is None:
            return None
        name = match.group(1).decode()
        if name in labels:  # a repeated label name is invalid exposition, not "last one wins"
            return None
        labels[name] = _unescape(match.group(2))
        pos = match.end()
        # Labels are separated by commas (one trailing comma allowed): `{a="1"b="2"}` is bad.
        if pos < len(line) and line[pos] == ord(","):
            pos += 1
        elif pos >= len(line) or line[pos] != ord("}"):
            return None


_NAME_END = re.compile(rb"[{ \t]")
# Bound once: the page loop compares every line's kind (a member look-up costs a call each).
_GAUGE, _CREATED, _FIRST_CREATED = SampleKind.GAUGE, SampleKind.CREATED, SampleKind.FIRST_CREATED
_MAX_HEADS = 65536
_MAX_HEAD_BYTES = 1024


def _resolve_head(head: bytes, spec: DialectSpec) -> Head | None:
    """What a line's text before its value is (`Head`); None when it is not ours or bad."""
    cut = len(_NAME_END.split(head, maxsplit=1)[0])
    entry = spec.names.get(head[:cut])
    if entry is None:
        return None
    labels: dict[str, str] = {}
    rest_at = cut
    if cut < len(head) and head[cut] == ord("{"):
        parsed = parse_labels(head, cut)
        if parsed is None:
            return None
        labels, rest_at = parsed
    if head[rest_at:].strip():  # `_read` cuts a head at its last brace: nothing may follow
        return None
    name, (fld, kind) = head[:cut].decode(), entry
    if kind is SampleKind.GAUGE:
        pairs = tuple(sorted(labels.items()))
        return name, kind, pairs, max(map(len, _label_values(pairs)), default=0), -1
    key = _series_key(fld, labels, spec, kind)
    if key is None:
        return None
    return name, kind, key, max(map(len, _label_values(key)), default=0), key.position


def _label_values(key: SeriesKey | Labels) -> tuple[str, ...]:
    """The label values of a series or of a gauge's labels (what `label_value_length` bounds)."""
    if isinstance(key, SeriesKey):
        return (key.model_name, key.engine, *(v for _, v in key.extra))
    return tuple(v for _, v in key)


def _sample_value(rest: bytes) -> float | None:
    """The value of a line's rest (value and an optional timestamp), or None if malformed."""
    parts = rest.split()
    # Python's float() also takes `1_000`; the exposition format (and Go's parser) does not.
    if not 1 <= len(parts) <= 2 or b"_" in rest:
        return None
    try:
        numbers = [float(part) for part in parts]  # the timestamp must be a number too
    except ValueError:
        return None
    return numbers[0]


class PageLimitError(ExporterError):
    """A page over one of its target's limits: the scrape fails with this reason."""


@dataclass(frozen=True, slots=True)
class PageLimits:
    """Per-target bounds on a page, as Prometheus's `sample_limit`/`label_value_length_limit`:
    a hostile or broken server must not cost more than a real one."""

    series: int  # spec-decode series (counters and gauges) on one page
    label_value_length: int  # characters in any label value of a spec-decode series
    positions: int  # draft positions 0 .. positions-1


_NO_LIMITS = PageLimits(sys.maxsize, sys.maxsize, sys.maxsize)


def parse_page(
    page: bytes, dialect: Dialect | str = Dialect.VLLM, limits: PageLimits = _NO_LIMITS
) -> Snapshot:
    """The spec-decode series of a page, gauges averaged over their series; with `limits`, a
    page over one raises `PageLimitError`."""
    dialect = dialect if isinstance(dialect, Dialect) else Dialect(dialect)
    frm = 0
    if dialect is Dialect.AUTO:
        found, frm = detect_dialect(page)
        if found is None:
            return Snapshot({}, {}, {}, Dialect.AUTO.value, 0)
        dialect = found
    spec = DIALECTS[dialect]
    return _read(page, frm, spec, limits, dialect.value, read_running(page, spec.running))


def read_running(page: bytes, name: str) -> float | None:
    """The gauge `name`'s samples on `page` summed (over engines and models); None if none.
    A family's samples are one run of lines in the text formats: read until the run ends,
    not on to the page's end."""
    if not name:
        return None
    head = name.encode()
    at = 0 if page.startswith(head) else _next_line(page, b"\n" + head, 0)
    total: float | None = None
    while at >= 0:
        end = page.find(b"\n", at)
        if end < 0:
            break  # a cut-off last line, as `_read` drops it
        if page[at + len(head):at + len(head) + 1] in (b"{", b" ", b"\t"):
            close = page.rfind(b"}", at, end)
            value = _sample_value(page[close + 1 if close >= 0 else at + len(head):end])
            if value is not None and math.isfinite(value):
                total = (total or 0.0) + value
            at = end + 1 if page.startswith(head, end + 1) else -1
        elif total is None:  # another family whose name begins with ours: ours may follow
            at = _next_line(page, b"\n" + head, end)
        else:
            break
    return total


def _read(page: bytes, frm: int, spec: DialectSpec, limits: PageLimits,
          dialect: str, running: float | None) -> Snapshot:
    """The snapshot of every line from `frm` on that starts with the dialect's prefix (a hot
    loop: no call of ours but `_next_line` for a cached head with a plain value)."""
    values: dict[SeriesKey, float] = {}
    created: dict[SeriesKey, float] = {}
    gauge_series: dict[tuple[str, SeriesKey | Labels], float] = {}
    duplicates = 0
    is_v0 = False
    heads, v0_markers, needle = spec.heads, spec.v0_markers, b"\n" + spec.prefix
    max_positions, max_length = limits.positions, limits.label_value_length
    start = frm if page.startswith(spec.prefix, frm) else _next_line(page, needle, frm)
    while start >= 0:
        end = page.find(b"\n", start)
        if end < 0:
            # Every line of an exposition ends with a line feed; a last line without one
            # is a cut-off body, whose value may be cut too (`1234` read as `12`): drop it.
            break
        close = page.rfind(b"}", start, end)
        if close >= 0:  # a label value may hold spaces: the head ends at the last brace
            head, rest = page[start : close + 1], page[close + 1 : end]
        else:
            head, _, rest = page[start:end].rstrip().replace(b"\t", b" ").partition(b" ")
        start = _next_line(page, needle, end)
        try:
            resolved = heads[head]  # None: resolved, not ours
        except KeyError:
            resolved = _remember_head(head, spec)
        if resolved is None:
            continue
        # Nearly always " <number>": float() reads it whole; an underscore or a timestamp
        # takes the careful way.
        try:
            value = _sample_value(rest) if b"_" in rest else float(rest)
        except ValueError:
            value = _sample_value(rest)
        if value is None:
            continue
        name, kind, key, longest, position = resolved
        if position >= max_positions or longest > max_length or (
                len(values) + len(gauge_series) >= limits.series):
            _check_limits(limits, resolved, values, gauge_series)
        if name in v0_markers:
            is_v0 = True
        if kind is _GAUGE:
            if math.isfinite(value):
                gauge_series.setdefault((name, key), value)
            continue
        target = created if kind is _CREATED or kind is _FIRST_CREATED else values
        if key in target:
            duplicates += 1
            continue
        # Not a gauge, so `_resolve_head` made the key a SeriesKey.
        target[key] = value  # type: ignore[index]
    gauges = _gauge_means(gauge_series, spec.gauge_gate)
    return Snapshot(values, created, gauges, "vllm-v0" if is_v0 else dialect, duplicates,
                    running=running)


def _remember_head(head: bytes, spec: DialectSpec) -> Head | None:
    """`_resolve_head`, kept for the next scrape (bounded: odd pages cannot grow the cache)."""
    resolved = _resolve_head(head, spec)
    if len(spec.heads) < _MAX_HEADS and len(head) <= _MAX_HEAD_BYTES:
        spec.heads[head] = resolved
    return resolved


def _check_limits(limits: PageLimits, resolved: Head, values: Mapping[SeriesKey, float],
                  gauge_series: Mapping[tuple[str, SeriesKey | Labels], float]) -> None:
    """`PageLimitError` when this series would take the page over one of `limits`."""
    name, kind, key, longest, position = resolved
    if position >= limits.positions:  # -1 for a gauge
        raise PageLimitError(f"position {position} is over position_limit ({limits.positions})")
    if longest > limits.label_value_length:
        value = next(v for v in _label_values(key) if len(v) > limits.label_value_length)
        raise PageLimitError(
            f"a label value of {len(value)} characters is over "
            f"label_value_length_limit ({limits.label_value_length}): {value[:40]!r}...")
    if len(values) + len(gauge_series) >= limits.series and (
        key not in values and (name, key) not in gauge_series
        and kind is not _CREATED and kind is not _FIRST_CREATED
    ):
        raise PageLimitError(
            f"more than {limits.series} spec-decode series on the page (series_limit)")


def _gauge_means(
    series: dict[tuple[str, SeriesKey | Labels], float], gate: str | None
) -> dict[str, float]:
    if not series:  # vLLM V1 pages: counters only
        return {}
    if gate is not None:
        # Series of a rank that has measured nothing yet (gate at 0) are left out entirely.
        live = {labels for (name, labels), value in series.items() if name == gate and value > 0}
        series = {key: value for key, value in series.items() if key[1] in live}
    sums: dict[str, list[float]] = {}
    for (name, _), value in series.items():
        total = sums.setdefault(name, [0.0, 0])
        total[0] += value
        total[1] += 1
    return {name: total / count for name, (total, count) in sums.items()}


# A long `bytes.find` is slower than the C library's `memmem`, a short one cheaper than a ctypes
# call: the next spec-decode line is looked for near the last one by `find`, past that by
# `memmem`.
_NEAR = 1024


def _load_memmem() -> Callable[[int | None, int, bytes, int], int | None] | None:
    """The C library's `memmem`, or None where ctypes cannot reach one (`find` then)."""
    try:
        memmem = ctypes.CDLL(None).memmem  # the C library this interpreter runs on
    except (OSError, AttributeError, TypeError):  # pragma: no cover - not on Linux
        return None
    memmem.restype = ctypes.c_void_p
    memmem.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
    return cast(Callable[[int | None, int, bytes, int], int | None], memmem)


_MEMMEM = _load_memmem()


def _next_line(page: bytes, needle: bytes, frm: int) -> int:
    """Start of the first line after `frm` that `needle` (line feed, prefix) begins, or -1."""
    found = page.find(needle, frm, frm + _NEAR)
    if found < 0:
        found = _find_far(page, needle, frm + _NEAR - len(needle) + 1)
    return found + 1 if found >= 0 else -1


def _find_far(page: bytes, needle: bytes, frm: int) -> int:
    """`page.find(needle, frm)`, by `memmem` where there is one."""
    if _MEMMEM is None or frm >= len(page):
        return page.find(needle, frm)
    # The bytes' own buffer (no copy), alive as long as `page` is (typeshed does not know it).
    base = ctypes.cast(page, ctypes.c_void_p).value or 0  # type: ignore[arg-type]
    hit = _MEMMEM(base + frm, len(page) - frm, needle, len(needle))
    return -1 if hit is None else hit - base


def _series_key(fld: Field | None, labels: dict[str, str], spec: DialectSpec,
                kind: SampleKind) -> SeriesKey | None:
    assert fld is not None
    model = labels.pop("model_name", "")
    engine = labels.pop("engine", "")
    position = -1
    first = kind is SampleKind.FIRST or kind is _FIRST_CREATED
    if fld is Field.PER_POS or first:
        text = labels.pop(spec.position_label, "")
        # ASCII digits only: int() also takes " 3", "+3", "3_0" and non-ASCII digits.
        if not (text.isascii() and text.isdigit()):
            return None
        if first:
            if int(text) != 0:
                return None
        else:
            position = int(text)
    extra = tuple(sorted(labels.items())) if labels else ()
    return SeriesKey(fld, model, engine, position, extra)
