"""Running-requests bands: which band an interval is in, their labels, JSON and row forms."""

from __future__ import annotations

import pytest

from exporter.core.loadbands import (
    UNKNOWN,
    band_label,
    band_of,
    bands_from_json,
    bands_from_row,
    bands_json,
    bands_row,
    interval_band,
    reported,
    summed,
    with_interval,
)
from exporter.core.snapshot import Counts


class TestIntervalBand:
    @pytest.mark.parametrize("before, after, band", [
        (0, 0, 0), (0, 0.9, 0), (0, 1, 1),  # the mean 0.5 rounds half up
        (1, 1, 1), (1, 2, 2), (2, 3, 2), (3, 4, 4), (7, 7, 4), (7, 8, 8), (15, 15, 8),
        (16, 16, 16), (1000, 1000, 512),
        (None, 5, 4), (5, None, 4), (None, 0, 0), (None, None, UNKNOWN),
    ])
    def test_band_of_the_mean_of_the_two_readings(self, before, after, band):
        assert interval_band(before, after) == band


class TestLabels:
    @pytest.mark.parametrize("band, label", [
        (0, "0"), (1, "1"), (2, "2-3"), (4, "4-7"), (64, "64-127"), (UNKNOWN, "unknown")])
    def test_label_and_back(self, band, label):
        assert band_label(band) == label
        assert band_of(label) == band

    @pytest.mark.parametrize("label", ["3", "2-4", "x", "4-7 "])
    def test_not_a_band(self, label):
        with pytest.raises(ValueError):
            band_of(label)


A = Counts(10, 30, 18, {0: 9, 1: 6, 2: 3})
B = Counts(4, 12, 2, {0: 2, 1: 0, 2: 0})


class TestSums:
    def test_intervals_add_up_per_band(self):
        bands = with_interval({}, 2, A)
        bands = with_interval(bands, 2, B)
        bands = with_interval(bands, 0, B)
        assert bands == {2: (2, A + B), 0: (1, B)}

    def test_targets_summed_band_by_band(self):
        assert summed([{1: (1, A)}, {1: (2, B), UNKNOWN: (3, A)}]) == {
            1: (3, A + B), UNKNOWN: (3, A)}

    def test_targets_of_other_positions_and_uneven_engines_sum_as_their_additions(self):
        # Past the common case (every part with the same positions): the additions in order.
        short = Counts(5, 10, 4, {0: 3, 1: 1})
        uneven = Counts(6, 18, 7, {0: 4, 1: 2, 2: 1}, {2: 2})
        parts = [{4: (1, A)}, {4: (2, short)}, {4: (1, uneven)}, {4: (1, B)}]
        assert summed(parts) == {4: (5, Counts() + A + short + uneven + B)}
        # Position 2: the drafts of the parts with a series for it (short has none).
        assert summed(parts)[4][1].position_drafts == {2: 10 + 2 + 4}

    def test_only_unknown_reports_nothing(self):
        assert not reported({UNKNOWN: (3, A)})
        assert not reported({})
        assert reported({0: (1, A), UNKNOWN: (3, A)})


class TestForms:
    def test_json_in_band_order_with_figures(self):
        body = bands_json({UNKNOWN: (1, B), 4: (2, A), 0: (3, B)})
        assert list(body) == ["0", "4-7", "unknown"]
        entry = body["4-7"]
        assert entry["intervals"] == 2
        assert entry["num_drafts"] == 10 and entry["accepted_tokens"] == 18
        assert entry["acceptance_length"] == pytest.approx(2.8)
        assert entry["acceptance_rate"] == pytest.approx(60.0)
        assert entry["per_position_acceptance_rates"] == {"0": 0.9, "1": 0.6, "2": 0.3}
        assert bands_from_json(body) == {UNKNOWN: (1, B), 4: (2, A), 0: (3, B)}

    @pytest.mark.parametrize("counts", [
        A, Counts(), Counts(5, 5, 1, {3: 1}), Counts(6, 9, 3, {0: 2, 1: 1}, {1: 2})])
    def test_row_round_trip(self, counts):
        bands = {8: (4, counts), UNKNOWN: (1, A)}
        assert bands_from_row(bands_row(bands)) == bands
