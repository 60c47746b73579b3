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
from statistics import NormalDist
from typing import Any

from exporter.core.answershapes import is_partial
from exporter.core.tallies import add_counts, natural

TAG_HEADER = "X-Specdec-Tag"
# Distinct values kept per dimension: a client's tag is its own text, so past this many the
# rest fall in OTHER rather than growing the state without bound.
MAX_SEGMENTS = 32
MIN_REQUESTS = 10  # fewer requests in a ratio than this give no figure, only a note
OTHER, UNKNOWN, UNTAGGED, DEFAULT = "other", "unknown", "untagged", "default"
_TEXT = re.compile(r"[A-Za-z0-9._:/@+=-]{1,128}")
DIMENSIONS = ("tag", "model", "prompt_tokens", "output_tokens", "temperature", "concurrency")
SUM_KEYS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")
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
    elif isinstance(temperature, int | float) and not isinstance(temperature, bool) and (
            math.isfinite(temperature)):
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


def keys_of(stats: Any) -> dict[str, str]:
    """A request's segment in each dimension (`stats` a perrequest.RequestStats)."""
    ctx: RequestContext | None = stats.context
    if ctx is None:
        return dict.fromkeys(DIMENSIONS, UNKNOWN)
    model = stats.model or ctx.model
    return {"tag": UNTAGGED if ctx.tag is None else _text(ctx.tag),
            "model": UNKNOWN if model is None else _text(model),
            "prompt_tokens": band(stats.prompt_tokens),
            "output_tokens": band(stats.completion_tokens),
            "temperature": ctx.temperature, "concurrency": band(ctx.concurrency)}


@dataclass
class Segment:
    """One segment's requests: counts, exact sums, histogram and moments (None: saved before
    segments were kept, so no interval)."""

    requests: int = 0
    with_stats: int = 0
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SUM_KEYS, 0))
    histogram: list[int] = field(default_factory=list)
    moments: dict[str, int] | None = field(default_factory=lambda: dict.fromkeys(MOMENTS, 0))

    def add(self, spec: dict[str, Any] | None) -> None:
        """One request (its spec-decode object, None without figures)."""
        self.requests += 1
        if spec is None:
            return
        self.with_stats += 1
        n, d, a = (spec[key] for key in SUM_KEYS)
        sums, m = self.sums, self.moments
        sums["num_draft_tokens"] += d
        sums["num_accepted_draft_tokens"] += a
        if m is not None:
            m["k_d"] += 1
            m["d"] += d
            m["a"] += a
            m["dd"] += d * d
            m["ad"] += a * d
            m["aa"] += a * a
        if is_partial(spec):
            return
        sums["num_spec_steps"] += n
        add_counts(self.histogram, spec["acceptance_histogram"])
        if m is not None:
            m["k_n"] += 1
            m["n"] += n
            m["a_n"] += a
            m["nn"] += n * n
            m["an"] += a * n
            m["aa_n"] += a * a

    def merge(self, other: Segment) -> None:
        """Add another segment's requests."""
        self.requests += other.requests
        self.with_stats += other.with_stats
        for key in SUM_KEYS:
            self.sums[key] += other.sums[key]
        add_counts(self.histogram, other.histogram)
        if self.moments is None or other.moments is None:
            self.moments = None
        else:
            for key in MOMENTS:
                self.moments[key] += other.moments[key]

    def answer(self, drafts: int | None) -> dict[str, Any]:
        """Its block: counts, sums, histogram, length and rate with intervals, share of the
        counters' drafts (`drafts`, None without counters)."""
        length, note = ratio(self.moments, "n", "a_n", "nn", "an", "aa_n", "k_n")
        rate, _ = ratio(self.moments, "d", "a", "dd", "ad", "aa", "k_d")
        if length is not None:
            length = {k: 1 + v for k, v in length.items()}
        return {"requests": self.requests, "with_stats": self.with_stats, **self.sums,
                "acceptance_histogram": list(self.histogram), "acceptance_length": length,
                "draft_acceptance_rate": rate, "note": note,
                "share_of_drafts": self.sums["num_spec_steps"] / drafts if drafts else None,
                "moments": None if self.moments is None else dict(self.moments)}

    @classmethod
    def from_block(cls, block: object) -> Segment:
        """Inverse of `answer`; `ValueError` when it is not one (a peer's)."""
        if not isinstance(block, Mapping):
            raise ValueError("a segment is not an object")
        counts = [block.get(k) for k in ("requests", "with_stats", *SUM_KEYS)]
        hist, moments = block.get("acceptance_histogram"), block.get("moments")
        if not all(natural(c) for c in counts) or not isinstance(hist, list) or not all(
                natural(h) for h in hist) or not (moments is None or isinstance(
                    moments, Mapping) and all(natural(moments.get(k)) for k in MOMENTS)):
            raise ValueError("a segment's counts are not counts")
        sound = [c for c in counts if natural(c)]
        return cls(sound[0], sound[1], dict(zip(SUM_KEYS, sound[2:], strict=True)),
                   list(hist), None if moments is None else {k: moments[k] for k in MOMENTS})


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
    """A window's requests by dimension and value, at most MAX_SEGMENTS values (+ OTHER) each."""

    by: dict[str, dict[str, Segment]] = field(
        default_factory=lambda: {d: {} for d in DIMENSIONS})

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
        for dimension, value in keys_of(stats).items():
            self._slot(dimension, value).add(spec)

    def merge(self, other: Segments) -> None:
        """Add another tally's segments (overflow past MAX_SEGMENTS into OTHER)."""
        for dimension, values in other.by.items():
            for value, segment in values.items():
                self._slot(dimension, value).merge(segment)

    def answer(self, counters: Mapping[str, int] | None) -> dict[str, Any]:
        """`by`: each dimension's segments in order (`counters`: the window's increase)."""
        drafts = None if counters is None else counters.get("num_drafts")
        return {d: {v: s.answer(drafts) for v, s in _sorted(values).items()}
                for d, values in self.by.items()}

    @classmethod
    def from_block(cls, block: object, whole: Segment) -> Segments:
        """Inverse of `answer`; a block without segments (saved before them) puts `whole` in
        UNKNOWN of each dimension; `ValueError` when malformed or not summing to `whole`."""
        if block is None:
            return cls({d: {UNKNOWN: Segment(whole.requests, whole.with_stats, dict(whole.sums),
                                             list(whole.histogram), None)} for d in DIMENSIONS})
        if not isinstance(block, Mapping) or set(block) != set(DIMENSIONS):
            raise ValueError("its segments are not by " + ", ".join(DIMENSIONS))
        out = cls()
        for dimension in DIMENSIONS:
            values = block[dimension]
            if not isinstance(values, Mapping) or len(values) > MAX_SEGMENTS + 1:
                raise ValueError(f"its {dimension} segments are not a bounded object")
            total = Segment(moments=None)
            for value, segment in values.items():
                out.by[dimension][str(value)] = parsed = Segment.from_block(segment)
                total.merge(parsed)
            if (total.requests, total.with_stats, total.sums, total.histogram) != (
                    whole.requests, whole.with_stats, whole.sums, whole.histogram):
                raise ValueError(f"its {dimension} segments do not sum to its requests")
        return out
