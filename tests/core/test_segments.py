"""Tests of per-request segments: keys, bounds, exact sums, the delta-method interval, merging
and reading back (a peer's block, a window saved before segments)."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from typing import Any

import pytest

from exporter.core.perrequest import PerRequest, RequestStats
from exporter.core.requestblock import merged_block
from exporter.core.segments import (
    DIMENSIONS,
    MAX_COMBINED,
    MAX_SEGMENTS,
    MIN_REQUESTS,
    OTHER,
    InFlight,
    Segment,
    band,
    delta,
    request_context,
)


def _add(segment: Segment, spec: dict[str, Any]) -> None:
    segment.add(delta(spec), spec["acceptance_histogram"])


def _spec(steps: int, accepted: list[int], k: int = 3) -> dict[str, Any]:
    """A vLLM object: `accepted[i]` tokens accepted at step i (of `steps`)."""
    histogram = [0] * (k + 1)
    for n in accepted:
        histogram[n] += 1
    return {"num_spec_steps": steps, "num_draft_tokens": k * steps,
            "num_accepted_draft_tokens": sum(accepted), "acceptance_histogram": histogram}


def _stats(tag: str | None, accepted: list[int], *, concurrency: int = 1, prompt: int = 100,
           temperature: bytes = b"") -> RequestStats:
    body = b'{"model": "m"' + temperature + b"}"
    return RequestStats("r", "m", prompt, len(accepted), _spec(len(accepted), accepted),
                        context=request_context(tag, body, concurrency))


def _random_tally(seed: int, requests: int = 60) -> PerRequest:
    rng = random.Random(seed)
    acc = PerRequest()
    for i in range(requests):
        steps = rng.randint(1, 30)
        acc.record(_stats(rng.choice(["a", "b", None]), [rng.randint(0, 3) for _ in range(steps)],
                          concurrency=rng.randint(1, 9), prompt=rng.randint(0, 5000),
                          temperature=rng.choice([b"", b', "temperature": 0',
                                                  b', "temperature": 0.7'])))
        if i % 7 == 0:
            acc.record(RequestStats("x", "m", 3, 4, None, context=request_context("a", None, 1)))
    return acc


def _sums_match(block: dict[str, Any]) -> None:
    for dimension in DIMENSIONS:
        segments = block["by"][dimension].values()
        for key in ("requests", "with_stats", "num_spec_steps", "num_draft_tokens",
                    "num_accepted_draft_tokens"):
            assert sum(s[key] for s in segments) == block[key], (dimension, key)
        hist = [sum(col) for col in zip(*(s["acceptance_histogram"] for s in segments
                                          if s["acceptance_histogram"]), strict=True)]
        assert hist == block["acceptance_histogram"], dimension


class TestKeys:
    @pytest.mark.parametrize(("value", "label"), [
        (None, "unknown"), (0, "0"), (1, "1"), (2, "2-3"), (3, "2-3"), (4, "4-7"),
        (1023, "512-1023"), (1024, "1024-2047")])
    def test_bands_are_powers_of_two(self, value: int | None, label: str) -> None:
        assert band(value) == label

    def test_a_request_is_keyed_by_tag_model_bands_temperature_and_concurrency(self) -> None:
        acc = PerRequest()
        acc.record(_stats("math", [1, 2], concurrency=5, prompt=300,
                          temperature=b', "temperature": 0.5'))
        acc.record(_stats(None, [3], temperature=b""))
        by = acc.answer()["by"]
        assert list(by["tag"]) == ["math", "untagged"]
        assert list(by["model"]) == ["m"]
        assert list(by["prompt_tokens"]) == ["64-127", "256-511"]
        assert list(by["output_tokens"]) == ["1", "2-3"]
        assert list(by["temperature"]) == ["0.5", "default"]
        assert list(by["concurrency"]) == ["1", "4-7"]

    def test_a_body_not_read_or_not_json_leaves_the_temperature_unknown(self) -> None:
        assert request_context("t", None, 2).temperature == "unknown"
        assert request_context("t", b"{not json", 2).temperature == "unknown"
        assert request_context("t", b'{"temperature": "hot"}', 2).temperature == OTHER

    @pytest.mark.parametrize("tag", ["", "with space", "x" * 129, "tab\t", "naïve"])
    def test_client_text_outside_the_rule_falls_in_other(self, tag: str) -> None:
        acc = PerRequest()
        acc.record(_stats(tag, [1]))
        assert list(acc.answer()["by"]["tag"]) == [OTHER]

    def test_tags_past_the_cap_fall_in_one_other_segment_and_merges_keep_the_cap(self) -> None:
        acc, more = PerRequest(), PerRequest()
        for i in range(MAX_SEGMENTS + 10):
            acc.record(_stats(f"t{i}", [1]))
            more.record(_stats(f"u{i}", [2]))
        acc.merge(more)
        tags = acc.answer()["by"]["tag"]
        assert len(tags) == MAX_SEGMENTS + 1
        assert tags[OTHER]["requests"] == 2 * (MAX_SEGMENTS + 10) - MAX_SEGMENTS
        _sums_match(acc.answer())

    def test_the_in_flight_count_is_each_requests_own_start(self) -> None:
        flight = InFlight("X-Tag")
        with flight.counted({"X-Tag": "a"}, None) as first:
            with flight.counted({}, b'{"model": "q", "temperature": 1}') as second:
                pass
            with pytest.raises(OSError), flight.counted({"X-Tag": "c"}, None) as third:
                raise OSError  # a relay that fails leaves the count too
        assert flight.count == 0
        assert (first.concurrency, second.concurrency, third.concurrency) == (1, 2, 2)
        assert (first.tag, second.tag, second.model, second.temperature) == ("a", None, "q", "1")


class TestSums:
    @pytest.mark.parametrize("seed", range(5))
    def test_each_dimensions_segments_sum_to_the_per_request_totals_exactly(
            self, seed: int) -> None:
        _sums_match(_random_tally(seed).answer())

    def test_more_combinations_than_are_held_together_fold_with_nothing_lost(self) -> None:
        rng = random.Random(11)
        acc, want = PerRequest(), Counter()
        for _ in range(3 * MAX_COMBINED):
            tag, concurrency = f"t{rng.randrange(20)}", rng.randint(1, 64)
            acc.record(_stats(tag, [1, 2], concurrency=concurrency, prompt=rng.randint(1, 9000)))
            want[tag, band(concurrency)] += 1
        block = acc.answer()
        _sums_match(block)
        tags, loads = Counter(), Counter()
        for (tag, load), n in want.items():
            tags[tag] += n
            loads[load] += n
        assert {t: s["requests"] for t, s in block["by"]["tag"].items()} == dict(tags)
        assert {c: s["requests"] for c, s in block["by"]["concurrency"].items()} == dict(loads)

    def test_merged_tallies_and_their_segments_still_sum_exactly(self) -> None:
        acc = _random_tally(1)
        acc.merge(_random_tally(2))
        _sums_match(acc.answer())
        assert acc.answer()["by"]["tag"]["a"]["requests"] == (
            _random_tally(1).answer()["by"]["tag"]["a"]["requests"]
            + _random_tally(2).answer()["by"]["tag"]["a"]["requests"])

    def test_the_share_of_the_counters_drafts_is_each_segments_steps(self) -> None:
        acc = _random_tally(3)
        steps = acc.answer()["num_spec_steps"]
        by = acc.answer({"num_drafts": 2 * steps, "draft_tokens": 1, "accepted_tokens": 1})["by"]
        assert math.isclose(sum(s["share_of_drafts"] for s in by["tag"].values()), 0.5)


class TestInterval:
    def test_the_length_is_the_ratio_of_sums_with_the_delta_method_interval(self) -> None:
        seg = Segment()
        rows = [(4, [1, 2, 0, 3]), (2, [3, 3]), (5, [0, 0, 1, 0, 0])] * 4
        for steps, accepted in rows:
            _add(seg, _spec(steps, accepted))
        n = [s for s, _ in rows]
        a = [sum(x) for _, x in rows]
        r = sum(a) / sum(n)
        k = len(rows)
        se = math.sqrt(k / (k - 1) * sum((ai - r * ni) ** 2 for ai, ni in zip(a, n,
                                                                               strict=True)))
        se /= sum(n)
        length = seg.answer(None)["acceptance_length"]
        assert math.isclose(length["value"], 1 + r)
        assert math.isclose(length["high"] - length["value"], 1.959963984540054 * se)
        rate = seg.answer(None)["draft_acceptance_rate"]
        assert math.isclose(rate["value"], sum(a) / (3 * sum(n)))

    def test_the_interval_covers_the_truth_about_95_percent_of_the_time(self) -> None:
        rng = random.Random(7)
        covered = 0
        for _ in range(400):
            seg = Segment()
            for _ in range(40):
                steps = rng.randint(1, 20)
                _add(seg, _spec(steps, [rng.choice([0, 1, 3]) for _ in range(steps)]))
            length = seg.answer(None)["acceptance_length"]
            covered += length["low"] <= 1 + 4 / 3 <= length["high"]
        assert 0.91 <= covered / 400 <= 0.99

    def test_a_segment_with_too_few_requests_says_so_instead_of_a_number(self) -> None:
        seg = Segment()
        for _ in range(MIN_REQUESTS - 1):
            _add(seg, _spec(2, [1, 1]))
        block = seg.answer(None)
        assert block["acceptance_length"] is None and block["draft_acceptance_rate"] is None
        assert f"{MIN_REQUESTS - 1} requests" in block["note"] and "too few" in block["note"]
        _add(seg, _spec(2, [1, 1]))
        assert seg.answer(None)["acceptance_length"]["value"] == 2.0


class TestReadBack:
    def test_a_block_reads_back_to_the_same_segments(self) -> None:
        block = _random_tally(4).answer()
        assert PerRequest.from_block(block).answer() == block

    def test_a_window_saved_before_segments_reads_with_its_requests_in_unknown(self) -> None:
        block = _random_tally(5).answer()
        older = {k: v for k, v in block.items() if k != "by"}
        again = PerRequest.from_block(older).answer()
        _sums_match(again)
        for dimension in DIMENSIONS:
            unknown = again["by"][dimension]["unknown"]
            assert unknown["requests"] == block["requests"]
            assert unknown["acceptance_length"] is None and "before segments" in unknown["note"]

    @pytest.mark.parametrize("damage", ["uneven", "not_counts", "dimension", "too_many"])
    def test_a_peers_malformed_segments_are_refused(self, damage: str) -> None:
        block = _random_tally(6).answer()
        by = block["by"]
        if damage == "uneven":
            by["tag"]["a"]["requests"] += 1
        elif damage == "not_counts":
            by["model"]["m"]["moments"]["aa"] = -1
        elif damage == "dimension":
            del by["concurrency"]
        else:
            by["tag"] |= {f"z{i}": by["tag"]["a"] for i in range(MAX_SEGMENTS + 1)}
        with pytest.raises(ValueError):
            PerRequest.from_block(block)


class TestFleetAndState:
    def test_shards_blocks_merge_to_the_segments_of_one_tally(self) -> None:
        one, two = _random_tally(8), _random_tally(9)
        merged = merged_block({"x": one.answer(), "y": two.answer()}, None)["aggregate"]
        whole = _random_tally(8)
        whole.merge(_random_tally(9))
        assert merged["by"] == whole.answer()["by"]
        _sums_match(merged)

    def test_an_open_windows_saved_tally_keeps_its_segments(self) -> None:
        acc = _random_tally(10)
        again = PerRequest.from_dict(json.loads(json.dumps(acc.to_dict())))
        assert again.answer()["by"] == acc.answer()["by"]
        again.record(_stats("a", [1, 2]))
        acc.record(_stats("a", [1, 2]))
        assert again.answer() == acc.answer()
