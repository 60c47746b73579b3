"""The speculation advisor against hand-computed L, S and geometric tails."""

from __future__ import annotations

import json

import pytest

from exporter.analysis.advise import (
    advice,
    extended_rates,
    result_advice,
    tail_ratio,
    window_advice,
)
from exporter.analysis.distribution import distribution
from exporter.client import merge_answers

RATES = [0.8, 0.5, 0.2]


class TestTail:
    @pytest.mark.parametrize(
        ("rates", "ratio"),
        [
            ([0.8, 0.64, 0.512], 0.8),  # exactly geometric
            # Three equally spaced points: the least-squares slope is (y2 - y0) / 2,
            # so r = sqrt(0.2 / 0.8) = 0.5.
            (RATES, 0.5),
            ([0.6, 0.3], 0.5),  # two points: r = p1 / p0
            ([0.7], 0.7),  # one position: i.i.d. acceptance, r = p0
            ([1.0, 1.0], 1.0),
            ([0.0, 0.0], None),
        ],
    )
    def test_ratio(self, rates, ratio):
        assert tail_ratio(rates) == (None if ratio is None else pytest.approx(ratio))

    def test_tail_is_anchored_at_the_last_measured_rate(self):
        rates, ratio = extended_rates(RATES, 6)
        assert ratio == pytest.approx(0.5)
        assert rates == pytest.approx([0.8, 0.5, 0.2, 0.1, 0.05, 0.025])

    def test_zero_last_rate_gives_zero_tail(self):
        rates, _ = extended_rates([0.5, 0.0], 4)
        assert rates == [0.5, 0.0, 0.0, 0.0]


class TestAdvice:
    def test_table(self):
        body = advice(distribution(RATES))
        assert body["k"] == 3 and body["tail_ratio"] == pytest.approx(0.5)
        lengths = [row["length"] for row in body["rows"]]
        # 1.8, 2.3, 2.5 exact; then + 0.1, + 0.05, + 0.025 from the tail.
        assert lengths == pytest.approx([1.8, 2.3, 2.5, 2.6, 2.65, 2.675])
        assert [row["estimate"] for row in body["rows"]] == [False] * 3 + [True] * 3
        row2 = body["rows"][1]["speedup"]
        assert row2["0.25"] == pytest.approx(2.3 / 1.5)
        assert row2["0.05"] == pytest.approx(2.3 / 1.1)
        # c=0: more is always better, up to the table's end (an estimate).
        assert body["best"]["0"] == {"k": 6, "speedup": pytest.approx(2.675), "estimate": True}
        # c=0.05: S(3) = 2.5/1.15 = 2.1739 beats S(4) = 2.6/1.2 = 2.1667.
        assert body["best"]["0.05"]["k"] == 3
        assert body["best"]["0.1"] == {"k": 3, "speedup": pytest.approx(2.5 / 1.3),
                                       "estimate": False}
        # c=0.25: S(2) = 1.5333 beats S(1) = 1.44 and S(3) = 1.4286.
        assert body["best"]["0.25"]["k"] == 2

    def test_no_speculation_can_win(self):
        # p0 = 0.1 with a costly drafter: S(1) = 1.1 / 1.25 = 0.88 < 1.
        body = advice(distribution([0.1]), [0.25])
        assert body["best"]["0.25"] == {"k": 0, "speedup": 1.0, "estimate": False}

    def test_uses_the_isotonic_fit(self):
        body = advice(distribution([0.5, 0.7]), [0.0])
        assert body["monotone"] is False
        assert body["rows"][1]["length"] == pytest.approx(2.2)  # 1 + 0.6 + 0.6

    def test_custom_costs(self):
        body = advice(distribution(RATES), [0.3])
        assert body["draft_costs"] == [0.3]
        assert list(body["best"]) == ["0.3"]

    def test_no_positions(self):
        assert "error" in advice(distribution([]))

    @pytest.mark.parametrize("costs", [[], [0.3], [0.0, 0.25], [0.0, 0.05, 0.1, 0.25, 0.5],
                                       [0.0, 0.05, 0.1, 0.25]])
    def test_any_number_of_costs(self, costs):
        # Four costs (the default) take a shortcut for the rows: every count gives one shape.
        body = advice(distribution(RATES), costs)
        keys = [format(c, "g") for c in costs]
        assert len(body["rows"]) == 6 and list(body["best"]) == keys
        for kk, row in enumerate(body["rows"], 1):
            assert list(row) == ["k", "length", "estimate", "speedup"]
            assert row["k"] == kk and row["estimate"] is (kk > 3)
            assert list(row["speedup"]) == keys
            for cost, key in zip(costs, keys, strict=True):
                assert row["speedup"][key] == row["length"] / (1.0 + cost * kk)

    def test_a_rise_within_rounding_does_not_win(self):
        # Each step's speed-up beats the previous by less than 1e-12: k' = 1 stays the best
        # until the rises add up past it (the first k' that beats the best so far, not max).
        rates = [0.5] + [4e-13] * 5
        body = advice(distribution(rates), [0.0])
        lengths = [row["length"] for row in body["rows"]]
        assert lengths[2] - lengths[0] < 1e-12 < lengths[3] - lengths[0]
        assert body["best"]["0"]["k"] == 4


class TestFromResults:
    def test_exact_counts_beat_rounded_data(self):
        result = {"status": "ok", "data": {"per_position_acceptance_rates": {"0": 0.3333}},
                  "increase": {"num_drafts": 3, "accepted_per_pos": {"0": 1}}}
        body = result_advice(result)
        assert body["rows"][0]["length"] == pytest.approx(1 + 1 / 3, abs=1e-15)

    def test_aisbench_result(self):
        result = {"status": "ok", "data": {"per_position_acceptance_rates": {"1": 0.5, "0": 0.8}}}
        assert [r["length"] for r in result_advice(result)["rows"][:2]] == pytest.approx(
            [1.8, 2.3])

    def test_window(self):
        answer = {"results": {"a": {"status": "ok", "data": {
            "per_position_acceptance_rates": {"0": 0.8}}},
            "b": {"status": "na", "error": "x", "data": None}},
            "aggregate": {"status": "ok", "data": {"per_position_acceptance_rates": {"0": 0.8}}}}
        body = window_advice(answer)
        assert body["results"]["b"] is None
        assert body["results"]["a"]["k"] == 1 and body["aggregate"]["k"] == 1


class TestWindowAnswerAdvice:
    async def test_stop_answer_window_json_and_api_carry_advice(
        self, fake_vllm, exporter, tmp_path
    ):
        fake = await fake_vllm(k=3)
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        await exp.start(id="adv")
        fake.server.add(0, 1000, 3000, [800, 500, 200])
        answer = await exp.stop("adv")
        advice = answer["advice"]
        assert [r["length"] for r in advice["results"]["a"]["rows"][:3]] == pytest.approx(
            [1.8, 2.3, 2.5])
        assert advice["aggregate"]["tail_ratio"] == pytest.approx(0.5)
        folder = tmp_path / "out" / "adv"
        assert json.loads((folder / "window.json").read_text())["advice"] == advice
        response = await exp.client.get("/api/v1/windows/adv")
        assert (await response.json())["advice"] == advice
        # The per-target file stays in AISBench's format: no advice in it.
        (path,) = (folder / "performances").glob("spec_decode_*.json")
        assert "advice" not in json.loads(path.read_text())

    async def test_target_without_activity_has_none(self, fake_vllm, exporter):
        fake = await fake_vllm(k=3)
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        await exp.start(id="idle")
        answer = await exp.stop("idle")
        assert answer["advice"]["results"] == {"a": None}
        assert answer["advice"]["aggregate"] is None

    def test_merged_shards_are_advised_over_the_whole(self):
        def shard(name: str, per_pos: list[int]) -> dict:
            raw = {"num_drafts": 100, "num_draft_tokens": 200, "num_accepted_tokens": sum(per_pos),
                   "accepted_per_pos": {str(i): c for i, c in enumerate(per_pos)}}
            zero = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                    "accepted_per_pos": {"0": 0, "1": 0}}
            result = {"status": "ok", "data": {}, "increase": raw,
                      "raw": {"before": zero, "after": raw}}
            return {"id": "w", "targets": [name], "results": {name: result}}

        merged = merge_answers([shard("a", [80, 40]), shard("b", [60, 20])])
        # (80 + 60) / 200 and (40 + 20) / 200.
        assert merged["advice"]["aggregate"]["distribution"]["rates"] == pytest.approx(
            [0.7, 0.3])
        assert set(merged["advice"]["results"]) == {"a", "b"}


class TestMixedK:
    def test_aggregate_of_different_k_is_not_advised(self):
        def ok(rates):
            return {"status": "ok", "data": {"per_position_acceptance_rates": {
                str(i): r for i, r in enumerate(rates)}}}

        answer = {"results": {"k3": ok([0.8, 0.5, 0.2]), "k5": ok([0.8, 0.5, 0.2, 0.1, 0.05])},
                  "aggregate": ok([0.8, 0.5, 0.2, 0.05, 0.02])}
        body = window_advice(answer)
        assert body["aggregate"]["error"].startswith("targets run different k (3, 5)")
        assert body["results"]["k3"]["k"] == 3 and body["results"]["k5"]["k"] == 5


class TestMeasuredCostByBand:
    """advise --baseline: the step cost per concurrency band timed in both windows, else the
    window's one figure, saying which."""

    def _answer(self, tpots: dict[int, list[float]], split: bool) -> dict:
        from dataclasses import replace

        from exporter.core.perrequest import PerRequest, from_json
        from exporter.core.segments import RequestContext

        tally = PerRequest()
        for in_flight, values in tpots.items():
            for tpot in values:
                stats = from_json(json.dumps({
                    "id": "c", "model": "m", "choices": [],
                    "metrics": {"mean_itl_ms": tpot, "tokens_per_second": 1000 / tpot},
                    "usage": {"prompt_tokens": 1, "completion_tokens": 9}}).encode())
                tally.record(replace(stats, context=RequestContext(None, "m", "default",
                                                                   in_flight)))
        block = tally.answer()
        if not split:
            del block["timing_by"]  # saved before the split
        return {"per_request": {"aggregate": block}, "aggregate": {"data": {
            "num_drafts": 100, "draft_tokens": 300, "acceptance_length": 2.5}}}

    def test_each_band_in_both_gets_its_own_cost(self) -> None:
        from exporter.analysis.advise import measured_cost

        base = self._answer({1: [10.0] * 10, 4: [20.0] * 10, 9: [30.0] * 3}, True)
        spec = self._answer({1: [6.0] * 10, 4: [16.0] * 10, 9: [20.0] * 3}, True)
        measured = measured_cost(base, spec)
        bands = measured["by_concurrency"]
        assert list(bands) == ["1", "4-7"]  # 8-15 has too few timed requests
        assert bands["1"]["step_ratio"] == pytest.approx(6.0 * 2.5 / 10.0)
        assert bands["1"]["value"] == pytest.approx((1.5 - 1) / 3)
        assert bands["4-7"]["value"] == pytest.approx((16.0 * 2.5 / 20.0 - 1) / 3)
        assert measured["source"].startswith("per concurrency band (1, 4-7)")

    def test_without_the_split_the_windows_one_figure_is_used_saying_so(self) -> None:
        from exporter.analysis.advise import measured_cost

        base = self._answer({1: [10.0] * 10}, False)
        measured = measured_cost(base, self._answer({1: [6.0] * 10}, True))
        assert measured["by_concurrency"] == {}
        assert measured["source"].startswith("the window's one figure")
        assert measured["value"] == pytest.approx((6.0 * 2.5 / 10.0 - 1) / 3)
