"""exporter/analysis/speedup.py and advise's measured cost: the paired speed-up's point value,
its seeded bootstrap interval (which covers the true ratio as often as it says), its gate."""

from __future__ import annotations

import random

import pytest

from exporter.analysis.advise import measured_cost
from exporter.analysis.speedup import compare_speed, gate_slower, speedup_entry
from exporter.core.timing import Spread, Timing, Timings


def _tally(rng: random.Random, scale: float, n: int) -> Timings:
    tally = Timings()
    for _ in range(n):
        gaps = Spread()
        for _ in range(4):
            gaps.add(rng.lognormvariate(scale, 0.4))
        tally.add(Timing(1000 / rng.lognormvariate(scale, 0.4), rng.lognormvariate(scale, 0.4),
                         None, gaps))
    return tally


def _answer(timings: Timings) -> dict:
    block = {"timing": timings.answer()}
    return {"per_request": {"targets": {"t": block}, "aggregate": block}}


class TestSpeedupEntry:
    def test_the_point_is_the_ratio_and_b_faster_is_above_one_for_every_figure(self) -> None:
        rng = random.Random(3)
        a, b = _tally(rng, 3.0, 300), _tally(rng, 2.5, 300)
        rows = speedup_entry(a, b)["rows"]
        assert {(r["figure"], r["stat"]) for r in rows} >= {
            ("tokens_per_second", "mean"), ("tpot_ms", "p50"), ("itl_ms", "p99")}
        for row in rows:
            higher = row["figure"] == "tokens_per_second"
            ratio = row["b"] / row["a"] if higher else row["a"] / row["b"]
            assert row["speedup"]["value"] == pytest.approx(ratio)
            if row["speedup"]["low"] is not None:
                assert row["verdict"] == "faster"

    def test_it_is_repeatable_and_too_few_values_give_no_interval(self) -> None:
        a, b = _tally(random.Random(1), 3.0, 8), _tally(random.Random(2), 3.0, 8)
        assert speedup_entry(a, b) == speedup_entry(a, b)
        rows = {(r["figure"], r["stat"]): r for r in speedup_entry(a, b)["rows"]}
        assert rows["tpot_ms", "p95"]["verdict"] == "unknown"
        assert rows["tpot_ms", "p95"]["speedup"]["low"] is None

    def test_the_95_intervals_cover_the_true_ratio_about_95_times_in_100(self) -> None:
        # Same distributions on both sides: the true speed-up is 1, of the mean and the p50.
        rng = random.Random(11)

        def tally() -> Timings:
            out = Timings()
            for _ in range(120):
                out.add(Timing(tokens_per_second=rng.lognormvariate(3.0, 0.4)))
            return out

        covered = {"mean": 0, "p50": 0}
        for _ in range(60):
            for row in speedup_entry(tally(), tally())["rows"]:
                up = row["speedup"]
                covered[row["stat"]] += up["low"] <= 1 <= up["high"]
        assert all(51 <= n <= 60 for n in covered.values()), covered


class TestCompareSpeed:
    def test_windows_without_timings_have_no_section_and_one_side_is_named(self) -> None:
        timed = _answer(_tally(random.Random(4), 3.0, 40))
        assert compare_speed({}, {}) is None
        section = compare_speed(timed, {"per_request": {"targets": {}, "aggregate": {}}})
        assert section is not None and section["missing"] == ["B"]
        assert section["aggregate"] is None

    def test_the_gate_trips_below_the_ratio_only_when_the_whole_interval_is(self) -> None:
        rng = random.Random(5)
        a, b = _answer(_tally(rng, 3.0, 200)), _answer(_tally(rng, 2.6, 200))
        section = compare_speed(a, b)
        assert section is not None and set(section["targets"]) == {"t"}
        assert not gate_slower(section, 1.0)["tripped"]
        assert gate_slower(section, 3.0)["tripped"]
        assert gate_slower(compare_speed(b, a), 1.0)["tripped"]
        assert [c["target"] for c in gate_slower(section, 1.0)["checks"]] == ["t", "all"]


class TestMeasuredCost:
    def _window(self, tpot: float | None, drafts: int = 100, drafted: int = 300,
                length: float = 2.5) -> dict:
        timing = {"tpot_ms": {"mean": tpot}} if tpot else {}
        return {"per_request": {"aggregate": {"timing": timing}},
                "aggregate": {"data": {"num_drafts": drafts, "draft_tokens": drafted,
                                       "acceptance_length": length}}}

    def test_c_is_the_step_time_ratio_less_one_per_drafted_token(self) -> None:
        # A step of B: 2.6 ms x 2.5 tokens = 6.5 ms against 5 ms: 30% more over 3 drafted.
        cost = measured_cost(self._window(5.0), self._window(2.6))
        assert cost["value"] == pytest.approx(0.1)
        assert cost["step_ratio"] == pytest.approx(1.3)

    def test_a_faster_spec_step_is_c_0_with_a_note_and_missing_timings_say_why(self) -> None:
        cost = measured_cost(self._window(5.0), self._window(1.0))
        assert cost["value"] == 0.0 and cost["note"]
        assert "baseline" in measured_cost(self._window(None), self._window(2.0))["error"]
        assert "no drafts" in measured_cost(self._window(5.0),
                                            self._window(2.0, drafts=0))["error"]
