"""Tests of `compare` segment by segment: the aggregate's segments of A and B lined up."""

from __future__ import annotations

from typing import Any

from exporter.analysis.compare import compare_answers
from exporter.core.perrequest import PerRequest, RequestStats
from exporter.core.segments import request_context


def _answer(accepted_per_step: dict[str, int], requests: int = 20) -> dict[str, Any]:
    """A window answer whose proxied requests by tag accept this many tokens at each step,
    alternating one more and one fewer (k = 3, 4 steps a request)."""
    acc = PerRequest()
    for tag, accepted in accepted_per_step.items():
        for i in range(requests):
            steps = [min(3, max(0, accepted + (1 if (i + j) % 2 else -1))) for j in range(4)]
            histogram = [steps.count(n) for n in range(4)]
            spec = {"num_spec_steps": 4, "num_draft_tokens": 12,
                    "num_accepted_draft_tokens": sum(steps), "acceptance_histogram": histogram}
            acc.record(RequestStats("r", "m", 10, 4, spec,
                                    context=request_context(tag, b"{}", 1 + i % 3)))
    return {"results": {}, "per_request": {"aggregate": acc.answer()}}


class TestCompareSegments:
    def test_each_segment_in_both_gets_a_difference_and_a_verdict(self) -> None:
        a = _answer({"same": 2, "falls": 2, "only_a": 1})
        b = _answer({"same": 2, "falls": 1, "only_b": 1})
        tags = {row["value"]: row for row in compare_answers(a, b)["segments"]["tag"]}
        assert set(tags) == {"same", "falls"}
        assert tags["same"]["verdict"] == "no significant difference"
        assert tags["same"]["difference"]["value"] == 0
        falls = tags["falls"]
        assert falls["verdict"] == "worse" and falls["difference"]["high"] < 0
        assert (falls["a_requests"], falls["b_requests"]) == (20, 20)

    def test_a_segment_too_small_on_one_side_is_unknown_not_compared(self) -> None:
        a = _answer({"t": 2}, requests=20)
        b = _answer({"t": 2}, requests=5)
        row = compare_answers(a, b)["segments"]["tag"][0]
        assert row["b"] is None and row["difference"] is None and row["verdict"] == "unknown"

    def test_windows_without_the_proxy_have_no_segments(self) -> None:
        assert compare_answers({"results": {}}, {"results": {}})["segments"] == {}
