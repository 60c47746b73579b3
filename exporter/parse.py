"""Bytes of a /metrics page -> `Snapshot` of the spec-decode families, without parsing the rest.

vLLM pages are 0.1-5 MB, nearly all histograms we do not need. Instead of a full exposition
parser (prometheus_client reads ~4 MB/s) we jump from one line starting with the dialect's
prefix to the next with `bytes.find`, which runs at memory speed, and parse only those lines.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import StrEnum

from exporter.snapshot import Field, SeriesKey, Snapshot


class Dialect(StrEnum):
    """Metric naming schemes we understand, picked per target."""

    VLLM = "vllm"  # V1 names; V0 names on the same prefix are recognised too
    LLAMACPP = "llamacpp"  # llama.cpp server: vLLM V1's schema under `llamacpp:`


@dataclass(frozen=True)
class DialectSpec:
    """How one dialect names the counters: a line prefix and metric name -> field tables."""

    prefix: bytes
    counters: dict[str, Field]  # counter name without `_total`/`_created`
    gauges: frozenset[str] = frozenset()
    v0_markers: frozenset[str] = frozenset()  # names only vLLM V0 exposes
    names: dict[bytes, tuple[Field | None, str]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        for base, fld in self.counters.items():
            self.names[(base + "_total").encode()] = (fld, "value")
            self.names[(base + "_created").encode()] = (fld, "created")
        for name in self.gauges:
            self.names[name.encode()] = (None, "gauge")


def _v1_counters(prefix: str) -> dict[str, Field]:
    return {
        f"{prefix}spec_decode_num_drafts": Field.DRAFTS,
        f"{prefix}spec_decode_num_draft_tokens": Field.DRAFT_TOKENS,
        f"{prefix}spec_decode_num_accepted_tokens": Field.ACCEPTED,
        f"{prefix}spec_decode_num_accepted_tokens_per_pos": Field.PER_POS,
    }


_V0_GAUGES = frozenset({"vllm:spec_decode_draft_acceptance_rate", "vllm:spec_decode_efficiency"})

DIALECTS: dict[Dialect, DialectSpec] = {
    Dialect.VLLM: DialectSpec(
        prefix=b"vllm:spec_decode_",
        counters=_v1_counters("vllm:")
        | {"vllm:spec_decode_num_emitted_tokens": Field.EMITTED},
        gauges=_V0_GAUGES,
        v0_markers=_V0_GAUGES | {"vllm:spec_decode_num_emitted_tokens_total"},
    ),
    Dialect.LLAMACPP: DialectSpec(
        prefix=b"llamacpp:spec_decode_", counters=_v1_counters("llamacpp:")
    ),
}

# name="value" pairs; values may hold escaped quotes, backslashes, commas, spaces and `/`.
_LABEL = re.compile(rb'[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*')
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


def parse_line(line: bytes, spec: DialectSpec) -> tuple[str, Field | None, str, dict, float] | None:
    """One sample line -> (name, field, kind, labels, value); None when it is not ours or bad."""
    cut = len(line)
    for sep in (b"{", b" ", b"\t"):
        i = line.find(sep)
        if 0 <= i < cut:
            cut = i
    name = line[:cut]
    entry = spec.names.get(name)
    if entry is None:
        return None
    labels: dict[str, str] = {}
    rest_at = cut
    if cut < len(line) and line[cut] == ord("{"):
        parsed = parse_labels(line, cut)
        if parsed is None:
            return None
        labels, rest_at = parsed
    parts = line[rest_at:].split()
    if not parts or len(parts) > 2:  # value and an optional timestamp
        return None
    value = _number(parts[0])
    if value is None or (len(parts) == 2 and _number(parts[1]) is None):
        return None
    return name.decode(), entry[0], entry[1], labels, value


def _number(text: bytes) -> float | None:
    # Python's float() also takes `1_000`; the exposition format (and Go's parser) does not.
    if b"_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_page(page: bytes, dialect: Dialect | str = Dialect.VLLM) -> Snapshot:
    """The spec-decode series of a page; counters keyed per engine, model and position."""
    spec = DIALECTS[Dialect(dialect)]
    values: dict[SeriesKey, float] = {}
    created: dict[SeriesKey, float] = {}
    gauges: dict[str, float] = {}
    duplicates = 0
    is_v0 = False
    needle = b"\n" + spec.prefix
    start = 0 if page.startswith(spec.prefix) else _next_line(page, needle, 0)
    while start >= 0:
        end = page.find(b"\n", start)
        if end < 0:
            # Every line of an exposition ends with a line feed; a last line without one is a
            # cut-off body, whose value may be cut too (`1234` read as `12`): drop it.
            break
        parsed = parse_line(page[start:end].rstrip(), spec)
        start = _next_line(page, needle, end)
        if parsed is None:
            continue
        name, fld, kind, labels, value = parsed
        if name in spec.v0_markers:
            is_v0 = True
        if kind == "gauge":
            if math.isfinite(value):
                gauges[name] = gauges.get(name, 0.0) + value
            continue
        key = _series_key(fld, labels)
        if key is None:
            continue
        target = values if kind == "value" else created
        if key in target:
            duplicates += 1
            continue
        target[key] = value
    dialect_name = "vllm-v0" if is_v0 else spec_name(dialect)
    return Snapshot(values, created, gauges, dialect_name, duplicates)


def _next_line(page: bytes, needle: bytes, frm: int) -> int:
    found = page.find(needle, frm)
    return found + 1 if found >= 0 else -1


def spec_name(dialect: Dialect | str) -> str:
    """The dialect's name as results report it."""
    return Dialect(dialect).value


def _series_key(fld: Field | None, labels: dict[str, str]) -> SeriesKey | None:
    assert fld is not None
    model = labels.pop("model_name", "")
    engine = labels.pop("engine", "")
    position = -1
    if fld is Field.PER_POS:
        text = labels.pop("position", "")
        # ASCII digits only: int() also takes " 3", "+3", "3_0" and non-ASCII digits.
        if not (text.isascii() and text.isdigit()):
            return None
        position = int(text)
    extra = tuple(sorted(labels.items())) if labels else ()
    return SeriesKey(fld, model, engine, position, extra)
