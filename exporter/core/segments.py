"""Per-request segments, pure: each proxied request keyed by what it was (the client's tag, the
model, its prompt and output length bands, its temperature) and by the load it met (requests in
flight through its proxy port as it started); per segment exact sums, histogram and the sums of
squares and cross-products a ratio's delta-method interval needs, so segments stay bounded and
merge exactly (a window's targets, a fleet's shards)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from operator import add
from statistics import NormalDist
from typing import Any

from exporter.core.answershapes import SUM_KEYS, is_partial
from exporter.core.tallies import add_counts, finite, natural

TAG_HEADER = "X-Specdec-Tag"
# Distinct values kept per dimension: a client's tag is its own text, so past this many the
# rest fall in OTHER rather than growing the state without bound.
MAX_SEGMENTS = 32
# Requests of one combination of keys are added together and folded into each dimension when
# read: a record costs one addition, not one per dimension.
MAX_COMBINED = 256
MIN_REQUESTS = 10  # fewer requests in a ratio than this give no figure, only a note
OTHER, UNKNOWN, UNTAGGED, DEFAULT = "other", "unknown", "untagged", "default"
_TEXT = re.compile(r"[A-Za-z0-9._:/@+=-]{1,128}")
DIMENSIONS = ("tag", "model", "prompt_tokens", "output_tokens", "temperature", "concurrency")
# Per segment: count (k), sums and cross-products of steps n, drafted d and accepted a; `_n`
# over the requests that report steps (the length's ratio), the rest over all with figures.
MOMENTS = ("k_n", "n", "a_n", "nn", "an", "aa_n", "k_d", "d", "a", "dd", "ad", "aa")
_Z = NormalDist().inv_cdf(0.975)
NOTES = {
    "tag": f"the {TAG_HEADER} header (its name: proxy.tag_header); {UNTAGGED}: none sent",
    OTHER: f"values past {MAX_SEGMENTS} distinct ones in a dimension, and client text that is "
           "not 1-128 of A-Z a-z 0-9 . _ : / @ + = -",
    "temperature": f"the request body's; {DEFAULT}: none given (the server's default); "
                   f"{UNKNOWN}: a body not read (streamed, or 64 KiB or more)",
    "concurrency": "requests in flight through the proxy port as it started, itself included",
    "bands": "prompt_tokens, output_tokens and concurrency in powers of two (lo-hi)",
    "interval": "95%, delta method over requests (ratio of sums); fewer than "
                f"{MIN_REQUESTS} requests: no figure",
}


@dataclass(frozen=True)
class RequestContext:
    """What the proxy knew of a request as it started: the client's tag, the body's model and
    temperature, and the requests in flight through its port (itself included)."""

    tag: str | None
    model: str | None
    temperature: str
    concurrency: int


def _text(value: object) -> str:
    return value if isinstance(value, str) and _TEXT.fullmatch(value) else OTHER


def request_context(tag: str | None, body: bytes | None, in_flight: int) -> RequestContext:
    """A request's context from its tag header, its body (None: not read) and the count."""
    fields: object = None
    if body is not None:
        try:
            fields = json.loads(body)
        except (ValueError, RecursionError):
            fields = None
    if not isinstance(fields, dict):
        return RequestContext(tag, None, UNKNOWN, in_flight)
    model = fields.get("model")
    temperature = fields.get("temperature")
    if temperature is None:
        heat = DEFAULT
    elif finite(temperature):
        heat = f"{float(temperature):g}"
    else:
        heat = OTHER
    return RequestContext(tag, model if isinstance(model, str) else None, heat, in_flight)


@dataclass
class InFlight:
    """Requests in flight through one proxy port, and the header a request's tag comes in."""

    header: str = TAG_HEADER
    count: int = 0

    @contextmanager
    def counted(self, headers: Mapping[str, str], body: bytes | None
                ) -> Iterator[RequestContext]:
        """One more request in flight while inside: its context."""
        self.count += 1
        try:
            yield request_context(headers.get(self.header), body, self.count)
        finally:
            self.count -= 1


def band(value: int | None) -> str:
    """The power-of-two band of a count: `0`, `1`, `2-3`, `4-7`, ...; `unknown` for None."""
    if value is None:
        return UNKNOWN
    if value <= 1:
        return str(value)
    low = 1 << (value.bit_length() - 1)
    return f"{low}-{2 * low - 1}"


_UNKNOWN_KEYS = (UNKNOWN,) * len(DIMENSIONS)


def keys_of(stats: Any) -> tuple[str, ...]:
    """A request's segment in each dimension, in DIMENSIONS order (`stats` a
    perrequest.RequestStats)."""
    ctx: RequestContext | None = stats.context
    if ctx is None:
        return _UNKNOWN_KEYS
    model = stats.model or ctx.model
    return (UNTAGGED if ctx.tag is None else _text(ctx.tag),
            UNKNOWN if model is None else _text(model), band(stats.prompt_tokens),
            band(stats.completion_tokens), ctx.temperature, band(ctx.concurrency))


_FIELDS = ("requests", "with_stats", *SUM_KEYS, *MOMENTS)
_NONE = (1,) + (0,) * (len(_FIELDS) - 1)  # a request without figures


def delta(spec: dict[str, Any] | None) -> tuple[int, ...]:
    """What one request (its spec-decode object, None without figures) adds to a segment's
    counts, in `_FIELDS` order: made once, added to a segment in each dimension."""
    if spec is None:
        return _NONE
    n, d, a = (spec[key] for key in SUM_KEYS)
    tokens = (1, d, a, d * d, a * d, a * a)  # k_d, d, a, dd, ad, aa
    if is_partial(spec):  # no steps: in the rate, not the length
        return (1, 1, 0, d, a, 0, 0, 0, 0, 0, 0, *tokens)
    return (1, 1, n, d, a, 1, n, a, n * n, a * n, a * a, *tokens)


@dataclass
class Segment:
    """One segment's requests: counts, exact sums and moments (`_FIELDS`), its histogram, and
    whether its moments were kept (not in a window saved before segments: no interval)."""

    counts: list[int] = field(default_factory=lambda: [0] * len(_FIELDS))
    histogram: list[int] = field(default_factory=list)
    kept: bool = True

    @classmethod
    def totals(cls, requests: int, with_stats: int, sums: Mapping[str, int],
               histogram: list[int]) -> Segment:
        """A segment of these totals without moments."""
        counts = [requests, with_stats, *(sums[k] for k in SUM_KEYS)] + [0] * len(MOMENTS)
        return cls(counts, list(histogram), kept=False)

    def add(self, change: tuple[int, ...], histogram: list[int] | None) -> None:
        """One request: its `delta` and its histogram (None when it has none)."""
        self.counts[:] = map(add, self.counts, change)
        if histogram is not None:
            add_counts(self.histogram, histogram)

    def merge(self, other: Segment) -> None:
        """Add another segment's requests."""
        self.add(tuple(other.counts), other.histogram)
        self.kept = self.kept and other.kept

    def answer(self, drafts: int | None) -> dict[str, Any]:
        """Its block: counts, sums, histogram, length and rate with intervals, share of the
        counters' drafts (`drafts`, None without counters)."""
        named = dict(zip(_FIELDS[:5], self.counts, strict=False))
        moments = dict(zip(MOMENTS, self.counts[5:], strict=True)) if self.kept else None
        length, note = ratio(moments, "n", "a_n", "nn", "an", "aa_n", "k_n")
        rate, _ = ratio(moments, "d", "a", "dd", "ad", "aa", "k_d")
        if length is not None:
            length = {k: 1 + v for k, v in length.items()}
        return named | {
            "acceptance_histogram": list(self.histogram), "acceptance_length": length,
            "draft_acceptance_rate": rate, "note": note,
            "share_of_drafts": named["num_spec_steps"] / drafts if drafts else None,
            "moments": moments}

    @classmethod
    def from_block(cls, block: object) -> Segment:
        """Inverse of `answer`; `ValueError` when it is not one (a peer's)."""
        if not isinstance(block, Mapping):
            raise ValueError("a segment is not an object")
        hist, moments = block.get("acceptance_histogram"), block.get("moments")
        values = [block.get(k) for k in _FIELDS[:5]] + [
            0 if moments is None else moments.get(k) if isinstance(moments, Mapping) else None
            for k in MOMENTS]
        if not all(natural(v) for v in values) or not isinstance(hist, list) or not all(
                natural(h) for h in hist):
            raise ValueError("a segment's counts are not counts")
        return cls([v for v in values if natural(v)], list(hist), kept=moments is not None)


def ratio(moments: Mapping[str, int] | None, den: str, num: str, dd: str, nd: str, nn: str,
          k: str) -> tuple[dict[str, float] | None, str | None]:
    """Σnum/Σden over requests with a 95% delta-method interval (requests independent), or
    None and why: too few requests, or no moments kept."""
    if moments is None:
        return None, "saved before segments were kept: no figure"
    count, below, above = moments[k], moments[den], moments[num]
    if count < MIN_REQUESTS or below == 0:
        return None, f"{count} requests with figures: too few for one (fewer than {MIN_REQUESTS})"
    r = Fraction(above, below)
    spread = moments[nn] - 2 * r * moments[nd] + r * r * moments[dd]
    se = math.sqrt(count / (count - 1) * max(float(spread), 0.0)) / below
    value = float(r)
    return {"value": value, "low": max(value - _Z * se, 0.0), "high": value + _Z * se}, None


def _sorted(values: Mapping[str, Segment]) -> dict[str, Segment]:
    """Numbers (a band's low end) in order, then text."""
    def key(name: str) -> tuple[int, float, str]:
        head = name.split("-")[0]
        try:
            return 0, float(head), name
        except ValueError:
            return 1, 0.0, name
    return {name: values[name] for name in sorted(values, key=key)}


@dataclass
class Segments:
    """A window's requests by dimension and value, at most MAX_SEGMENTS values (+ OTHER) each.
    A request is added once, to the segment of its keys in every dimension together
    (`combined`); those are folded into each dimension's when read, or past MAX_COMBINED."""

    by: dict[str, dict[str, Segment]] = field(
        default_factory=lambda: {d: {} for d in DIMENSIONS})
    combined: dict[tuple[str, ...], Segment] = field(default_factory=dict)

    def _fold(self) -> None:
        """Each combined segment into its value's segment of each dimension."""
        for keys, segment in self.combined.items():
            for dimension, value in zip(DIMENSIONS, keys, strict=True):
                self._slot(dimension, value).merge(segment)
        self.combined.clear()

    def _slot(self, dimension: str, value: str) -> Segment:
        values = self.by[dimension]
        segment = values.get(value)
        if segment is None:
            if len(values) >= MAX_SEGMENTS:
                value = OTHER
            segment = values.get(value) or values.setdefault(value, Segment())
        return segment

    def record(self, stats: Any) -> None:
        """One request (a perrequest.RequestStats) in its segment of each dimension."""
        spec = None if stats.unreadable is not None else stats.spec
        keys = keys_of(stats)
        segment = self.combined.get(keys)
        if segment is None:
            if len(self.combined) >= MAX_COMBINED:
                self._fold()
            segment = self.combined[keys] = Segment()
        histogram = None if spec is None or is_partial(spec) else spec["acceptance_histogram"]
        segment.add(delta(spec), histogram)

    def merge(self, other: Segments) -> None:
        """Add another tally's segments (overflow past MAX_SEGMENTS into OTHER)."""
        self._fold()
        other._fold()
        for dimension, values in other.by.items():
            for value, segment in values.items():
                self._slot(dimension, value).merge(segment)

    def answer(self, counters: Mapping[str, int] | None) -> dict[str, Any]:
        """`by`: each dimension's segments in order (`counters`: the window's increase)."""
        drafts = None if counters is None else counters.get("num_drafts")
        self._fold()
        return {d: {v: s.answer(drafts) for v, s in _sorted(values).items()}
                for d, values in self.by.items()}

    @classmethod
    def from_block(cls, block: object, whole: Segment) -> Segments:
        """Inverse of `answer`; a block without segments (saved before them) puts `whole` in
        UNKNOWN of each dimension; `ValueError` when malformed or not summing to `whole`."""
        if block is None:
            return cls({d: {UNKNOWN: Segment(list(whole.counts), list(whole.histogram),
                                             kept=False)} for d in DIMENSIONS})
        if not isinstance(block, Mapping) or set(block) != set(DIMENSIONS):
            raise ValueError("its segments are not by " + ", ".join(DIMENSIONS))
        out = cls()
        for dimension in DIMENSIONS:
            values = block[dimension]
            if not isinstance(values, Mapping) or len(values) > MAX_SEGMENTS + 1:
                raise ValueError(f"its {dimension} segments are not a bounded object")
            total = Segment()
            for value, segment in values.items():
                out.by[dimension][str(value)] = parsed = Segment.from_block(segment)
                total.merge(parsed)
            # Requests, with figures, the sums, and the histogram: what must add up.
            if total.counts[:5] != whole.counts[:5] or total.histogram != whole.histogram:
                raise ValueError(f"its {dimension} segments do not sum to its requests")
        return out
