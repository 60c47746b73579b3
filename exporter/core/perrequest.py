"""Per-request spec-decode figures, pure: read from one OpenAI answer (vLLM's
`metrics.speculative_decoding`, in the JSON body or a chunk of the event stream, with
`--per-request-spec-decode-metrics`; or another engine's shape, answershapes.py), tallied over
a window's requests within fixed bounds, merged over targets and shards, and printed.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any

from exporter.core.answershapes import SUM_KEYS as SUM_KEYS
from exporter.core.answershapes import engine_spec, is_partial
from exporter.core.isotime import iso_utc
from exporter.core.segments import DIMENSIONS, RequestContext, Segment, Segments, keys_of
from exporter.core.segments import NOTES as SEGMENT_NOTES
from exporter.core.tallies import Buckets, add_counts, finite
from exporter.core.timing import Clock, SplitTimings, Timing, Timings, server_timing
from exporter.core.unreadable import MAX_HISTOGRAM as MAX_HISTOGRAM
from exporter.core.unreadable import Unreadable as Unreadable
from exporter.core.unreadable import as_count

NO_STATS_REASON = "start vLLM with --per-request-spec-decode-metrics summary"
LOWEST = 10
# Finish times kept per target and window (24 bytes a request; those of requests before the
# target's last scrape go unless it showed a restart): past this many the span figures say
# they are incomplete rather than growing without bound.
MAX_TIMES = 50_000
# Bucket widths: a quantile over requests is within half of one of the exact (docs/api.md).
LENGTH_WIDTH = 0.01
RATE_WIDTH = 0.001


@dataclass(frozen=True)
class RequestStats:
    """One answer's figures: who asked, what it cost, and its spec-decode object (or None);
    or, with `unreadable` set, why its figures could not be read."""

    request_id: str
    model: str
    prompt_tokens: int | None
    completion_tokens: int | None
    spec: dict[str, Any] | None
    unreadable: Unreadable | None = None
    timing: Timing | None = None  # the server's own timings, then with the proxy's (`timed`)
    context: RequestContext | None = None  # the proxy's, as the request started

    @classmethod
    def unread(cls, reason: Unreadable) -> RequestStats:
        """An answer whose figures could not be read, and why."""
        return cls("", "", None, None, None, reason)

    def timed(self, clock: Clock, streamed: bool) -> RequestStats:
        """With the proxy's clock on the answer filling what the server did not time."""
        if self.unreadable is not None:
            return self
        return replace(self, timing=clock.timing(self.timing, self.completion_tokens, streamed))


def _merge(into: dict[str, Any], obj: dict[str, Any]) -> None:
    """Fold one answer object (a body or a stream chunk) into the request's fields."""
    if isinstance(obj.get("id"), str):
        into.setdefault("id", obj["id"])
    if isinstance(obj.get("model"), str):
        into.setdefault("model", obj["model"])
    usage = obj.get("usage")
    if isinstance(usage, dict):
        into["usage"] = usage
    if (timing := server_timing(obj.get("metrics"))) is not None:
        into["timing"] = timing
    spec = engine_spec(obj)
    if isinstance(spec, Unreadable):
        into.setdefault("unreadable", spec)
    elif spec is not None:
        into["spec"] = spec


def _stats(fields: dict[str, Any]) -> RequestStats:
    if "unreadable" in fields:
        return RequestStats.unread(fields["unreadable"])
    usage = fields.get("usage") or {}
    return RequestStats(
        request_id=str(fields.get("id", "")), model=str(fields.get("model", "")),
        prompt_tokens=as_count(usage.get("prompt_tokens")),
        completion_tokens=as_count(usage.get("completion_tokens")),
        spec=fields.get("spec"), timing=fields.get("timing"))


def _decoded(data: bytes) -> dict[str, Any] | Unreadable:
    """The JSON object `data` holds, or why it holds none."""
    try:
        obj = json.loads(data)
    except RecursionError:
        return Unreadable.TOO_DEEP
    except ValueError:  # UnicodeDecodeError too
        return Unreadable.NOT_AN_ANSWER
    return obj if isinstance(obj, dict) else Unreadable.NOT_AN_ANSWER


def from_json(body: bytes) -> RequestStats:
    """A non-streamed answer's figures; unreadable when the body is no OpenAI answer object."""
    obj = _decoded(body)
    if isinstance(obj, Unreadable):
        return RequestStats.unread(obj)
    fields: dict[str, Any] = {}
    _merge(fields, obj)
    return _stats(fields)


# What a chunk read here names: usage, and each engine's figures (vLLM, SGLang, llama.cpp).
_READ_KEYS = (b'"usage"', b'"metrics"', b'"sglext"', b'"timings"')


def from_sse(stream: bytes) -> RequestStats:
    """A streamed answer's figures from its `data:` events; unreadable when the stream is cut
    (mid-event, or before `data: [DONE]`) or no event is JSON."""
    stream = stream.replace(b"\r\n", b"\n")
    if stream and not stream.endswith(b"\n\n"):
        return RequestStats.unread(Unreadable.CUT_MID_EVENT)
    fields: dict[str, Any] = {}
    seen = done = False
    for line in stream.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        # Once id and model are known, a token chunk carries nothing read here: decoding every
        # one held the proxy's loop (and every other stream through it) after each answer.
        if "model" in fields and "id" in fields and not any(key in data for key in _READ_KEYS):
            continue
        obj = _decoded(data)
        if obj is Unreadable.TOO_DEEP:
            return RequestStats.unread(Unreadable.TOO_DEEP)
        if isinstance(obj, dict):
            seen = True
            _merge(fields, obj)
    if not done:
        return RequestStats.unread(Unreadable.NO_DONE)
    return _stats(fields) if seen else RequestStats.unread(Unreadable.NOT_AN_ANSWER)


def per_position_accepted(histogram: list[int]) -> list[int]:
    """Steps that accepted position i: the steps that accepted more than i draft tokens."""
    return list(accumulate(reversed(histogram[1:])))[::-1]  # suffix sums: linear


def _reasons(reasons: object) -> dict[str, int]:
    """A block's `unreadable_reasons` as `answer` writes them, or `ValueError` (a peer's)."""
    known = {reason.value for reason in Unreadable}
    if not isinstance(reasons, Mapping) or any(
            k not in known or as_count(n) is None for k, n in reasons.items()):
        raise ValueError("its unreadable reasons are not counts of known reasons")
    return dict(reasons)


def _lowest_row(row: object) -> dict[str, Any]:
    """A `lowest` entry as we write it, or `ValueError` (a peer's)."""
    if not isinstance(row, Mapping) or not isinstance(row.get("request_id"), str) or (
            not isinstance(row.get("model"), str)) or not finite(row.get("acceptance_length")):
        raise ValueError("a lowest request is malformed")
    tokens = {k: row.get(k) for k in ("prompt_tokens", "completion_tokens")}
    if any(v is not None and as_count(v) is None for v in tokens.values()):
        raise ValueError("a lowest request's tokens are not counts")
    return {"request_id": row["request_id"], "model": row["model"], **tokens,
            "acceptance_length": float(row["acceptance_length"])}


@dataclass
class PerRequest:
    """What one window saw through the proxy for one target (or, merged, for all), bounded:
    exact sums and histogram, bucketed lengths and rates, the LOWEST requests, and the finish
    times of recent requests only."""

    requests: int = 0
    unreadable: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # unreadable, by Unreadable
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SUM_KEYS, 0))
    histogram: list[int] = field(default_factory=list)
    lengths: Buckets = field(default_factory=lambda: Buckets(LENGTH_WIDTH))
    rates: Buckets = field(default_factory=lambda: Buckets(RATE_WIDTH))
    rows: list[dict[str, Any]] = field(default_factory=list)
    timing: Timings = field(default_factory=Timings)  # every answer timed, with figures or not
    # Requests whose engine reports drafted and accepted tokens but not its steps or histogram
    # (llama.cpp): in the token sums and rates, not in the steps, histogram or lengths.
    partial: int = 0
    # When each request with figures finished, with what it drafted and accepted: the first
    # `kept` were finished before a scrape that showed a server restart (what its unobserved
    # span held, `in_spans`), the rest after the target's last scrape.
    finished: array[float] = field(default_factory=lambda: array("d"))
    drafted: array[int] = field(default_factory=lambda: array("q"))
    accepted: array[int] = field(default_factory=lambda: array("q"))
    kept: int = 0
    overflowed: bool = False  # a finish time was not kept (MAX_TIMES)
    by: Segments = field(default_factory=Segments)
    timing_by: SplitTimings = field(default_factory=SplitTimings)

    def record(self, stats: RequestStats, at: float | None = None) -> None:
        """Count one proxied request, finished at `at` (unreadable, with its reason, or not)."""
        self.requests += 1
        self.by.record(stats)
        if stats.unreadable is not None:
            self.unreadable += 1
            self.reasons[stats.unreadable] = self.reasons.get(stats.unreadable, 0) + 1
            return
        if stats.timing is not None:
            self.timing.add(stats.timing)
            self.timing_by.add(dict(zip(DIMENSIONS, keys_of(stats), strict=True)), stats.timing)
        spec = stats.spec
        if spec is None:
            return
        drafted, accepted = spec["num_draft_tokens"], spec["num_accepted_draft_tokens"]
        if at is not None:
            if len(self.finished) < MAX_TIMES:
                self.finished.append(at)
                self.drafted.append(drafted)
                self.accepted.append(accepted)
            else:
                self.overflowed = True
        self.sums["num_draft_tokens"] += drafted
        self.sums["num_accepted_draft_tokens"] += accepted
        if drafted:
            self.rates.add(accepted / drafted)
        if is_partial(spec):  # no steps or histogram: its tokens and rate only
            self.partial += 1
            return
        steps = spec["num_spec_steps"]
        self.sums["num_spec_steps"] += steps
        add_counts(self.histogram, spec["acceptance_histogram"])
        length = 1 + accepted / steps if steps else 1.0
        self.lengths.add(length)
        if len(self.rows) < LOWEST or length < self.rows[-1]["acceptance_length"]:
            self._keep_lowest([{"request_id": stats.request_id, "model": stats.model,
                                "prompt_tokens": stats.prompt_tokens,
                                "completion_tokens": stats.completion_tokens,
                                "acceptance_length": length}])

    def _keep_lowest(self, rows: list[dict[str, Any]]) -> None:
        self.rows = sorted(self.rows + rows, key=lambda r: r["acceptance_length"])[:LOWEST]

    def scraped(self, at: float, restarted: bool) -> None:
        """The window took a scrape of the target at `at`: the times before it are kept if it
        showed a server restart (they may lie in its unobserved span), else let go."""
        keep = range(self.kept) if not restarted else [
            i for i, t in enumerate(self.finished) if i < self.kept or t < at]
        later = [i for i in range(self.kept, len(self.finished)) if self.finished[i] >= at]
        order = [*keep, *later]
        if len(order) != len(self.finished):
            for name in ("finished", "drafted", "accepted"):
                values = getattr(self, name)
                setattr(self, name, array(values.typecode, [values[i] for i in order]))
        self.kept = len(keep)

    def merge(self, other: PerRequest) -> None:
        """Add another target's figures (for the aggregate); finish times stay each target's."""
        self.requests += other.requests
        self.unreadable += other.unreadable
        self.partial += other.partial
        for reason, count in other.reasons.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + count
        for key in SUM_KEYS:
            self.sums[key] += other.sums[key]
        add_counts(self.histogram, other.histogram)
        self.by.merge(other.by)
        self.lengths.merge(other.lengths)
        self.rates.merge(other.rates)
        self.timing.merge(other.timing)
        self.timing_by.merge(other.timing_by)
        self._keep_lowest(other.rows)

    def answer(self, counters: dict[str, int] | None = None) -> dict[str, Any]:
        """The `per_request` block; `counters` (drafts, draft and accepted tokens of the
        window's counter increase) gives `covers_all` and the share the proxy accounts for."""
        with_stats = self.lengths.count + self.partial
        without = self.requests - self.unreadable - with_stats
        steps = self.sums["num_spec_steps"]
        block: dict[str, Any] = {
            "requests": self.requests, "with_stats": with_stats, "without_stats": without,
            "unreadable": self.unreadable,
            "unreadable_reasons": {str(k): n for k, n in sorted(self.reasons.items())},
            "without_steps": self.partial,
            "reason": NO_STATS_REASON if self.requests and not with_stats else None,
            **self.sums, "acceptance_histogram": list(self.histogram),
            "per_position_acceptance_rates": {
                str(i): n / steps for i, n in enumerate(per_position_accepted(self.histogram))
            } if steps else {},
            "weighting": "request-weighted (each request counts once)",
            "acceptance_length": self.lengths.summary(),
            "draft_acceptance_rate": self.rates.summary(),
            "lowest": list(self.rows),
            "buckets": {"acceptance_length": self.lengths.to_dict(),
                        "draft_acceptance_rate": self.rates.to_dict()},
            "timing": self.timing.answer(), "timing_by": self.timing_by.answer(),
        }
        if counters is not None:
            block.update(coverage(self.sums, counters))
        return block | {"by": self.by.answer(counters), "by_notes": SEGMENT_NOTES}

    @classmethod
    def from_block(cls, block: object) -> PerRequest:
        """The tally a `per_request` block (`answer`) was made from, without finish times;
        `ValueError` when it is not one (a peer's)."""
        if not isinstance(block, Mapping) or not isinstance(block.get("buckets"), Mapping):
            raise ValueError("not a per-request block")
        counts = [as_count(block.get(k)) for k in ("requests", "unreadable", *SUM_KEYS)]
        counts.append(as_count(block.get("without_steps", 0)))  # none in an older peer's
        hist = block.get("acceptance_histogram")
        rows = block.get("lowest")
        if not isinstance(hist, list) or not isinstance(rows, list) or None in counts or any(
                as_count(h) is None for h in hist):
            raise ValueError("its counts are not counts")
        sound = [c for c in counts if c is not None]
        buckets = block["buckets"]
        acc = cls(requests=sound[0], unreadable=sound[1],
                  sums=dict(zip(SUM_KEYS, sound[2:5], strict=True)), partial=sound[5],
                  histogram=list(hist),
                  lengths=Buckets.from_dict(buckets.get("acceptance_length"), LENGTH_WIDTH),
                  rates=Buckets.from_dict(buckets.get("draft_acceptance_rate"), RATE_WIDTH),
                  rows=[_lowest_row(r) for r in rows[:LOWEST]],
                  reasons=_reasons(block.get("unreadable_reasons", {})),
                  timing=Timings.from_block(block.get("timing")))
        acc.timing_by = SplitTimings.from_block(block.get("timing_by"), acc.timing.timed)
        if acc.timing.timed > acc.requests:
            raise ValueError("more timed requests than requests")
        if acc.unreadable + acc.lengths.count + acc.partial > acc.requests or (
                sum(acc.reasons.values()) > acc.unreadable):
            raise ValueError("more requests with figures than requests")
        acc.by = Segments.from_block(block.get("by"), Segment.totals(
            acc.requests, acc.lengths.count + acc.partial, acc.sums, acc.histogram))
        return acc

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state, saved with the open window (`from_dict`)."""
        return self.answer() | {"times": [list(self.finished), list(self.drafted),
                                          list(self.accepted)],
                                "kept": self.kept, "overflowed": self.overflowed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PerRequest:
        """Inverse of `to_dict`."""
        acc = cls.from_block(data)
        finished, drafted, accepted = data["times"]
        acc.finished, acc.drafted = array("d", finished), array("q", drafted)
        acc.accepted, acc.kept = array("q", accepted), int(data["kept"])
        acc.overflowed = bool(data["overflowed"])
        return acc


def coverage(sums: dict[str, int], counters: dict[str, int]) -> dict[str, Any]:
    """Whether the proxied requests are all of the server's activity, what share they are,
    and which side missed activity when not: `counters` (more proxied than counted: a restart
    the counters lost) or `proxy` (other clients, a warm-up outside it)."""
    pairs = {"num_spec_steps": counters.get("num_drafts", 0),
             "num_draft_tokens": counters.get("draft_tokens", 0),
             "num_accepted_draft_tokens": counters.get("accepted_tokens", 0)}
    drafts = pairs["num_spec_steps"]
    covers = all(sums[k] == v for k, v in pairs.items())
    missed = None if covers else (
        "counters" if any(sums[k] > v for k, v in pairs.items()) else "proxy")
    return {"covers_all": covers, "missed_by": missed,
            "share_of_drafts": sums["num_spec_steps"] / drafts if drafts else None}


_STATS = ("mean", "min", "p5", "p50", "p95", "max")


def format_block(name: str, block: dict[str, Any]) -> str:
    """One target's per-request section: a table over requests and a one-line histogram."""
    title = f"========== Per-request spec decode  [{name}] =========="
    lines = ["", title,
             f"{'Requests (proxied / with stats)':46}{block['requests']} / {block['with_stats']}"]
    if block.get("reason"):
        lines.append(f"{'Reason':46}{block['reason']}")
    if block.get("unreadable"):
        why = ", ".join(f"{k} {n}" for k, n in (block.get("unreadable_reasons") or {}).items())
        lines.append(f"{'Unreadable answers':46}{block['unreadable']}"
                     + (f" ({why})" if why else ""))
    if block.get("acceptance_length"):
        lines.append(f"{'Over requests (request-weighted)':46}"
                     + "".join(f"{s:>8}" for s in _STATS))
        for key, label in (("acceptance_length", "Acceptance length"),
                           ("draft_acceptance_rate", "Draft acceptance rate")):
            figures = block.get(key) or {}
            if figures:
                lines.append(f"{label:46}" + "".join(f"{figures[s]:8.2f}" for s in _STATS))
        hist = " ".join(f"{j}:{n}" for j, n in enumerate(block["acceptance_histogram"]))
        lines.append(f"{'Acceptance histogram (steps by accepted)':46}{hist}")
    spans = block.get("unobserved")
    for span in spans if isinstance(spans, list) else [spans] if spans else []:
        where = (f"{iso_utc(span['from'])} to {iso_utc(span['to'])}" if "from" in span
                 else f"{span['spans']} span(s)")
        lines.append(f"{'In the unobserved span':46}{where}: {span['requests']} requests, "
                     f"{span['num_draft_tokens']} drafted, {span['num_accepted_draft_tokens']}"
                     " accepted" + ("" if span["complete"] else " (at least)"))
    if "covers_all" in block:
        lines.append(f"{'Proxy saw all the server activity':46}{_cross_check(block)}")
    return "\n".join(lines) + "\n"


def _cross_check(block: Mapping[str, Any]) -> str:
    """Yes, or which side missed activity: the counters (across a restart) or the proxy."""
    if block["covers_all"]:
        return "yes"
    share = block.get("share_of_drafts")
    of = f"{100 * share:.1f}% of the counted drafts" if share is not None else "drafts"
    if block.get("missed_by") == "counters":
        return f"no: the counters missed activity the proxy saw ({of}; a restart lost it)"
    return f"no: the server had activity the proxy did not see (it saw {of})"


def format_per_request(answer: dict[str, Any]) -> str:
    """Each target's per-request section of a window's answer, then `all` for two or more."""
    per_request = answer.get("per_request")
    if not isinstance(per_request, dict):
        return ""
    targets = per_request.get("targets") or {}
    text = "".join(format_block(name, block) for name, block in targets.items())
    if len(targets) >= 2:
        text += format_block("all", per_request["aggregate"])
    return text
