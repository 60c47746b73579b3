"""Immutable values that flow from the parser to accounting: series keys, snapshots, counts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


@dataclass(frozen=True, slots=True)
class Counts:
    """Counter totals summed over engines: what the derived figures are computed from."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: Mapping[int, float] = field(default_factory=dict)

    def __add__(self, other: Counts) -> Counts:
        per_pos = dict(self.per_position)
        for pos, value in other.per_position.items():
            per_pos[pos] = per_pos.get(pos, 0.0) + value
        return Counts(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            per_pos,
        )

    def __sub__(self, other: Counts) -> Counts:
        per_pos = {
            pos: value - other.per_position.get(pos, 0.0)
            for pos, value in self.per_position.items()
        }
        return Counts(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
            per_pos,
        )

    def as_raw(self) -> dict[str, Any]:
        """The counters as AISBench's `raw` dump names them, positions in numeric order."""
        return {
            Field.DRAFTS.value: self.drafts,
            Field.DRAFT_TOKENS.value: self.draft_tokens,
            Field.ACCEPTED.value: self.accepted,
            Field.PER_POS.value: {str(p): self.per_position[p] for p in sorted(self.per_position)},
        }

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Counts:
        """Inverse of `as_raw`."""
        return cls(
            float(raw.get(Field.DRAFTS.value, 0.0)),
            float(raw.get(Field.DRAFT_TOKENS.value, 0.0)),
            float(raw.get(Field.ACCEPTED.value, 0.0)),
            {int(p): float(v) for p, v in raw.get(Field.PER_POS.value, {}).items()},
        )


# Enum member look-ups cost a descriptor call each; this loop runs for every series of every
# scrape, so the members are bound once.
_DRAFTS, _DRAFT_TOKENS, _ACCEPTED, _PER_POS = (
    Field.DRAFTS, Field.DRAFT_TOKENS, Field.ACCEPTED, Field.PER_POS
)


def sum_series(values: Iterable[tuple[SeriesKey, float]]) -> Counts:
    """Sum series values into one `Counts` (over engines, models and extra labels)."""
    drafts = draft_tokens = accepted = 0.0
    per_pos: dict[int, float] = {}
    for key, value in values:
        f = key.field
        if f is _DRAFTS:
            drafts += value
        elif f is _DRAFT_TOKENS:
            draft_tokens += value
        elif f is _ACCEPTED:
            accepted += value
        elif f is _PER_POS:
            per_pos[key.position] = per_pos.get(key.position, 0.0) + value
    return Counts(drafts, draft_tokens, accepted, per_pos)


def counts_by_model(values: Mapping[SeriesKey, float]) -> dict[str, Counts]:
    """Per `model_name`, the series summed over engines."""
    groups: dict[str, list[tuple[SeriesKey, float]]] = {}
    for key, value in values.items():
        groups.setdefault(key.model_name, []).append((key, value))
    return {model: sum_series(items) for model, items in sorted(groups.items())}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The spec-decode series of one scrape of one target; replaced whole, never mutated."""

    values: Mapping[SeriesKey, float]
    created: Mapping[SeriesKey, float]  # `_created` of the counter series, where exposed
    # Interval gauges (vLLM V0, SGLang, TRT-LLM) by metric name, averaged over their series.
    gauges: Mapping[str, float] = field(default_factory=dict)
    dialect: str = "vllm"  # what the page spoke: a `Dialect` value, or "vllm-v0"
    duplicates: int = 0  # repeated series in the page; the first one is kept

    @property
    def has_spec_decode(self) -> bool:
        """True when the page carries any spec-decode series."""
        return bool(self.values) or bool(self.gauges)

    def totals(self) -> Counts:
        """All series summed over engines and models."""
        return sum_series(self.values.items())

    def by_model(self) -> dict[str, Counts]:
        """Series summed over engines, per model name."""
        return counts_by_model(self.values)

    @property
    def engines(self) -> int:
        """How many engines (data-parallel ranks) the page shows; 1 when it has no engine label."""
        return len({k.engine for k in self.values}) or 0

    @property
    def model_names(self) -> list[str]:
        """The model names seen, sorted."""
        return sorted({k.model_name for k in self.values})


EMPTY_SNAPSHOT = Snapshot(values={}, created={})
