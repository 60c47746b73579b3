"""Pure math from counts to the figures users read."""

from __future__ import annotations

import pytest

from exporter.core.derive import (
    acceptance_length,
    acceptance_ratio,
    has_activity,
    position_ratios,
    result_data,
    span_figures,
)
from exporter.core.snapshot import Counts

SEED = Counts(163, 815, 809, {0: 162, 1: 162, 2: 162, 3: 162, 4: 161})
TWELVE = Counts(100, 1200, 660, {pos: 100 - 5 * pos for pos in reversed(range(12))})
ZERO = Counts()


class TestAcceptanceRatio:
    @pytest.mark.parametrize(
        "counts,want",
        [
            (SEED, 809 / 815),
            (Counts(10, 30, 0), 0.0),
            (Counts(10, 30, 30), 1.0),
            (Counts(0.5, 2.5, 1.25), 0.5),
            (Counts(0, 0, 0), None),
            (Counts(10, 0, 0), None),
            (Counts(10, -1, 3), None),
            (Counts(0, 8, 4), 0.5),  # V0: draft tokens without a drafts counter
        ],
    )
    def test_table(self, counts, want):
        assert acceptance_ratio(counts) == (pytest.approx(want) if want is not None else None)


class TestAcceptanceLength:
    @pytest.mark.parametrize(
        "counts,want",
        [
            (SEED, 1 + 809 / 163),
            (Counts(10, 30, 0), 1.0),
            (Counts(4, 12, 6), 2.5),
            (Counts(0.5, 2.5, 1.25), 3.5),
            (Counts(0, 0, 0), None),
            (Counts(0, 8, 4), None),
            (Counts(-1, 8, 4), None),
        ],
    )
    def test_table(self, counts, want):
        assert acceptance_length(counts) == (pytest.approx(want) if want is not None else None)


class TestPositionRatios:
    @pytest.mark.parametrize(
        "counts,want",
        [
            (SEED, {0: 162 / 163, 1: 162 / 163, 2: 162 / 163, 3: 162 / 163, 4: 161 / 163}),
            (Counts(4, 12, 6, {2: 1, 0: 3, 1: 2}), {0: 0.75, 1: 0.5, 2: 0.25}),
            (Counts(2, 4, 1, {0: 1, 1: 0}), {0: 0.5, 1: 0.0}),
            (Counts(0.5, 1, 0.25, {0: 0.25}), {0: 0.5}),
            (Counts(10, 30, 0, {}), {}),
            (Counts(0, 0, 0, {0: 0, 1: 0}), {}),
            (ZERO, {}),
            # Parts of different k: a position over the drafts of the parts that draft it.
            (Counts(40, 0, 0, {1: 14, 0: 25, 2: 6}, {2: 30}), {0: 25 / 40, 1: 14 / 40, 2: 0.2}),
            (Counts(40, 0, 0, {0: 25, 1: 6}, {1: 0}), {0: 25 / 40}),
            (Counts(-5, 0, 0, {0: 1}), {}),
        ],
    )
    def test_table(self, counts, want):
        got = position_ratios(counts)
        assert got == pytest.approx(want)
        assert list(got) == sorted(want)

    def test_twelve_positions_numeric_order(self):
        got = position_ratios(TWELVE)
        assert list(got) == list(range(12))
        assert got[10] == pytest.approx(0.5)
        assert got[11] == pytest.approx(0.45)


class TestSpanFigures:
    """The three live figures of `end - start`, exactly (not approximately) as computed from
    the difference's `Counts`, in the usual case and in those that need the difference."""

    @pytest.mark.parametrize(
        "start,end",
        [
            (SEED, SEED + TWELVE),  # a position new at the end
            (ZERO, SEED),
            (SEED, SEED),  # nothing drafted: no ratio, no length, no positions
            (Counts(3, 9.5, 1.25, {0: 0.7, 1: 0.1}), Counts(13.3, 40.1, 17.9, {0: 9.1, 1: 3.3})),
            (Counts(10, 30, 9, {0: 5, 1: 4, 2: 0}), Counts(20, 60, 15, {0: 9, 1: 6})),
            (Counts(10, 0, 0, {0: 1}), Counts(20, 0, 0, {0: 1})),  # drafts, no tokens
            (Counts(20, 60, 15, {0: 9}), Counts(10, 30, 9, {0: 5})),  # negative: a reset
            # Parts of different k on one side or the other.
            (Counts(40, 0, 0, {0: 25, 1: 14, 2: 6}, {2: 30}), Counts(80, 100, 90, {0: 50, 1: 28,
                                                                                 2: 12}, {2: 60})),
            (Counts(4, 8, 2, {0: 2, 1: 0}), Counts(40, 80, 50, {0: 25, 1: 14, 2: 6}, {2: 30})),
        ],
    )
    def test_as_from_the_difference(self, start, end):
        counts = end - start
        want = (acceptance_ratio(counts), acceptance_length(counts), position_ratios(counts))
        got = span_figures(start, end)
        assert got == want
        assert list(got[2]) == list(want[2])

    def test_the_usual_case_has_every_figure(self):
        ratio, length, ratios = span_figures(
            Counts(10, 30, 9, {1: 4, 0: 5}), Counts(20, 60, 15, {1: 6, 0: 9}))
        assert (ratio, length, ratios) == (0.2, 1.6, {0: 0.4, 1: 0.2})
        assert list(ratios) == [0, 1]


class TestResultData:
    def test_aisbench_example(self):
        assert result_data(SEED) == {
            "num_drafts": 163,
            "draft_tokens": 815,
            "accepted_tokens": 809,
            # Full precision, as AISBench's own code writes them: only displays round.
            "acceptance_rate": 99.2638036809816,
            "acceptance_length": 5.96319018404908,
            "per_position_acceptance_rates": {
                "0": 0.9938650306748467, "1": 0.9938650306748467, "2": 0.9938650306748467,
                "3": 0.9938650306748467, "4": 0.9877300613496932,
            },
        }

    def test_no_double_rounding(self):
        # DFlash-like: the true length 2.6146 prints 2.61; stored as 2.615 it printed 2.62.
        data = result_data(Counts(5000, 35000, 8073, {}))
        assert data["acceptance_length"] == 1 + 8073 / 5000  # 2.6146000000000003
        assert f"{data['acceptance_length']:.2f}" == "2.61"

    def test_counts_are_ints(self):
        data = result_data(Counts(163.0, 815.0, 809.0, {0: 162.0}))
        for name in ("num_drafts", "draft_tokens", "accepted_tokens"):
            assert type(data[name]) is int

    @pytest.mark.parametrize(
        "counts,want",
        [
            (
                Counts(2.5, 7.5, 3.75, {0: 2.5, 1: 1.25}),
                {
                    "num_drafts": 2.5, "draft_tokens": 7.5, "accepted_tokens": 3.75,
                    "acceptance_rate": 50.0, "acceptance_length": 2.5,
                    "per_position_acceptance_rates": {"0": 1.0, "1": 0.5},
                },
            ),
            (
                Counts(3, 9, 2, {0: 1, 1: 1, 2: 0}),
                {
                    "num_drafts": 3, "draft_tokens": 9, "accepted_tokens": 2,
                    "acceptance_rate": 2 / 9 * 100, "acceptance_length": 1 + 2 / 3,
                    "per_position_acceptance_rates": {"0": 1 / 3, "1": 1 / 3, "2": 0.0},
                },
            ),
            (
                ZERO,
                {
                    "num_drafts": 0, "draft_tokens": 0, "accepted_tokens": 0,
                    "acceptance_rate": None, "acceptance_length": None,
                    "per_position_acceptance_rates": {},
                },
            ),
            (
                Counts(0, 8, 4),  # V0: a rate, no length
                {
                    "num_drafts": 0, "draft_tokens": 8, "accepted_tokens": 4,
                    "acceptance_rate": 50.0, "acceptance_length": None,
                    "per_position_acceptance_rates": {},
                },
            ),
        ],
    )
    def test_table(self, counts, want):
        assert result_data(counts) == want

    def test_twelve_positions_as_text_keys_in_numeric_order(self):
        rates = result_data(TWELVE)["per_position_acceptance_rates"]
        assert list(rates) == [str(p) for p in range(12)]
        assert rates["10"] == 0.5

    def test_json_round_trip_keeps_order(self):
        import json

        rates = json.loads(json.dumps(result_data(TWELVE)))["per_position_acceptance_rates"]
        assert list(rates) == [str(p) for p in range(12)]


class TestHasActivity:
    @pytest.mark.parametrize(
        "counts,want",
        [
            (SEED, True),
            (ZERO, False),
            (Counts(0, 8, 4), True),
            (Counts(1, 0, 0), True),
            (Counts(0, 0, 5, {0: 5}), False),
        ],
    )
    def test_table(self, counts, want):
        assert has_activity(counts) is want
