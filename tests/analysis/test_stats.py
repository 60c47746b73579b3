"""Intervals and verdicts against published and hand-computed values."""

from __future__ import annotations

import math

import pytest

from exporter.analysis.stats import (
    Estimate,
    Verdict,
    Z,
    mean_interval,
    newcombe_difference,
    normal_difference,
    verdict,
    wilson,
)


class TestWilson:
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I.
    @pytest.mark.parametrize(
        ("successes", "trials", "low", "high"),
        [
            (81, 263, 0.2553, 0.3662),
            (15, 148, 0.0624, 0.1605),
            (0, 10, 0.0, 0.2775),
            (1, 29, 0.0061, 0.1718),
            (10, 10, 0.7225, 1.0),  # mirror of 0/10
        ],
    )
    def test_published(self, successes, trials, low, high):
        interval = wilson(successes, trials)
        assert interval.value == pytest.approx(successes / trials)
        assert interval.low == pytest.approx(low, abs=5e-5)
        assert interval.high == pytest.approx(high, abs=5e-5)

    def test_no_trials(self):
        assert wilson(0, 0) is None


class TestNewcombe:
    # Newcombe (1998), "Interval estimation for the difference between independent
    # proportions", Table II, method 10 (hybrid score from Wilson intervals).
    @pytest.mark.parametrize(
        ("b", "a", "low", "high"),
        [
            ((56, 70), (48, 80), 0.0524, 0.3339),
            ((9, 10), (3, 10), 0.1705, 0.8090),
            ((5, 56), (0, 29), -0.0381, 0.1926),
        ],
    )
    def test_published(self, b, a, low, high):
        diff = newcombe_difference(wilson(*a), wilson(*b))
        assert diff.value == pytest.approx(b[0] / b[1] - a[0] / a[1])
        assert diff.low == pytest.approx(low, abs=5e-5)
        assert diff.high == pytest.approx(high, abs=5e-5)

    def test_no_interval_no_bounds(self):
        assert newcombe_difference(Estimate(0.5), wilson(1, 2)).low is None


class TestNormal:
    def test_mean_interval(self):
        # X with p = (0.8, 0.5, 0.2): Var 1.05; 100 drafts: se = sqrt(0.0105) = 0.102470.
        interval = mean_interval(2.5, 1.05, 100)
        assert interval.se == pytest.approx(0.1024695, abs=1e-7)
        assert interval.low == pytest.approx(2.5 - 1.959964 * 0.1024695, abs=1e-6)
        assert interval.high == pytest.approx(2.7008, abs=1e-4)

    def test_difference(self):
        a = mean_interval(2.5, 1.05, 1000)
        b = mean_interval(2.2, 0.96, 1000)
        diff = normal_difference(a, b)
        se = math.sqrt(1.05 / 1000 + 0.96 / 1000)  # 0.0448330
        assert diff.value == pytest.approx(-0.3)
        assert diff.se == pytest.approx(se)
        assert diff.high == pytest.approx(-0.3 + Z * se)
        assert verdict(diff) is Verdict.WORSE

    def test_no_drafts(self):
        assert mean_interval(1.0, 0.0, 0) is None
        assert normal_difference(Estimate(1.0), Estimate(2.0)).low is None


class TestVerdict:
    @pytest.mark.parametrize(
        ("low", "high", "expected"),
        [
            (0.01, 0.2, Verdict.BETTER),
            (-0.2, -0.01, Verdict.WORSE),
            (-0.1, 0.1, Verdict.SAME),
            (0.0, 0.1, Verdict.SAME),  # touching 0 is not significant
            (None, None, Verdict.UNKNOWN),
        ],
    )
    def test_table(self, low, high, expected):
        assert verdict(Estimate(0.0, low, high)) is expected
