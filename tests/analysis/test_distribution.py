"""The distribution of accepted tokens per draft, against hand-computed tables."""

from __future__ import annotations

import pytest

from exporter.analysis.distribution import (
    distribution,
    is_non_increasing,
    isotonic_non_increasing,
    rates_from_mapping,
)


class TestDistribution:
    @pytest.mark.parametrize(
        ("rates", "probabilities", "mean", "variance"),
        [
            # P(X=j) = p_{j-1} - p_j: 1-0.8, 0.8-0.5, 0.5-0.2, 0.2-0.
            # E[X^2] = 0.3*1 + 0.3*4 + 0.2*9 = 3.3; Var = 3.3 - 1.5^2 = 1.05.
            ([0.8, 0.5, 0.2], [0.2, 0.3, 0.3, 0.2], 1.5, 1.05),
            # Everything accepted: X = 2 always.
            ([1.0, 1.0], [0.0, 0.0, 1.0], 2.0, 0.0),
            # Nothing accepted.
            ([0.0], [1.0, 0.0], 0.0, 0.0),
            # One position: Bernoulli(0.7), variance 0.7 * 0.3.
            ([0.7], [0.3, 0.7], 0.7, 0.21),
            # No positions at all: X = 0.
            ([], [1.0], 0.0, 0.0),
            # Seed numbers: 162/163 four times, 161/163 once.
            ([162 / 163] * 4 + [161 / 163], [1 / 163, 0, 0, 0, 1 / 163, 161 / 163],
             (4 * 162 + 161) / 163,
             (162 * (1 + 3 + 5 + 7) + 161 * 9) / 163 - ((4 * 162 + 161) / 163) ** 2),
        ],
    )
    def test_table(self, rates, probabilities, mean, variance):
        dist = distribution(rates)
        assert dist.monotone
        body = dist.as_dict()
        assert list(body["probabilities"].values()) == pytest.approx(probabilities, abs=1e-12)
        assert sum(body["probabilities"].values()) == pytest.approx(1.0)
        assert body["mean"] == pytest.approx(mean)
        assert dist.variance == pytest.approx(variance, abs=1e-12)
        assert body["variance"] == pytest.approx(variance, abs=1e-12)

    def test_non_monotone_input_is_flagged_and_fitted(self):
        dist = distribution([0.9, 0.5, 0.7, 0.3])
        assert not dist.monotone
        assert dist.measured == (0.9, 0.5, 0.7, 0.3)
        # 0.5 and 0.7 pool to their mean 0.6.
        assert dist.rates == pytest.approx((0.9, 0.6, 0.6, 0.3))
        body = dist.as_dict()
        assert list(body["probabilities"].values()) == pytest.approx([0.1, 0.3, 0.0, 0.3, 0.3])
        assert body["monotone"] is False and "isotonic" in body["note"]
        assert list(body["probabilities"]) == ["0", "1", "2", "3", "4"]

    def test_rates_outside_0_1_are_clamped(self):
        dist = distribution([1.2, -0.1])
        assert dist.rates == (1.0, 0.0)
        assert list(dist.as_dict()["probabilities"].values()) == [0.0, 1.0, 0.0]


class TestIsotonic:
    @pytest.mark.parametrize(
        ("values", "fitted"),
        [
            ([0.9, 0.6, 0.3], [0.9, 0.6, 0.3]),  # already monotone: unchanged
            ([0.5, 0.6, 0.7], [0.6, 0.6, 0.6]),  # rising throughout: one block
            # 0.4, 0.5 pool to 0.45; 0.9 rises above it: (0.4 + 0.5 + 0.9) / 3 = 0.6.
            ([0.4, 0.5, 0.9, 0.1], [0.6, 0.6, 0.6, 0.1]),
            ([], []),
        ],
    )
    def test_pool_adjacent_violators(self, values, fitted):
        result = isotonic_non_increasing(values)
        assert result == pytest.approx(fitted)
        assert is_non_increasing(result)

    def test_float_noise_is_not_a_violation(self):
        assert is_non_increasing([0.3, 0.3 + 1e-15])


class TestRatesFromMapping:
    def test_numeric_order_and_gaps(self):
        mapping = {"10": 0.1, "2": 0.5, "0": 0.9, "1": 0.7}
        rates = rates_from_mapping(mapping)
        assert rates[:3] == [0.9, 0.7, 0.5]
        assert rates[3:10] == [0.0] * 7  # positions nobody reported accepted nothing
        assert rates[10] == 0.1

    def test_empty(self):
        assert rates_from_mapping({}) == []

    @pytest.mark.parametrize("k", [1, 3, 8, 64, 65])
    def test_in_order_keys_read_as_any_order(self, k):
        # Keys 0..k-1 in order (our answers, AISBench's files) take a shortcut: the same list.
        rates = [1 / (p + 2) for p in range(k)]
        texts = {str(p): r for p, r in enumerate(rates)}
        assert rates_from_mapping(texts) == rates
        assert rates_from_mapping(dict(reversed(texts.items()))) == rates
        assert rates_from_mapping(dict(enumerate(rates))) == rates
        assert rates_from_mapping({p: int(p % 2) for p in range(k)}) == [
            float(p % 2) for p in range(k)]
        assert all(type(r) is float for r in rates_from_mapping({"0": 1, "1": 0}))

    def test_out_of_range_still_refused(self):
        with pytest.raises(ValueError):
            rates_from_mapping({"-1": 0.5, "0": 0.4})
