"""A window's `per_request` block, pure: each proxied target's tally against its RESULT (the
requests inside its unobserved restart spans too), and the aggregate over targets, made the
same way from this exporter's tallies and from every shard's blocks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from exporter.core.perrequest import PerRequest
from exporter.core.tallies import finite, natural


def in_spans(acc: PerRequest, spans: Iterable[object]) -> list[dict[str, Any]]:
    """Per unobserved span of a restart (`from`, `to`), the proxied requests that finished in
    it and what they drafted and accepted; malformed spans (a peer's) are skipped."""
    out = []
    for span in spans:
        start = span.get("from") if isinstance(span, Mapping) else None
        end = span.get("to") if isinstance(span, Mapping) else None
        if not isinstance(start, int | float) or not isinstance(end, int | float):
            continue
        inside = [i for i, t in enumerate(acc.finished) if start <= t <= end]
        out.append({"from": start, "to": end, "requests": len(inside),
                    "num_draft_tokens": sum(acc.drafted[i] for i in inside),
                    "num_accepted_draft_tokens": sum(acc.accepted[i] for i in inside),
                    "complete": not acc.overflowed})
    return out


_SPAN_SUMS = ("requests", "num_draft_tokens", "num_accepted_draft_tokens")


def span_totals(spans: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The aggregate's sums over every target's unobserved spans."""
    spans = list(spans)
    return {"spans": len(spans), **{key: sum(s[key] for s in spans) for key in _SPAN_SUMS},
            "complete": all(s["complete"] for s in spans)}


def _vetted_spans(spans: object) -> list[dict[str, Any]]:
    """A block's `unobserved` as `in_spans` writes it, or `ValueError` (a peer's)."""
    if not isinstance(spans, list):
        raise ValueError("its unobserved spans are not a list")
    out = []
    for span in spans:
        timed = isinstance(span, Mapping) and all(finite(span.get(k)) for k in ("from", "to"))
        if not timed or any(not natural(span.get(k)) for k in _SPAN_SUMS):
            raise ValueError("an unobserved span is malformed")
        out.append({k: span[k] for k in ("from", "to", *_SPAN_SUMS)}
                   | {"complete": span.get("complete") is True})
    return out


def _counters(result: object) -> dict[str, int] | None:
    """A RESULT's counts (`data`), None when there is no RESULT (an open window)."""
    if not isinstance(result, Mapping):
        return None
    data = result.get("data")
    return dict(data) if isinstance(data, Mapping) else {}


def per_request_block(tallies: Mapping[str, PerRequest],
                      answer: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """A window's `per_request` (None if the proxy saw none of its requests); against the
    RESULTs of its stop `answer` when it has one."""
    if not tallies:
        return None
    results = (answer or {}).get("results") or {}
    targets = {name: acc.answer() for name, acc in sorted(tallies.items())}
    for name, block in targets.items():
        spans = (results.get(name) or {}).get("unobserved")
        if isinstance(spans, list) and spans:
            block["unobserved"] = in_spans(tallies[name], spans)
    return merged_block(targets, answer if results else None)


def merged_block(blocks: Mapping[str, Mapping[str, Any]],
                 answer: Mapping[str, Any] | None) -> dict[str, Any]:
    """`per_request` from its targets' blocks (this exporter's or every shard's), each made
    again from its tally against `answer`'s RESULTs (when stopped); `ValueError` if one is
    malformed."""
    results = (answer or {}).get("results") or {}
    total, targets, holes = PerRequest(), {}, []
    for name, block in blocks.items():
        acc = PerRequest.from_block(block)
        total.merge(acc)
        targets[name] = acc.answer(_counters(results.get(name, {})) if answer else None)
        if "unobserved" in block:
            targets[name]["unobserved"] = _vetted_spans(block["unobserved"])
            holes += targets[name]["unobserved"]
    aggregate = total.answer(_counters(answer.get("aggregate", {})) if answer else None)
    if holes:
        aggregate["unobserved"] = span_totals(holes)
    return {"targets": targets, "aggregate": aggregate}
