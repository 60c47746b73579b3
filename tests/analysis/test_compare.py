"""Comparing two runs' RESULTs: intervals, verdicts and regression gates."""

from __future__ import annotations

import math

import pytest

from exporter.analysis.compare import (
    GateError,
    apply_gates,
    compare_answers,
    metric_estimates,
    parse_gate,
    sample,
)
from exporter.analysis.stats import Z


def result(drafts: int, rates: list[float], k: int | None = None) -> dict:
    """An AISBench-shaped `ok` RESULT with these per-position rates."""
    k = k or len(rates)
    accepted = round(sum(rates) * drafts)
    return {"status": "ok", "url": "http://h:1/metrics", "error": None, "data": {
        "num_drafts": drafts, "draft_tokens": drafts * k, "accepted_tokens": accepted,
        "acceptance_rate": 100 * accepted / (drafts * k),
        "acceptance_length": 1 + accepted / drafts,
        "per_position_acceptance_rates": {str(i): r for i, r in enumerate(rates)},
    }, "raw": {"before": None, "after": None}}


def answer(**results) -> dict:
    return {"results": results, "aggregate": None}


class TestEstimates:
    def test_length_and_rate_intervals(self):
        # p = (0.8, 0.5, 0.2): Var X = 1.05; 100 drafts; L = 2.5; rate = 150/300 = 50%.
        estimates, notes = metric_estimates(sample(result(100, [0.8, 0.5, 0.2])))
        se = math.sqrt(1.05 / 100)
        assert estimates["acceptance_length"].low == pytest.approx(2.5 - Z * se)
        # Rate = 100 (L - 1) / k: the same interval divided by k = 3, in percent.
        assert estimates["acceptance_rate"].value == pytest.approx(50.0)
        assert estimates["acceptance_rate"].high == pytest.approx(50 + Z * se * 100 / 3)
        assert estimates["position_0"].low == pytest.approx(0.7112, abs=1e-4)  # Wilson 80/100
        assert notes == []

    def test_variable_draft_length_is_noted(self):
        res = result(100, [0.8, 0.5, 0.2])
        res["data"]["draft_tokens"] = 250  # 2.5 tokens per draft on average
        _, notes = metric_estimates(sample(res))
        assert notes == ["drafts differ in length (n-gram drafting, or targets with "
                         "different k): the rate's interval takes the mean, 2.5 tokens per "
                         "draft, as fixed"]

    def test_without_positions_the_variance_is_bounded(self):
        res = result(100, [0.8, 0.5, 0.2])
        res["data"]["per_position_acceptance_rates"] = {}
        estimates, notes = metric_estimates(sample(res))
        # Bhatia-Davis: m (k - m) = 1.5 * 1.5 = 2.25 > 1.05.
        assert estimates["acceptance_length"].se == pytest.approx(math.sqrt(2.25 / 100))
        assert "bounded" in notes[0]

    def test_estimate_without_counts_has_no_interval(self):
        res = {"status": "ok", "estimate": True, "data": {
            "num_drafts": None, "draft_tokens": None, "accepted_tokens": None,
            "acceptance_rate": 60.0, "acceptance_length": 2.8,
            "per_position_acceptance_rates": {}}}
        estimates, _ = metric_estimates(sample(res))
        assert estimates["acceptance_length"].low is None

    def test_na_is_no_sample(self):
        assert sample({"status": "na", "error": "down", "data": None}) is None


class TestCompare:
    def test_worse_better_same(self):
        a = answer(t=result(1000, [0.8, 0.5, 0.2]), u=result(50, [0.8]), only_a=result(1, [1]))
        b = answer(t=result(1000, [0.7, 0.4, 0.1]), u=result(50, [0.82]))
        body = compare_answers(a, b)
        assert body["only_in_a"] == ["only_a"] and body["only_in_b"] == []
        rows = {r["metric"]: r for r in body["targets"]["t"]["metrics"]}
        assert list(rows) == ["acceptance_rate", "acceptance_length", "position_0",
                              "position_1", "position_2"]
        length = rows["acceptance_length"]
        assert length["difference"]["value"] == pytest.approx(-0.3)
        se = math.sqrt(1.05 / 1000 + 0.96 / 1000)
        assert length["difference"]["high"] == pytest.approx(-0.3 + Z * se)
        assert length["verdict"] == "worse"
        assert {r["verdict"] for r in body["targets"]["u"]["metrics"]} == {
            "no significant difference"}
        flipped = compare_answers(b, a)
        assert {r["metric"]: r["verdict"] for r in flipped["targets"]["t"]["metrics"]}[
            "acceptance_length"] == "better"

    def test_na_target_is_listed_with_the_reason(self):
        a = answer(t=result(100, [0.5]))
        b = answer(t={"status": "na", "error": "Failed to fetch", "data": None})
        entry = compare_answers(a, b)["targets"]["t"]
        assert entry["metrics"] == [] and "B is N/A: Failed to fetch" in entry["notes"][0]

    def test_exact_counts_are_preferred(self):
        res = result(3, [0.3333])
        res["increase"] = {"num_drafts": 3, "num_draft_tokens": 3, "num_accepted_tokens": 1,
                           "accepted_per_pos": {"0": 1}}
        assert sample(res).rates == (1 / 3,)


class TestGates:
    @pytest.mark.parametrize(
        ("text", "metric", "limit", "relative"),
        [("acceptance_length=2%", "acceptance_length", 2.0, True),
         ("acceptance_rate=1.5", "acceptance_rate", 1.5, False),
         ("position_3=0.05", "position_3", 0.05, False)],
    )
    def test_parse(self, text, metric, limit, relative):
        gate = parse_gate(text)
        assert (gate.metric, gate.limit, gate.relative) == (metric, limit, relative)

    @pytest.mark.parametrize(
        "text", ["acceptance_length", "speed=2%", "acceptance_length=", "acceptance_length=x%",
                 "acceptance_length=-1", "acceptance_length=nan"])
    def test_parse_errors(self, text):
        with pytest.raises(GateError):
            parse_gate(text)

    @pytest.mark.parametrize(
        ("gate", "tripped"),
        [
            # B - A = -0.3, interval high -0.3 + 1.96 * 0.044833 = -0.21213: the drop is
            # at least 0.21213, 8.485% of A's 2.5.
            ("acceptance_length=2%", True),
            ("acceptance_length=8.4%", True),
            ("acceptance_length=8.6%", False),
            ("acceptance_length=10%", False),  # the point drop (12%) alone does not trip
            ("acceptance_length=0.21", True),
            ("acceptance_length=0.22", False),
            ("position_2=0.05", True),  # 0.2 -> 0.1: Newcombe's high is -0.0689
            ("position_2=0.07", False),
            ("position_7=0", False),  # no such position: nothing to trip
        ],
    )
    def test_trips(self, gate, tripped):
        body = compare_answers(answer(t=result(1000, [0.8, 0.5, 0.2])),
                               answer(t=result(1000, [0.7, 0.4, 0.1])))
        assert apply_gates(body, [parse_gate(gate)])["tripped"] is tripped

    def test_a_drop_that_is_not_significant_never_trips(self):
        body = compare_answers(answer(t=result(20, [0.8])), answer(t=result(20, [0.7])))
        gated = apply_gates(body, [parse_gate("acceptance_length=1%")])
        assert gated["gates"][0]["drop"] > 1 and not gated["tripped"]


class TestOddInputs:
    def test_aisbench_zero_drafts_has_no_length(self):
        # AISBench writes acceptance_length 0.0 when drafts did not grow.
        res = result(100, [0.5])
        res["data"].update(num_drafts=0, acceptance_length=0.0, per_position_acceptance_rates={})
        estimates, notes = metric_estimates(sample(res))
        assert "acceptance_length" not in estimates
        assert notes == ["no drafts counted: no acceptance length"]

    def test_different_k_compares_common_positions(self):
        body = compare_answers(answer(t=result(100, [0.8, 0.5, 0.2])),
                               answer(t=result(100, [0.8, 0.5, 0.2, 0.1, 0.05])))
        metrics = [r["metric"] for r in body["targets"]["t"]["metrics"]]
        assert "position_2" in metrics and "position_3" not in metrics

    def test_estimate_gate_never_trips(self):
        est = {"status": "ok", "estimate": True, "data": {
            "num_drafts": None, "draft_tokens": None, "accepted_tokens": None,
            "acceptance_rate": 60.0, "acceptance_length": 2.8,
            "per_position_acceptance_rates": {}}}
        worse = est | {"data": est["data"] | {"acceptance_length": 1.5}}
        body = apply_gates(compare_answers(answer(s=est), answer(s=worse)),
                           [parse_gate("acceptance_length=1%")])
        assert body["gates"][0]["verdict"] == "unknown" and not body["tripped"]

    def test_summed_result(self):
        from exporter.analysis.compare import summed_result

        total = summed_result({"a": result(100, [0.8, 0.4]), "b": result(300, [0.4, 0.0]),
                               "c": {"status": "na", "error": "down", "data": None}})
        assert total["targets"] == ["a", "b"]
        # (80 + 120) / 400 and (40 + 0) / 400; length 1 + 240 / 400.
        assert total["data"]["per_position_acceptance_rates"] == pytest.approx(
            {"0": 0.5, "1": 0.1})
        assert total["data"]["acceptance_length"] == pytest.approx(1.6)
        assert summed_result({}) is None

    def test_summed_result_of_mixed_k(self):
        from exporter.analysis.compare import summed_result

        # A k=2 and a k=4 server: positions 2 and 3 are over the k=4 server's drafts only.
        total = summed_result({"k2": result(100, [0.8, 0.4]),
                               "k4": result(50, [0.9, 0.6, 0.4, 0.2])})
        assert total["data"]["per_position_acceptance_rates"] == pytest.approx(
            {"0": (80 + 45) / 150, "1": (40 + 30) / 150, "2": 0.4, "3": 0.2})
        assert total["per_position_drafts"] == {"0": 150, "1": 150, "2": 50, "3": 50}


class TestMixedK:
    """Targets of k=3 and k=5: position 3 is over the k=5 target's drafts only, in the
    window's own aggregate and in compare's, whether compare reads the window's answer or
    sums the folder's files itself (`summed_result`)."""

    @staticmethod
    def window() -> dict:
        from exporter.core.aisbench import Result, Status, aggregate
        from exporter.core.snapshot import Counts

        k3 = Counts(390, 1170, 500, {0: 250, 1: 160, 2: 90})
        k5 = Counts(389, 1945, 600, {0: 250, 1: 180, 2: 100, 3: 32, 4: 38})
        made = {name: Result(status=Status.OK, url=f"http://{name}/metrics", increase=c)
                for name, c in (("k3", k3), ("k5", k5))}
        return {"results": {n: r.to_json() for n, r in made.items()},
                "aggregate": aggregate(made.items()).to_json()}

    def test_the_window_aggregate_is_over_the_drafts_that_draft_each_position(self):
        rates = self.window()["aggregate"]["data"]["per_position_acceptance_rates"]
        assert rates["3"] == pytest.approx(32 / 389)
        assert rates["0"] == pytest.approx(500 / 779)

    @pytest.mark.parametrize("source", ["window answer", "folder of files"])
    def test_compare_agrees_with_the_window_on_every_aggregate_position(self, source):
        from exporter.analysis.compare import summed_result

        answer = self.window()
        if source == "folder of files":
            answer = {"results": answer["results"],
                      "aggregate": summed_result(answer["results"])}
        compared = compare_answers(answer, answer)["aggregate"]
        values = {row["metric"]: row["a"]["value"] for row in compared["metrics"]}
        want = self.window()["aggregate"]["data"]["per_position_acceptance_rates"]
        assert {m: v for m, v in values.items() if m.startswith("position_")} == {
            f"position_{p}": pytest.approx(rate) for p, rate in want.items()}
        assert values["position_3"] == pytest.approx(32 / 389)  # not 32 / 779
        assert values["acceptance_length"] == pytest.approx(1 + 1100 / 779)

    def test_position_intervals_count_the_drafts_behind_them(self):
        s = sample(self.window()["aggregate"])
        assert s is not None and s.drafts_at(3) == 389 and s.drafts_at(0) == 779
        estimates, _ = metric_estimates(s)
        narrow, wide = estimates["position_0"], estimates["position_3"]
        assert wide.low <= 32 / 389 <= wide.high
        # 389 drafts behind position 3, not 779: a wider interval than 779 would give.
        from exporter.analysis.stats import wilson
        too_narrow = wilson(32 / 389 * 779, 779)
        assert too_narrow is not None and wide.high - wide.low > too_narrow.high - too_narrow.low
        assert narrow.high - narrow.low > 0
