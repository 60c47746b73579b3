"""An accumulator's row in the state database: its whole state as JSON, or only what a round
changed (its round part, made without building the whole row), and back."""

from __future__ import annotations

import base64
import functools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.core.anomaly import AnomalyTally
from exporter.core.empties import NO_ITEMS, shared_engines, shared_keys, writable
from exporter.core.loadbands import Bands, bands_from_row, bands_row
from exporter.core.snapshot import (
    Counts,
    Field,
    PackedCounts,
    SeriesKey,
    doubles,
    pack_counts,
    unpack_counts,
)

# What an accumulator's whole row holds beyond its round part (`RowCodec._shape`).
Shape = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Encoded:
    """An accumulator's row for the store: its whole state, or only its round part."""

    text: str
    whole: bool
    shape: Shape  # of the whole row it is, or is the round part of
    scrapes: int  # the accumulator's scrapes when it was encoded


class RowCodec:
    """The row codec of `counting.Accumulator` (its base)."""

    last: Mapping[SeriesKey, float]
    created: Mapping[SeriesKey, float]
    increase: dict[SeriesKey, float]
    resets: int
    scrapes: int
    first_at: float | None
    last_at: float | None
    engines: frozenset[str]
    dialect: str
    read: str
    packed_before: PackedCounts | None
    reset_spans: Sequence[tuple[float, float]]
    restart_times: Sequence[float | None]
    gone: Mapping[SeriesKey, tuple[float, float | None, float]]
    gauge_weighted: Mapping[str, float]
    gauge_seconds: Mapping[str, float]
    anomalies_before: AnomalyTally
    anomalies_inside: AnomalyTally
    anomalies_after: AnomalyTally
    by_load: Bands
    running: float | None
    _saved: tuple[Shape, int] | None
    if not TYPE_CHECKING:
        __slots__ = ()  # the fields are the dataclass's, slotted there

    def to_json(self) -> str:
        """The whole state as JSON: per series its key, and value, created, increase, seen."""
        return self._whole_json(self._keys())

    def encode(self, *, whole: bool = False) -> Encoded:
        """This accumulator's row for the store: its round part (`_round_json`) when its whole
        row as last committed (`saved`) differs only there, else (or if `whole`) the whole."""
        keys = self._keys()
        # Every series with a value and an increase: what a round part holds.
        aligned = len(keys) == len(self.last) + len(self.gone) == len(self.increase)
        last = self.last
        values: Sequence[float | None]
        if not self.gone and aligned:
            values = list(map(last.__getitem__, keys))
            created = tuple(map(self.created.get, keys))
        else:
            rows = list(self._series(keys))
            values = [v for _, v, _, _ in rows]
            created = tuple(c for _, _, c, _ in rows)
        shape = self._shape(keys, created)
        saved = self._saved
        if aligned and not whole and saved is not None and shape == saved[0]:
            return Encoded(self._round_json(keys, values, saved[1]), False, shape, self.scrapes)
        return Encoded(self._whole_json(keys), True, shape, self.scrapes)

    def saved(self, encoded: Encoded) -> None:
        """The store committed `encoded` (from `encode`): later rounds write against it."""
        if encoded.whole:
            keys, *rest = encoded.shape
            # Kept while the window is open: targets alike share one tuple of keys.
            self._saved = ((shared_keys(keys), *rest), encoded.scrapes)

    def _keys(self) -> list[SeriesKey]:
        # The increases' order, then any series with a value but no increase (an edited state).
        keys = list(self.increase)
        if len(keys) < len(self.last) + len(self.gone):
            keys += [k for k in (*self.last, *self.gone) if k not in self.increase]
        return keys

    def _series(self, keys: Sequence[SeriesKey],
                ) -> Iterator[tuple[SeriesKey, float | None, float | None, float | None]]:
        """(key, last value, `_created`, when last read) of each of `keys`, None if unknown."""
        last, created, gone, at = self.last, self.created, self.gone, self.last_at
        for k in keys:
            if k in last:
                yield k, last[k], created.get(k), at
            elif k in gone:
                yield k, *gone[k]
            else:
                yield k, None, None, None

    def _shape(self, keys: list[SeriesKey], created: tuple[float | None, ...]) -> Shape:
        """What a whole row holds beyond its round part: engines and restart spans are only
        added and a tally changes with its count, so sizes and counts tell a change. `read`
        is left out: a restored one is set again by the next scrape, and its first change (a
        proven filter) would cost every target a whole row."""
        return (
            tuple(keys), created, self.resets, len(self.reset_spans),
            self.first_at, len(self.engines), self.dialect, self.packed_before,
            self.anomalies_before.count, self.anomalies_inside.count, self.anomalies_after.count,
        )

    def _whole_json(self, keys: list[SeriesKey]) -> str:
        increase = self.increase
        values: list[float | None] = []
        for k, v, c, t in self._series(keys):
            values += (v, c, increase.get(k), t)
        engines = sorted(self.engines)
        packed = self.packed_before
        tallies = (self.anomalies_before, self.anomalies_inside, self.anomalies_after)
        return "".join((
            '{"keys":[', ",".join(_key_json(k) for k in keys), '],"values":', json.dumps(values),
            f',"resets":{self.resets},"scrapes":{self.scrapes},',
            f'"first_at":{_num(self.first_at)},"last_at":{_num(self.last_at)},',
            '"engines":', json.dumps(engines), ',"dialect":', json.dumps(self.dialect),
            ',"read":', json.dumps(self.read),
            ',"before":', json.dumps(unpack_counts(packed).as_raw()) if packed else "null",
            ',"reset_spans":', json.dumps([list(span) for span in self.reset_spans]),
            ',"restart_times":', json.dumps(list(self.restart_times)),
            ',"gauge_weighted":', _dict_json(self.gauge_weighted),
            ',"gauge_seconds":', _dict_json(self.gauge_seconds),
            ',"anomalies":[', ",".join(_tally_json(t) for t in tallies), "]",
            self._load_json(), "}",
        ))

    def _round_json(self, keys: list[SeriesKey], values: Sequence[float | None],
                    base: int) -> str:
        """What a round changes since the whole row of `base` scrapes: values and increases as
        doubles in base64, and a seen time only where it is not the last scrape's."""
        at, gone = self.last_at, self.gone
        numbers = doubles(len(keys) * 2).pack(*values, *self.increase.values())
        if not gone:
            moved = "[]"
        else:
            moved = json.dumps([(i, g[2]) for i, k in enumerate(keys)
                                if (g := gone.get(k)) is not None and g[2] != at])
        return "".join((
            f'{{"base":{base},"scrapes":{self.scrapes},"last_at":{_num(at)},"values":"',
            base64.b64encode(numbers).decode(), '","seen":', moved,
            ',"gauge_weighted":', _dict_json(self.gauge_weighted),
            ',"gauge_seconds":', _dict_json(self.gauge_seconds), self._load_json(), "}",
        ))

    def _load_json(self) -> str:
        """The bands by load and the last running reading, as `,"by_load":...,"running":...`."""
        return "".join((',"by_load":', json.dumps(bands_row(self.by_load)) if self.by_load
                        else "{}", ',"running":', _num(self.running)))


def fields_of(data: Mapping[str, Any]) -> dict[str, Any]:
    """An accumulator's fields from (parsed) `to_json`, with the round part `encode` wrote after
    it as `round` if the store has one, or from the per-field form version 0 wrote."""
    if "keys" in data:
        values = data["values"]
        rows = [(_key_from(k), *values[4 * i:4 * i + 4]) for i, k in enumerate(data["keys"])]
        part = data.get("round")
        # A round part of another whole row is stale.
        if part is not None and part["base"] == data["scrapes"]:
            rows = _with_round(rows, part)
            data = dict(data) | {k: part[k] for k in _ROUND_FIELDS}
        data = dict(data) | {
            "last": [(k, v, c) for k, v, c, _, _ in rows if v is not None],
            "increase": [(k, inc) for k, _, _, inc, _ in rows if inc is not None],
            "seen": [(k, t) for k, _, _, _, t in rows if t is not None],
        }
    at = data["last_at"]
    seen = {_as_key(k): t for k, t in data["seen"]}
    last: dict[SeriesKey, float] = {}
    created: dict[SeriesKey, float] = {}
    gone: dict[SeriesKey, tuple[float, float | None, float]] = {}
    for k, v, c in data["last"]:
        key = _as_key(k)
        t = seen.get(key, at)
        if t is None or t == at:  # read at the last usable scrape: on its page
            last[key] = v
            if c is not None:
                created[key] = c
        else:
            gone[key] = (v, c, t)
    before, inside, after = (AnomalyTally.from_dict(t) for t in data["anomalies"])
    return dict(
        last=last,
        created=created,
        gone=gone or NO_ITEMS,
        increase={_as_key(k): v for k, v in data["increase"]},
        resets=data["resets"],
        scrapes=data["scrapes"],
        first_at=data["first_at"],
        last_at=data["last_at"],
        engines=shared_engines(frozenset(data["engines"])),
        dialect=data["dialect"],
        read=data.get("read", ""),  # rows written before it was kept lack it
        packed_before=pack_counts(Counts.from_raw(data["before"])) if data["before"] else None,
        reset_spans=[tuple(span) for span in data["reset_spans"]] or (),
        restart_times=list(data["restart_times"]) or (),
        gauge_weighted=dict(data["gauge_weighted"]) or NO_ITEMS,
        gauge_seconds=dict(data["gauge_seconds"]) or NO_ITEMS,
        by_load=bands_from_row(data["by_load"]) or NO_ITEMS,
        running=data["running"],
        anomalies_before=before,
        anomalies_inside=inside,
        anomalies_after=after,
    )


# What a round part holds besides its series' numbers (`Accumulator._round_json`).
_ROUND_FIELDS = ("scrapes", "last_at", "gauge_weighted", "gauge_seconds", "by_load", "running")

# A series as a whole row holds it: key, value, created, increase, seen.
_Row = tuple[SeriesKey, Any, Any, Any, Any]


def _with_round(rows: list[_Row], part: Mapping[str, Any]) -> list[_Row]:
    """A whole row's series with a later round part's values, increases and seen times."""
    numbers, at, n = base64.b64decode(part["values"], validate=True), part["last_at"], len(rows)
    if len(numbers) != 16 * n:
        raise ValueError(f"round part has {len(numbers) / 8:g} numbers for {n} series (2 each)")
    values = doubles(2 * n).unpack(numbers)
    seen = {i: t for i, t in part["seen"]}
    return [(k, values[i], c, values[n + i], seen.get(i, at))
            for i, (k, _, c, _, _) in enumerate(rows)]


def _dict_json(gauges: Mapping[str, float]) -> str:
    return json.dumps(writable(gauges)) if gauges else "{}"


def _tally_json(tally: AnomalyTally) -> str:
    if not tally.count:
        return '{"count":0,"first":null,"last":null}'
    return json.dumps(tally.to_dict())


@functools.lru_cache(maxsize=65536)
def _key_json(key: SeriesKey) -> str:
    return json.dumps(
        [key.field.value, key.model_name, key.engine, key.position, [list(p) for p in key.extra]])


def _num(value: float | None) -> str:
    # repr is JSON for finite floats; json.dumps spells None, NaN and infinities as it reads them.
    return repr(value) if value is not None and math.isfinite(value) else json.dumps(value)


def _as_key(data: Sequence[Any] | SeriesKey) -> SeriesKey:
    return data if isinstance(data, SeriesKey) else _key_from(data)


def _key_from(data: Sequence[Any]) -> SeriesKey:
    fld, model, engine, position, extra = data
    return SeriesKey(Field(fld), model, engine, position, tuple(tuple(p) for p in extra))


# A live track's point as kept: its time, then the totals packed (`snapshot.pack_counts`; the
# positions' tuple shared by consecutive points).
Packed = tuple[float, bytes, tuple[int, ...], Mapping[int, float] | None]
Point = tuple[float, Counts]

