"""The live histogram of per-request acceptance length per target: every answer the recording
proxy reads with a spec-decode object, in or out of a window."""

from __future__ import annotations

import bisect
from itertools import accumulate
from typing import Any

from exporter.core.answershapes import is_partial
from exporter.core.perrequest import RequestStats
from exporter.web.families import Family, label_text, line

# Tokens per verify step: 1 (nothing accepted) up to k + 1. The buckets stay few and fixed so
# that a target adds a bounded number of series whatever its traffic.
BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)

REQUEST_LENGTH = Family(
    "specdec_request_acceptance_length", "histogram",
    "Per-request acceptance length (1 + accepted draft tokens / verify steps) of the answers "
    "the recording proxy relayed for the target, read from vLLM's metrics.speculative_decoding.")


def request_length(spec: dict[str, Any]) -> float:
    """A request's acceptance length from its spec-decode object (1.0 with no verify step)."""
    steps = spec["num_spec_steps"]
    return 1 + spec["num_accepted_draft_tokens"] / steps if steps else 1.0


class _Histogram:
    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # per bucket, not cumulative; the last: past all
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.total += value


class RequestLengths:
    """Per-target histograms of the proxied requests' acceptance length."""

    def __init__(self) -> None:
        self._targets: dict[str, _Histogram] = {}
        self._labels: dict[str, dict[str, str]] = {}  # each target's config labels

    def observe(self, target: str, stats: RequestStats | None) -> None:
        """Count one proxied answer; one without spec-decode figures, or whose engine does not
        report its steps (llama.cpp), is not a sample."""
        if stats is not None and stats.spec is not None and not is_partial(stats.spec):
            self._targets.setdefault(target, _Histogram()).observe(request_length(stats.spec))

    def keep(self, targets: dict[str, dict[str, str]]) -> None:
        """The configured targets' labels; the others are forgotten (their series leave)."""
        self._labels = dict(targets)
        for name in set(self._targets) - set(targets):
            del self._targets[name]

    def lines(self, openmetrics: bool = False) -> list[str]:
        """The family's text; nothing while no target has a sample (no data: absent)."""
        if not self._targets:
            return []
        name = REQUEST_LENGTH.name
        out = [REQUEST_LENGTH.header(openmetrics)]
        for target, hist in sorted(self._targets.items()):
            labels = label_text({"target": target} | self._labels.get(target, {}))
            for bound, running in zip((*BUCKETS, "+Inf"), accumulate(hist.counts), strict=True):
                out.append(line(f"{name}_bucket", f'{labels},le="{bound}"', running))
            out.append(line(f"{name}_sum", labels, hist.total))
            out.append(line(f"{name}_count", labels, sum(hist.counts)))
        return out
