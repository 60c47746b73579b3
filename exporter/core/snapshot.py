"""Immutable values that flow from the parser to accounting: series keys, snapshots, counts."""

from __future__ import annotations

import functools
import math
import operator
import struct
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple


class Field(StrEnum):
    """The spec-decode counters we account, named as in AISBench's raw dump."""

    DRAFTS = "num_drafts"
    DRAFT_TOKENS = "num_draft_tokens"
    ACCEPTED = "num_accepted_tokens"
    PER_POS = "accepted_per_pos"
    EMITTED = "num_emitted_tokens"  # vLLM V0 only


class SeriesKey(NamedTuple):
    """One counter series of a target: what it counts and which engine/model/position it is."""

    field: Field
    model_name: str
    engine: str
    position: int  # -1 for counters without a position label
    extra: tuple[tuple[str, str], ...] = ()  # other labels, so distinct series never merge


# AISBench's `raw` keys (`Counts.as_raw`), read once.
_RAW_DRAFTS, _RAW_DRAFT_TOKENS, _RAW_ACCEPTED, _RAW_PER_POS = (
    Field.DRAFTS.value, Field.DRAFT_TOKENS.value, Field.ACCEPTED.value, Field.PER_POS.value)


@dataclass(frozen=True, slots=True)
class Counts:
    """Counter totals summed over engines; `position_drafts` holds a position's drafts (of the
    parts with a series for it) where they differ from `drafts`."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: Mapping[int, float] = field(default_factory=dict)
    position_drafts: Mapping[int, float] = field(default_factory=dict)

    def drafts_at(self, pos: int) -> float:
        """The drafts behind position `pos`: of the parts that have a series for it."""
        if pos not in self.per_position:
            return 0.0
        return self.position_drafts.get(pos, self.drafts)

    def __add__(self, other: Counts) -> Counts:
        per_pos = dict(self.per_position)
        for pos, value in other.per_position.items():
            per_pos[pos] = per_pos.get(pos, 0.0) + value
        return self._combined(other, operator.add, per_pos,
                              self.per_position.keys() == other.per_position.keys())

    def __sub__(self, other: Counts) -> Counts:
        before = other.per_position
        per_pos = {pos: value - before.get(pos, 0.0) for pos, value in self.per_position.items()}
        return self._combined(other, operator.sub, per_pos, per_pos.keys() <= before.keys())

    def _combined(self, other: Counts, op: Callable[[float, float], float],
                  per_pos: dict[int, float], even: bool) -> Counts:
        """`self op other`, given its `per_position`; `even`: both sides have a series for each
        of its positions (without `position_drafts`, each position's drafts are `drafts`)."""
        drafts = op(self.drafts, other.drafts)
        uneven = {}
        if self.position_drafts or other.position_drafts or not even:
            # Per position, its drafts where they differ from `drafts`.
            uneven = {pos: at for pos in per_pos
                      if (at := op(self.drafts_at(pos), other.drafts_at(pos))) != drafts}
        return Counts(drafts, op(self.draft_tokens, other.draft_tokens),
                      op(self.accepted, other.accepted), per_pos, uneven)

    def as_raw(self) -> dict[str, Any]:
        """The counters as AISBench's `raw` dump names them (integral values as ints)."""
        drafts, tokens, accepted = map(float, (self.drafts, self.draft_tokens, self.accepted))
        raw: dict[str, Any] = {  # `integral` of each, written out: four RESULT parts call this
            _RAW_DRAFTS: int(drafts) if drafts.is_integer() else drafts,
            _RAW_DRAFT_TOKENS: int(tokens) if tokens.is_integer() else tokens,
            _RAW_ACCEPTED: int(accepted) if accepted.is_integer() else accepted,
            _RAW_PER_POS: _integral_by_position(self.per_position),
        }
        if self.position_drafts:
            raw[DRAFTS_PER_POS] = {
                str(p): integral(self.position_drafts[p]) for p in sorted(self.position_drafts)
            }
        return raw

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Counts:
        """Inverse of `as_raw`."""
        return cls(
            float(raw.get(Field.DRAFTS.value, 0.0)),
            float(raw.get(Field.DRAFT_TOKENS.value, 0.0)),
            float(raw.get(Field.ACCEPTED.value, 0.0)),
            {int(p): float(v) for p, v in raw.get(Field.PER_POS.value, {}).items()},
            {int(p): float(v) for p, v in raw.get(DRAFTS_PER_POS, {}).items()},
        )


def sum_counts(parts: Iterable[Counts]) -> Counts:
    """`Counts()` + each part in turn, without a `Counts` per addition where it can."""
    parts = list(parts)
    if not parts:
        return Counts()
    first = parts[0]
    positions = first.per_position.keys()
    # (A NaN first `drafts` makes the first addition's `position_drafts` NaN at each position.)
    if math.isnan(first.drafts) or any(
            p.position_drafts or p.per_position.keys() != positions for p in parts):
        return functools.reduce(operator.add, parts, Counts())
    drafts = draft_tokens = accepted = 0.0
    per_pos = dict.fromkeys(positions, 0.0)
    for part in parts:
        drafts += part.drafts
        draft_tokens += part.draft_tokens
        accepted += part.accepted
        for pos, value in part.per_position.items():
            per_pos[pos] += value
    return Counts(drafts, draft_tokens, accepted, per_pos)


DRAFTS_PER_POS = "num_drafts_per_pos"


_KEYED = 64
# Per count n (up to _KEYED), the positions 0..n-1 and their JSON keys "0".."n-1".
_POSITIONS = [list(range(n)) for n in range(_KEYED + 1)]
_POSITION_KEYS = [[str(p) for p in range(n)] for n in range(_KEYED + 1)]


def position_keys(n: int) -> list[str]:
    """The JSON keys "0".."n-1" of n positions (made once for the usual counts)."""
    return _POSITION_KEYS[n] if n <= _KEYED else [str(p) for p in range(n)]


def in_position_order(mapping: Mapping[int, Any] | Mapping[str, Any]) -> bool:
    """Whether the keys are the positions 0..n-1, as ints or as their JSON keys, in order."""
    n = len(mapping)
    return n <= _KEYED and list(mapping) in (_POSITIONS[n], _POSITION_KEYS[n])


def _integral_by_position(values: Mapping[int, float]) -> dict[str, int | float]:
    """`{str(position): integral(value)}` in numeric position order."""
    if in_position_order(values):
        # Positions 0..k-1 in order, as pages list them: keys made once, nothing to sort.
        floats = map(float, values.values())
        return dict(zip(position_keys(len(values)),
                        [int(v) if v.is_integer() else v for v in floats], strict=True))
    return {str(p): integral(values[p]) for p in sorted(values)}


def integral(value: float) -> int | float:
    """An integral count as an int (AISBench writes `2043630`, not `2043630.0`)."""
    # Counters are integral in vLLM; keep a fraction rather than hide it if one ever shows up.
    return int(value) if float(value).is_integer() else value


# What restarts as one: model name, engine, extra labels.
Engine = tuple[str, str, tuple[tuple[str, str], ...]]

# Bound once: `sum_series` runs for every series of every scrape.
_DRAFTS, _DRAFT_TOKENS, _ACCEPTED, _PER_POS = (
    Field.DRAFTS, Field.DRAFT_TOKENS, Field.ACCEPTED, Field.PER_POS
)


def sum_series(values: Collection[tuple[SeriesKey, float]]) -> Counts:
    """Sum series values into one `Counts` (over engines, models and labels); read twice."""
    drafts = draft_tokens = accepted = 0.0
    per_pos: dict[int, float] = {}
    drafts_series = 0
    for key, value in values:
        f = key.field
        if f is _PER_POS:  # first: most series are one per position
            pos = key.position
            per_pos[pos] = per_pos.get(pos, 0.0) + value
        elif f is _DRAFTS:
            drafts += value
            drafts_series += 1
        elif f is _DRAFT_TOKENS:
            draft_tokens += value
        elif f is _ACCEPTED:
            accepted += value
    # Engines are matched only when positions can differ.
    uneven: dict[int, float] = {}
    if drafts_series > 1 and _positions_uneven(values, drafts_series):
        uneven = _uneven_engines(values)
    return Counts(drafts, draft_tokens, accepted, per_pos, uneven)


def _positions_uneven(values: Iterable[tuple[SeriesKey, float]], engines: int) -> bool:
    """Whether some position has another number of series than there are drafts series."""
    series = Counter(key.position for key, _ in values if key.field is _PER_POS)
    return any(n != engines for n in series.values())


def _uneven_engines(values: Iterable[tuple[SeriesKey, float]]) -> dict[int, float]:
    """Per position, the drafts of the engines with a series for it, where not all have one."""
    engine_drafts: dict[Engine, float] = {}
    position_engines: dict[int, set[Engine]] = {}
    for key, value in values:
        if key.field is _DRAFTS:
            engine = (key.model_name, key.engine, key.extra)
            engine_drafts[engine] = engine_drafts.get(engine, 0.0) + value
        elif key.field is _PER_POS:
            position_engines.setdefault(key.position, set()).add(
                (key.model_name, key.engine, key.extra))
    uneven: dict[int, float] = {}
    for pos, engines in position_engines.items():
        # A position whose engines show no drafts series of their own (labels that differ
        # between the two families) cannot be matched: it keeps every draft behind it.
        if len(engines) < len(engine_drafts) and engines <= engine_drafts.keys():
            # In page order, not the set's (which moves with PYTHONHASHSEED): float sums of
            # fractional drafts differ in the last bit by order, and results must not.
            uneven[pos] = sum(v for e, v in engine_drafts.items() if e in engines)
    return uneven


def counts_by_model(values: Mapping[SeriesKey, float]) -> dict[str, Counts]:
    """Per `model_name`, the series summed over engines."""
    groups: dict[str, list[tuple[SeriesKey, float]]] = {}
    for key, value in values.items():
        groups.setdefault(key.model_name, []).append((key, value))
    return {model: sum_series(items) for model, items in sorted(groups.items())}


# How a page was asked for (`Snapshot.read`): filtered to our samples by `?name[]=`, or whole.
FILTERED = "filtered"
FULL = "full"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The spec-decode series of one scrape of one target; replaced whole, never mutated."""

    values: Mapping[SeriesKey, float]
    created: Mapping[SeriesKey, float]  # `_created` of the counter series, where exposed
    # Interval gauges (vLLM V0, SGLang, TRT-LLM) by metric name, averaged over their series.
    gauges: Mapping[str, float] = field(default_factory=dict)
    dialect: str = "vllm"  # what the page spoke: a `Dialect` value, or "vllm-v0"
    duplicates: int = 0  # repeated series in the page; the first one is kept
    # How the page was asked for: "filtered" (`name[]`, only our families), "full", or "" when
    # not scraped by the exporter (measure, history).
    read: str = ""
    # The dialect's running-requests gauge summed over its series (engines, models); None when
    # the page has none.
    running: float | None = None

    @property
    def has_spec_decode(self) -> bool:
        """True when the page carries any spec-decode series."""
        return bool(self.values) or bool(self.gauges)

    def totals(self) -> Counts:
        """All series summed over engines and models."""
        return sum_series(self.values.items())

    @property
    def engines(self) -> int:
        """How many engines (data-parallel ranks) the page shows; 1 when it has no engine label."""
        return len({k.engine for k in self.values})

    @property
    def model_names(self) -> list[str]:
        """The model names seen, sorted."""
        return sorted({k.model_name for k in self.values})


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """What one scrape of one target gave: a snapshot, or the reason there is none."""

    target: str
    at: float  # wall-clock time the answer was complete, Unix seconds
    duration: float
    snapshot: Snapshot | None
    error: str | None = None
    size: int = 0

    @property
    def ok(self) -> bool:
        """The page was fetched and read."""
        return self.snapshot is not None


# A `Counts` packed (`pack_counts`): counters and positions' values as doubles, the positions
# (a tuple callers may share), and `position_drafts` or None.
PackedCounts = tuple[bytes, tuple[int, ...], Mapping[int, float] | None]


def pack_counts(counts: Counts, positions: tuple[int, ...] | None = None) -> PackedCounts:
    """`counts` packed; `positions` (its positions in order) given to share one tuple."""
    per_position = counts.per_position
    values = per_position.values()
    numbers = doubles(3 + len(values)).pack(
        counts.drafts, counts.draft_tokens, counts.accepted, *values)
    if positions is None:
        positions = tuple(per_position)
    return numbers, positions, counts.position_drafts or None


def unpack_counts(packed: PackedCounts) -> Counts:
    """The `Counts` `pack_counts` packed."""
    numbers, positions, uneven = packed
    values = doubles(len(numbers) // 8).unpack(numbers)
    per_position = dict(zip(positions, values[3:], strict=True))
    return Counts(values[0], values[1], values[2], per_position, dict(uneven or {}))


def pack_values(values: Mapping[SeriesKey, float]) -> bytes:
    """A page's values (or `_created` times) as packed doubles, in the mapping's order."""
    return doubles(len(values)).pack(*values.values())


def unpack_values(keys: tuple[SeriesKey, ...], numbers: bytes) -> dict[SeriesKey, float]:
    """The mapping `pack_values` packed, given its keys in order."""
    return dict(zip(keys, doubles(len(keys)).unpack(numbers), strict=True))


@functools.lru_cache(maxsize=256)
def doubles(count: int) -> struct.Struct:
    """The struct of `count` little-endian doubles (made once a count)."""
    return struct.Struct(f"<{count}d")
