"""exporter/core/tallies.py: fixed-width buckets, their quantiles within the stated error, and
their exact merge."""

from __future__ import annotations

import json
import random

import pytest
from quantiles import exact_quantile

from exporter.core.tallies import Buckets


class TestBuckets:
    @pytest.mark.parametrize("seed", range(6))
    @pytest.mark.parametrize("width", [0.01, 0.001])
    def test_quantiles_are_within_half_a_bucket_of_the_exact_ones(self, seed: int,
                                                                  width: float) -> None:
        rng = random.Random(seed)
        values = [rng.uniform(0.0, 1.0) * rng.choice((1, 5)) for _ in range(rng.randint(1, 800))]
        tally = Buckets(width)
        for v in values:
            tally.add(v)
        summary = tally.summary()
        assert summary is not None
        assert (summary["min"], summary["max"]) == (min(values), max(values))
        assert summary["mean"] == pytest.approx(sum(values) / len(values), rel=1e-12)
        for key, q in (("p5", 0.05), ("p50", 0.5), ("p95", 0.95)):
            assert abs(summary[key] - exact_quantile(values, q)) <= width / 2 + 1e-12

    def test_a_merge_is_the_tally_of_both(self) -> None:
        a, b, both = Buckets(0.01), Buckets(0.01), Buckets(0.01)
        for i, v in enumerate(1 + (i * 37 % 300) / 100 for i in range(500)):
            (a if i % 3 else b).add(v)
            both.add(v)
        a.merge(b)
        assert (a.counts, a.count, a.low, a.high) == (both.counts, both.count, both.low,
                                                      both.high)
        assert a.summary() == pytest.approx(both.summary())
        with pytest.raises(ValueError):
            a.merge(Buckets(0.001))

    def test_empty_has_no_summary_and_round_trips(self) -> None:
        empty = Buckets(0.01)
        assert empty.summary() is None
        assert Buckets.from_dict(json.loads(json.dumps(empty.to_dict())), 0.01) == empty

    @pytest.mark.parametrize("bad", [
        None, {"width": 0.1}, {"counts": {"3": -1}, "count": -1}, {"counts": {"3": 2}, "count": 1},
        {"counts": {"x": 1}, "count": 1}, {"sum": "a"}, {"min": None}, {"min": 3.0, "max": 1.0}])
    def test_a_malformed_tally_is_refused(self, bad: object) -> None:
        tally = Buckets(0.01)
        tally.add(1.5)
        data = tally.to_dict() | bad if isinstance(bad, dict) else bad
        with pytest.raises(ValueError):
            Buckets.from_dict(data, 0.01)  # type: ignore[arg-type]
