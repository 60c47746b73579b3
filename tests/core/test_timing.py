"""exporter/core/timing.py: per-request timings read from vLLM's answer or the proxy's clock,
and their log-bucketed tallies within the stated quantile error, merged exactly."""

from __future__ import annotations

import json
import math
import random

import pytest
from quantiles import exact_quantile

from exporter.core.perrequest import PerRequest, from_json, from_sse
from exporter.core.timing import FIGURES, Clock, Spread, Timing, Timings, server_timing


class TestSpread:
    @pytest.mark.parametrize("seed", range(6))
    def test_quantiles_are_within_half_a_percent_of_the_exact_ones(self, seed: int) -> None:
        rng = random.Random(seed)
        values = [rng.lognormvariate(3, 1) for _ in range(rng.randint(1, 900))]
        spread = Spread()
        for v in values:
            spread.add(v)
        summary = spread.summary()
        assert summary is not None
        assert summary["count"] == len(values)
        assert summary["mean"] == pytest.approx(sum(values) / len(values), rel=1e-12)
        assert (summary["min"], summary["max"]) == pytest.approx((min(values), max(values)))
        for key, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            assert abs(summary[key] / exact_quantile(values, q) - 1) <= math.exp(0.005) - 1 + 1e-9
        if len(values) > 1:
            mean = sum(values) / len(values)
            exact = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
            assert spread.variance() == pytest.approx(exact, rel=1e-6)

    def test_a_merge_is_the_tally_of_both_and_round_trips(self) -> None:
        a, b, both = Spread(), Spread(), Spread()
        for i in range(400):
            value = 5 + (i * 37 % 300) / 7
            (a if i % 3 else b).add(value)
            both.add(value)
        a.merge(b)
        assert a.logs.counts == both.logs.counts
        assert a.summary() == pytest.approx(both.summary())
        assert Spread.from_dict(json.loads(json.dumps(a.to_dict()))).summary() == a.summary()

    def test_zero_is_tallied_at_the_floor_and_empty_says_none(self) -> None:
        spread = Spread()
        assert spread.summary() is None
        spread.add(0.0)
        assert spread.summary()["p50"] == pytest.approx(1e-3)

    @pytest.mark.parametrize("bad", [None, {}, {"sum": 1.0, "squares": 1.0},
                                     {"sum": "x", "squares": 1.0, "logs": {}},
                                     {"sum": 1.0, "squares": 1.0, "logs": {"width": 0.5}}])
    def test_a_malformed_tally_is_refused(self, bad: object) -> None:
        with pytest.raises(ValueError):
            Spread.from_dict(bad)


class TestServerTiming:
    def test_vllm_fields_are_read_by_their_names(self) -> None:
        timing = server_timing({"time_to_first_token_ms": 12.5, "mean_itl_ms": 3.0,
                                "tokens_per_second": 250.0, "queue_time_ms": 0.1,
                                "speculative_decoding": None})
        assert timing == Timing(250.0, 3.0, 12.5, None, True)

    @pytest.mark.parametrize("metrics", [
        None, [], {}, {"speculative_decoding": {}},
        {"time_to_first_token_ms": None, "mean_itl_ms": None, "tokens_per_second": None},
        {"mean_itl_ms": "3", "tokens_per_second": -1.0, "time_to_first_token_ms": True}])
    def test_without_per_request_metrics_there_is_no_server_timing(self, metrics: object
                                                                   ) -> None:
        assert server_timing(metrics) is None

    def test_a_body_and_the_usage_chunk_carry_it_into_the_stats(self) -> None:
        metrics = {"mean_itl_ms": 4.0, "tokens_per_second": 100.0}
        body = {"id": "c1", "model": "m", "choices": [], "metrics": metrics,
                "usage": {"prompt_tokens": 3, "completion_tokens": 8}}
        assert from_json(json.dumps(body).encode()).timing == Timing(100.0, 4.0, None, None,
                                                                     True)
        stream = (b'data: {"id": "c1", "model": "m", "choices": [{"text": "a"}]}\n\n'
                  + b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n")
        assert from_sse(stream).timing == Timing(100.0, 4.0, None, None, True)


class TestClock:
    def _clock(self) -> Clock:
        clock = Clock(sent=10.0)
        for at in (10.5, 10.7, 11.0, 11.5):  # first byte after 0.5 s, three gaps
            clock.tick(at)
        return clock

    def test_a_stream_is_timed_from_first_byte_gaps_and_end(self) -> None:
        timing = self._clock().timing(None, 7, streamed=True)
        assert timing.tokens_per_second == pytest.approx(7 / 1.5)
        assert timing.ttft_ms == pytest.approx(500.0)
        assert timing.tpot_ms == pytest.approx(1000.0 / 6)
        assert timing.gaps_ms is not None and timing.gaps_ms.count == 3
        assert timing.gaps_ms.total == pytest.approx(1000.0)
        assert not timing.by_server

    def test_a_whole_body_gives_only_tokens_per_second(self) -> None:
        timing = self._clock().timing(None, 6, streamed=False)
        assert timing == Timing(pytest.approx(4.0), None, None, None, False)

    def test_the_servers_figures_win_and_the_proxy_fills_the_rest(self) -> None:
        server = Timing(tokens_per_second=99.0, tpot_ms=2.0, by_server=True)
        timing = self._clock().timing(server, 7, streamed=True)
        assert (timing.tokens_per_second, timing.tpot_ms) == (99.0, 2.0)
        assert timing.ttft_ms == pytest.approx(500.0)
        assert timing.by_server

    def test_no_tokens_no_rates(self) -> None:
        assert self._clock().timing(None, None, True).tokens_per_second is None
        assert Clock(1.0).timing(None, 5, True) == Timing()


class TestTimings:
    def _tally(self, seed: int) -> Timings:
        rng = random.Random(seed)
        tally = Timings()
        for _ in range(50):
            gaps = Spread()
            for _ in range(5):
                gaps.add(rng.uniform(5, 50))
            tally.add(Timing(rng.uniform(10, 90), rng.uniform(5, 50), rng.uniform(50, 500),
                             gaps, rng.random() < 0.5))
        return tally

    def test_the_block_round_trips_and_merges_exactly(self) -> None:
        a, b = self._tally(1), self._tally(2)
        block = json.loads(json.dumps(a.answer()))
        assert Timings.from_block(block).answer() == a.answer()
        assert block["timed"] == 50 and block["itl_ms"]["count"] == 250
        merged = Timings.from_block(block)
        merged.merge(b)
        assert merged.timed == 100
        assert merged.spreads["tpot_ms"].total == pytest.approx(
            a.spreads["tpot_ms"].total + b.spreads["tpot_ms"].total)

    def test_a_block_written_before_timings_reads_empty(self) -> None:
        assert Timings.from_block(None).answer() == Timings().answer()

    @pytest.mark.parametrize("bad", [
        [], {"timed": 1}, {"timed": -1, "by_server": 0, "buckets": {}},
        {"timed": 1, "by_server": 2, "buckets": {}},
        {"timed": 0, "by_server": 0, "buckets": {}}])
    def test_a_malformed_block_is_refused(self, bad: object) -> None:
        with pytest.raises(ValueError):
            Timings.from_block(bad)

    def test_too_many_timed_values_are_refused(self) -> None:
        block = self._tally(3).answer() | {"timed": 10}
        with pytest.raises(ValueError):
            Timings.from_block(block)


class TestPerRequestTiming:
    def test_an_answer_without_spec_decode_is_timed_and_merged(self) -> None:
        body = {"id": "c", "model": "m", "choices": [],
                "metrics": {"mean_itl_ms": 8.0, "tokens_per_second": 120.0,
                            "speculative_decoding": None},
                "usage": {"prompt_tokens": 2, "completion_tokens": 16}}
        tally = PerRequest()
        tally.record(from_json(json.dumps(body).encode()))
        block = tally.answer()
        assert block["with_stats"] == 0
        assert block["timing"]["timed"] == 1
        assert block["timing"]["tpot_ms"]["mean"] == 8.0
        again = PerRequest.from_block(json.loads(json.dumps(block)))
        again.merge(tally)
        assert again.answer()["timing"]["tokens_per_second"]["count"] == 2
        assert set(FIGURES) <= set(block["timing"]["buckets"])


class TestShardMerge:
    def test_targets_blocks_merge_into_the_aggregates_timing_exactly(self) -> None:
        from exporter.core.requestblock import merged_block

        blocks = {}
        for name, tpot in (("a", 4.0), ("b", 6.0)):
            tally = PerRequest()
            for _ in range(3):
                tally.record(from_json(json.dumps({
                    "id": "c", "model": "m", "choices": [],
                    "metrics": {"mean_itl_ms": tpot, "tokens_per_second": 1000 / tpot},
                    "usage": {"prompt_tokens": 1, "completion_tokens": 9}}).encode()))
            blocks[name] = json.loads(json.dumps(tally.answer()))  # as a peer sends it
        merged = merged_block(blocks, None)
        timing = merged["aggregate"]["timing"]
        assert (timing["timed"], timing["by_server"]) == (6, 6)
        assert timing["tpot_ms"]["mean"] == pytest.approx(5.0)
        assert merged["targets"]["b"]["timing"]["tpot_ms"]["p50"] == pytest.approx(6.0,
                                                                                 rel=0.005)


def _tagged(tag: str | None, in_flight: int, tpot: float):
    from dataclasses import replace

    from exporter.core.segments import RequestContext

    stats = from_json(json.dumps({
        "id": "c", "model": "m", "choices": [],
        "metrics": {"mean_itl_ms": tpot, "tokens_per_second": 1000 / tpot},
        "usage": {"prompt_tokens": 1, "completion_tokens": 9}}).encode())
    return replace(stats, context=RequestContext(tag, "m", "default", in_flight))


class TestSplitTimings:
    def _tally(self) -> PerRequest:
        tally = PerRequest()
        for i in range(12):
            tally.record(_tagged("chat" if i % 3 else None, 1 + i % 5, 4.0 + i))
        return tally

    def test_each_dimension_sums_to_the_timed_answers_and_round_trips(self) -> None:
        block = json.loads(json.dumps(self._tally().answer()))
        split = block["timing_by"]
        assert set(split) == {"concurrency", "tag"}
        assert {v: t["timed"] for v, t in split["tag"].items()} == {"chat": 8, "untagged": 4}
        assert {v: t["timed"] for v, t in split["concurrency"].items()} == {
            "1": 3, "2-3": 5, "4-7": 4}
        assert sum(t["tpot_ms"]["count"] * t["tpot_ms"]["mean"]
                   for t in split["concurrency"].values()) == pytest.approx(
            sum(4.0 + i for i in range(12)))
        again = PerRequest.from_block(block)
        assert again.answer()["timing_by"] == block["timing_by"]

    def test_targets_merge_value_by_value(self) -> None:
        merged = self._tally()
        merged.merge(self._tally())
        split = merged.answer()["timing_by"]
        assert split["tag"]["chat"]["timed"] == 16
        assert split["concurrency"]["1"]["tpot_ms"]["count"] == 6

    def test_values_past_the_bound_fall_in_other(self) -> None:
        from exporter.core.segments import MAX_SEGMENTS

        tally = PerRequest()
        for i in range(MAX_SEGMENTS + 5):
            tally.record(_tagged(f"t{i}", 1, 5.0))
        tags = tally.answer()["timing_by"]["tag"]
        assert len(tags) == MAX_SEGMENTS + 1 and tags["other"]["timed"] == 5

    def test_a_block_saved_before_the_split_reads_as_none(self) -> None:
        block = json.loads(json.dumps(self._tally().answer()))
        del block["timing_by"]
        assert PerRequest.from_block(block).answer()["timing_by"] == {
            "concurrency": {}, "tag": {}}

    def test_a_split_not_summing_to_the_timed_answers_is_refused(self) -> None:
        block = json.loads(json.dumps(self._tally().answer()))
        del block["timing_by"]["tag"]["chat"]
        with pytest.raises(ValueError, match="tag timings do not sum"):
            PerRequest.from_block(block)
