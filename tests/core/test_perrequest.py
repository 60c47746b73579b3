"""Tests of the per-request figures: reading vLLM's object from a body or a stream, summing them."""

from __future__ import annotations

import json

import pytest

from exporter.core.perrequest import (
    MAX_HISTOGRAM,
    MAX_TIMES,
    NO_STATS_REASON,
    PerRequest,
    RequestStats,
    Unreadable,
    coverage,
    format_block,
    format_per_request,
    from_json,
    from_sse,
    in_spans,
    merged_block,
    per_position_accepted,
    per_request_block,
    span_totals,
)

SPEC = {"num_spec_steps": 4, "num_draft_tokens": 12, "num_accepted_draft_tokens": 6,
        "num_spec_tokens": 3, "mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5,
        "acceptance_histogram": [1, 1, 1, 1]}


def _stats(spec: dict[str, object] | None, rid: str = "r") -> RequestStats:
    return RequestStats(rid, "m", 3, 10, spec)


class TestReading:
    def test_a_json_body_gives_id_model_usage_and_the_object(self) -> None:
        body = {"id": "cmpl-1", "model": "m", "usage": {"prompt_tokens": 2,
                                                          "completion_tokens": 10},
                "metrics": {"speculative_decoding": SPEC}}
        stats = from_json(json.dumps(body).encode())
        assert stats == RequestStats("cmpl-1", "m", 2, 10, SPEC)

    def test_a_stream_takes_the_object_from_whichever_chunk_carries_it(self) -> None:
        chunks = [{"id": "c", "model": "m", "choices": []},
                  {"id": "c", "choices": [], "metrics": {"speculative_decoding": SPEC}},
                  {"id": "c", "choices": [], "usage": {"prompt_tokens": 1,
                                                       "completion_tokens": 5}}]
        text = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
        stats = from_sse(text + b": comment\n\ndata: [DONE]\n\n")
        assert stats == RequestStats("c", "m", 1, 5, SPEC)

    def test_a_stream_reads_the_same_with_token_chunks_skipped(self) -> None:
        # Token chunks (no usage, no metrics) are not decoded once id and model are known;
        # what is read stays that of decoding every event, broken token chunks included.
        tokens = [{"id": "c", "model": "m", "choices": [{"text": f"t{i}"}]} for i in range(30)]
        last = {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 30},
                "metrics": {"speculative_decoding": SPEC}}
        events = [json.dumps(c).encode() for c in [*tokens, last]]
        events.insert(5, b"{broken")
        text = b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        assert from_sse(text) == RequestStats("c", "m", 3, 30, SPEC)
        late_id = [b'{"choices": []}', b'{"id": "c", "choices": []}', b'{"model": "m"}',
                   b"[DONE]"]
        assert from_sse(b"".join(b"data: " + e + b"\n\n" for e in late_id)) == RequestStats(
            "c", "m", None, None, None)

    @pytest.mark.parametrize("body", [b"not json", b"[1]", b"\xff", b""])
    def test_a_body_that_is_no_answer_object_is_unreadable(self, body: bytes) -> None:
        assert from_json(body) == RequestStats.unread(Unreadable.NOT_AN_ANSWER)

    def test_a_stream_with_no_json_event_is_unreadable(self) -> None:
        assert from_sse(b"data: {broken\n\ndata: [DONE]\n\n").unreadable == (
            Unreadable.NOT_AN_ANSWER)

    def test_an_answer_without_the_object_is_read_without_figures(self) -> None:
        for metrics in ({}, {"speculative_decoding": None}, [], "x"):
            stats = from_json(json.dumps({"id": "x", "metrics": metrics}).encode())
            assert stats.unreadable is None and stats.spec is None

    @pytest.mark.parametrize("bad", [{"num_spec_steps": -1}, {"num_draft_tokens": True},
                                     {"acceptance_histogram": [1, "x"]},
                                     {"acceptance_histogram": None},
                                     {"num_draft_tokens": 2**53 + 1},
                                     {"num_accepted_draft_tokens": 1.5}])
    def test_an_object_with_unsound_counts_is_unreadable(self, bad: dict[str, object]) -> None:
        body = {"id": "x", "metrics": {"speculative_decoding": SPEC | bad}}
        assert from_json(json.dumps(body).encode()) == RequestStats.unread(Unreadable.BAD_COUNTS)
        assert from_json(json.dumps({"metrics": {"speculative_decoding": [SPEC]}}).encode()
                         ).unreadable == Unreadable.BAD_COUNTS


def _sse(*objects: object, done: bool = True) -> bytes:
    events = [json.dumps(o).encode() for o in objects] + ([b"[DONE]"] if done else [])
    return b"".join(b"data: " + e + b"\n\n" for e in events)


_LAST = {"id": "c", "model": "m", "choices": [], "metrics": {"speculative_decoding": SPEC}}


class TestHostileAnswers:
    """Every answer reads as figures, no figures, or unreadable with its reason."""

    @pytest.mark.parametrize(("bad", "reason"), [
        # the issue's: 500 accepted of 3 drafted, a histogram of 900 steps for 1
        ({"num_spec_steps": 1, "num_draft_tokens": 3, "num_accepted_draft_tokens": 500,
          "acceptance_histogram": [0, 0, 0, 900]}, Unreadable.ACCEPTED_OVER_DRAFTED),
        ({"num_draft_tokens": 5}, Unreadable.ACCEPTED_OVER_DRAFTED),
        ({"acceptance_histogram": [1, 1, 1, 2]}, Unreadable.HISTOGRAM_NOT_STEPS),
        ({"acceptance_histogram": []}, Unreadable.HISTOGRAM_NOT_STEPS),
        ({"draft_acceptance_rate": 1.67}, Unreadable.RATE_OUT_OF_RANGE),
        ({"draft_acceptance_rate": -0.1}, Unreadable.RATE_OUT_OF_RANGE),
        ({"draft_acceptance_rate": "0.5"}, Unreadable.RATE_OUT_OF_RANGE),
    ])
    def test_figures_that_break_vllms_invariants_are_unreadable(
            self, bad: dict[str, object], reason: Unreadable) -> None:
        spec = SPEC | bad
        body = json.dumps({"id": "x", "metrics": {"speculative_decoding": spec}}).encode()
        assert from_json(body).unreadable == reason
        streamed = from_sse(_sse({"id": "x", "model": "m", "choices": []},
                                 _LAST | {"metrics": {"speculative_decoding": spec}}))
        assert streamed.unreadable == reason
        acc = PerRequest()
        acc.record(from_json(body))
        block = acc.answer()
        assert (block["unreadable"], block["with_stats"], block["without_stats"]) == (1, 0, 0)
        assert block["unreadable_reasons"] == {str(reason): 1}
        assert block["draft_acceptance_rate"] is None and block["num_draft_tokens"] == 0

    @pytest.mark.parametrize("cut", [
        _sse(_LAST)[:-30],  # inside the [DONE] event
        _sse(_LAST)[:60],  # inside the object's event
        _sse(_LAST)[:-1],  # the last blank line missing
        _sse(_LAST).replace(b"\n\n", b"\r\n\r\n")[:-2],
    ])
    def test_a_stream_cut_mid_event_is_unreadable(self, cut: bytes) -> None:
        assert from_sse(cut) == RequestStats.unread(Unreadable.CUT_MID_EVENT)

    def test_a_stream_cut_between_events_is_unreadable(self) -> None:
        # Before [DONE], where vLLM's last object may be still to come.
        assert from_sse(_sse({"id": "c", "model": "m", "choices": []}, done=False)) == (
            RequestStats.unread(Unreadable.NO_DONE))
        assert from_sse(b"") == RequestStats.unread(Unreadable.NO_DONE)
        assert from_sse(_sse(_LAST)).spec == SPEC  # the whole one reads

    @pytest.mark.parametrize("depth", [2_000, 200_000])
    def test_nesting_past_the_decoder_is_unreadable_not_an_error(self, depth: int) -> None:
        deep = '{"a": ' * depth + "1" + "}" * depth
        in_spec = f'{{"id": "x", "metrics": {{"speculative_decoding": {deep}}}}}'.encode()
        assert from_json(in_spec) == RequestStats.unread(Unreadable.TOO_DEEP)
        arrays = b'{"id": "x", "choices": ' + b"[" * depth + b"]" * depth + b"}"
        assert from_json(arrays) == RequestStats.unread(Unreadable.TOO_DEEP)
        stream = _sse({"id": "c", "model": "m"}) .replace(
            b"data: [DONE]", b"data: " + in_spec + b"\n\ndata: [DONE]")
        assert from_sse(stream) == RequestStats.unread(Unreadable.TOO_DEEP)

    @pytest.mark.parametrize("entries", [MAX_HISTOGRAM + 1, 20_001, 200_001])
    def test_a_histogram_longer_than_the_cap_is_unreadable(self, entries: int) -> None:
        hist = [0] * entries
        hist[0] = SPEC["num_spec_steps"]
        spec = SPEC | {"acceptance_histogram": hist}
        body = json.dumps({"id": "x", "metrics": {"speculative_decoding": spec}}).encode()
        assert from_json(body) == RequestStats.unread(Unreadable.HISTOGRAM_TOO_LONG)
        # Not even a look at its entries: a long one of junk reads the same.
        junk = SPEC | {"acceptance_histogram": ["x"] * entries}
        assert from_json(json.dumps({"metrics": {"speculative_decoding": junk}}).encode(
        )).unreadable == Unreadable.HISTOGRAM_TOO_LONG

    def test_a_histogram_at_the_cap_reads(self) -> None:
        hist = [0] * MAX_HISTOGRAM
        hist[2] = SPEC["num_spec_steps"]
        spec = SPEC | {"acceptance_histogram": hist, "num_accepted_draft_tokens": 8}
        body = json.dumps({"id": "x", "metrics": {"speculative_decoding": spec}}).encode()
        assert from_json(body).spec == spec

    def test_reasons_are_counted_merged_and_printed(self) -> None:
        acc, other = PerRequest(), PerRequest()
        for reason in (Unreadable.CUT_MID_EVENT, Unreadable.TOO_DEEP, Unreadable.CUT_MID_EVENT):
            acc.record(RequestStats.unread(reason))
        other.record(RequestStats.unread(Unreadable.TOO_DEEP))
        other.record(_stats(SPEC))
        acc.merge(other)
        block = acc.answer()
        assert block["unreadable_reasons"] == {"cut_mid_event": 2, "too_deep": 2}
        assert (block["requests"], block["unreadable"], block["with_stats"]) == (5, 4, 1)
        assert "Unreadable answers                            4 (cut_mid_event 2, too_deep 2)" in (
            format_block("t", block))


class TestPerRequest:
    def test_sums_histogram_and_per_position_rates(self) -> None:
        acc = PerRequest()
        acc.record(_stats(SPEC))
        acc.record(_stats(SPEC | {"num_spec_steps": 2, "num_draft_tokens": 6,
                                  "num_accepted_draft_tokens": 6,
                                  "acceptance_histogram": [0, 0, 0, 2]}))
        block = acc.answer()
        assert block["requests"] == 2 and block["with_stats"] == 2 and block["reason"] is None
        assert block["num_spec_steps"] == 6 and block["num_accepted_draft_tokens"] == 12
        assert block["acceptance_histogram"] == [1, 1, 1, 3]
        assert block["per_position_acceptance_rates"] == {"0": 5 / 6, "1": 4 / 6, "2": 3 / 6}
        assert block["acceptance_length"]["min"] == 2.5
        assert block["acceptance_length"]["max"] == 4.0
        assert block["draft_acceptance_rate"]["mean"] == 0.75

    def test_requests_without_the_object_say_how_to_start_vllm(self) -> None:
        acc = PerRequest()
        acc.record(_stats(None))
        acc.record(RequestStats.unread(Unreadable.NOT_AN_ANSWER))
        block = acc.answer()
        assert (block["without_stats"], block["unreadable"]) == (1, 1)
        assert block["reason"] == NO_STATS_REASON
        assert block["acceptance_length"] is None and block["per_position_acceptance_rates"] == {}

    def test_lowest_keeps_the_ten_lowest_lengths(self) -> None:
        acc = PerRequest()
        for n in range(15):
            acc.record(_stats(SPEC | {"num_accepted_draft_tokens": n}, rid=str(n)))
        other = PerRequest()
        other.record(_stats(SPEC | {"num_accepted_draft_tokens": 0, "num_draft_tokens": 0},
                            rid="z"))
        acc.merge(other)
        lowest = acc.answer()["lowest"]
        assert [r["request_id"] for r in lowest] == ["0", "z"] + [str(n) for n in range(1, 9)]
        assert acc.requests == 16 and acc.rates.count == 15

    def test_covers_all_when_the_sums_equal_the_counters_increase(self) -> None:
        acc = PerRequest()
        acc.record(_stats(SPEC))
        same = {"num_drafts": 4, "draft_tokens": 12, "accepted_tokens": 6}
        assert acc.answer(same)["covers_all"] is True
        half = coverage(acc.sums, same | {"num_drafts": 8})
        assert half == {"covers_all": False, "missed_by": "proxy", "share_of_drafts": 0.5}
        lost = coverage(acc.sums, {"num_drafts": 1, "draft_tokens": 3, "accepted_tokens": 1})
        assert lost["missed_by"] == "counters" and lost["share_of_drafts"] == 4.0
        assert coverage(acc.sums, {})["share_of_drafts"] is None


class TestMath:
    @pytest.mark.parametrize(("hist", "per_pos"), [([], []), ([5], []), ([1, 2, 3], [5, 3]),
                                                   ([4, 0, 1, 0, 2], [3, 3, 2, 2])])
    def test_per_position_accepted_counts_steps_beyond_each_position(
            self, hist: list[int], per_pos: list[int]) -> None:
        assert per_position_accepted(hist) == per_pos


class TestConsole:
    def _answer(self, *blocks: dict[str, object]) -> dict[str, object]:
        targets = {f"t{i}": b for i, b in enumerate(blocks)}
        return {"per_request": {"targets": targets, "aggregate": blocks[0]}}

    def test_a_section_per_target_then_all(self) -> None:
        acc = PerRequest()
        acc.record(_stats(SPEC))
        full = acc.answer({"num_drafts": 4, "draft_tokens": 12, "accepted_tokens": 6})
        part = acc.answer({"num_drafts": 8, "draft_tokens": 12, "accepted_tokens": 6})
        text = format_per_request(self._answer(full, part))
        assert text.count("Per-request spec decode") == 3 and "[all]" in text
        assert "Acceptance histogram (steps by accepted)      0:1 1:1 2:1 3:1" in text
        assert "Proxy saw all the server activity             yes" in text
        assert "no: the server had activity the proxy did not see (it saw 50.0%" in text
        assert "Acceptance length                                 2.50    2.50" in text

    def test_without_stats_the_reason_and_unreadable_count_show(self) -> None:
        acc = PerRequest()
        acc.record(RequestStats.unread(Unreadable.NOT_AN_ANSWER))
        acc.record(_stats(None))
        text = format_per_request(self._answer(acc.answer(), ))
        assert NO_STATS_REASON in text and "Unreadable answers" in text
        assert "Acceptance length" not in text and "[all]" not in text
        assert format_per_request({"results": {}}) == ""


def _spec(drafted: int, accepted: int) -> dict[str, object]:
    return {"num_spec_steps": 4, "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted, "acceptance_histogram": [1, 1, 1, 1]}


class TestUnobservedSpans:
    def test_requests_finished_inside_each_span_are_counted_with_their_tokens(self):
        acc = PerRequest()
        for at, drafted, accepted in ((10.0, 12, 5), (11.0, 12, 7), (12.5, 12, 9), (20.0, 3, 1)):
            acc.record(_stats(_spec(drafted, accepted)), at)
        spans = in_spans(acc, [{"from": 10.5, "to": 12.5}, {"from": 19.0, "to": 30.0}])
        assert [(s["requests"], s["num_draft_tokens"], s["num_accepted_draft_tokens"])
                for s in spans] == [(2, 24, 16), (1, 3, 1)]
        assert all(s["complete"] for s in spans)
        assert span_totals(spans) == {"spans": 2, "requests": 3, "num_draft_tokens": 27,
                                      "num_accepted_draft_tokens": 17, "complete": True}

    def test_odd_spans_from_a_peer_are_skipped(self):
        acc = PerRequest()
        acc.record(_stats(_spec(3, 1)), 5.0)
        assert in_spans(acc, ["x", {"from": "a", "to": 9}, {"from": 1}, None]) == []

    def test_past_the_bound_the_figures_are_a_lower_bound(self):
        acc = PerRequest()
        for i in range(MAX_TIMES + 5):
            acc.record(_stats(_spec(1, 1)), float(i))
        assert len(acc.finished) == MAX_TIMES and acc.requests == MAX_TIMES + 5
        (span,) = in_spans(acc, [{"from": 0.0, "to": 1e9}])
        assert span["requests"] == MAX_TIMES and span["complete"] is False
        block = acc.answer() | {"unobserved": [span]}
        assert "(at least)" in format_block("t", block)

    def test_the_console_prints_one_line_per_span(self):
        acc = PerRequest()
        acc.record(_stats(_spec(12, 5)), 1_800_000_001.0)
        block = acc.answer() | {"unobserved": in_spans(
            acc, [{"from": 1_800_000_000.0, "to": 1_800_000_002.5}])}
        lines = [line for line in format_block("t", block).splitlines()
                 if line.startswith("In the unobserved span")]
        assert lines == ["In the unobserved span                        "
                         "2027-01-15T08:00:00.000Z to 2027-01-15T08:00:02.500Z: "
                         "1 requests, 12 drafted, 5 accepted"]


def _spec_of(steps: int, drafted: int, accepted: int) -> dict[str, object]:
    return {"num_spec_steps": steps, "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted, "acceptance_histogram": [steps - 1, 1]}


class TestBounded:
    def test_a_scrape_lets_go_of_earlier_finish_times_unless_it_showed_a_restart(self):
        acc = PerRequest()
        for at in (1.0, 2.0, 3.0):
            acc.record(_stats(_spec(3, 1)), at)
        acc.scraped(2.5, restarted=False)
        assert list(acc.finished) == [3.0] and acc.kept == 0
        acc.record(_stats(_spec(5, 2)), 4.0)
        acc.scraped(4.5, restarted=True)  # 3.0 and 4.0 may lie in the restart's span
        acc.record(_stats(_spec(7, 3)), 5.0)
        acc.scraped(6.0, restarted=False)  # kept ones stay, later ones go
        assert list(acc.finished) == [3.0, 4.0] and list(acc.drafted) == [3, 5]
        assert acc.kept == 2 and acc.requests == 5 and acc.sums["num_draft_tokens"] == 21

    def test_a_million_requests_keep_a_bounded_tally(self):
        acc = PerRequest()
        for i in range(20_000):
            acc.record(_stats(_spec_of(10, 40, i % 41)), float(i))
            if i % 100 == 99:
                acc.scraped(float(i) + 0.5, restarted=False)
        assert acc.requests == 20_000 and len(acc.finished) == 0
        assert len(acc.lengths.counts) <= 41 and len(acc.rows) == 10

    def test_a_block_gives_back_its_tally_exactly(self):
        acc = PerRequest()
        for i in range(50):
            acc.record(_stats(_spec_of(8, 24, i % 25), rid=f"r{i}"), float(i))
        acc.record(RequestStats.unread(Unreadable.CUT))
        block = acc.answer({"num_drafts": 400, "draft_tokens": 1200, "accepted_tokens": 600})
        again = PerRequest.from_block(json.loads(json.dumps(block)))
        assert again.answer({"num_drafts": 400, "draft_tokens": 1200,
                             "accepted_tokens": 600}) == block
        stored = PerRequest.from_dict(json.loads(json.dumps(acc.to_dict())))
        assert stored.answer() == acc.answer() and list(stored.finished) == list(acc.finished)

    @pytest.mark.parametrize("bad", [
        {"requests": -1}, {"acceptance_histogram": ["x"]}, {"lowest": [{"request_id": 1}]},
        {"buckets": {"acceptance_length": {"width": 0.5}}}, {"buckets": None},
        {"unreadable": 10**6}, {"unreadable_reasons": {"nope": 1}},
        {"unreadable_reasons": {"cut": 5}}])
    def test_a_peers_malformed_block_is_refused(self, bad: dict[str, object]) -> None:
        acc = PerRequest()
        acc.record(_stats(SPEC))
        with pytest.raises(ValueError):
            PerRequest.from_block(acc.answer() | bad)

    def test_the_aggregate_is_the_same_made_from_tallies_or_from_blocks(self):
        tallies = {"a": PerRequest(), "b": PerRequest()}
        for i in range(30):
            tallies["ab"[i % 2]].record(_stats(_spec_of(6, 18, i % 19), rid=str(i)), float(i))
        results = {n: {"data": {"num_drafts": t.sums["num_spec_steps"], "draft_tokens": 1,
                                "accepted_tokens": 1}} for n, t in tallies.items()}
        answer = {"results": results, "aggregate": {"data": {"num_drafts": 180}}}
        local = per_request_block(tallies, answer)
        assert local is not None
        # What a fleet does with each shard's target blocks, sent over JSON.
        blocks = json.loads(json.dumps(local["targets"]))
        assert merged_block(blocks, answer) == local
        assert local["aggregate"]["requests"] == 30
        assert local["aggregate"]["share_of_drafts"] == 1.0


class TestCrossCheck:
    @pytest.mark.parametrize(("counters", "said"), [
        ({"num_drafts": 4, "draft_tokens": 12, "accepted_tokens": 6}, "yes"),
        ({"num_drafts": 8, "draft_tokens": 24, "accepted_tokens": 12},
         "no: the server had activity the proxy did not see (it saw 50.0% of the counted "
         "drafts)"),
        ({"num_drafts": 1, "draft_tokens": 3, "accepted_tokens": 1},
         "no: the counters missed activity the proxy saw (400.0% of the counted drafts; a "
         "restart lost it)")])
    def test_the_console_says_which_side_missed_activity(self, counters, said) -> None:
        acc = PerRequest()
        acc.record(_stats(SPEC))
        (line,) = [line for line in format_block("t", acc.answer(counters)).splitlines()
                   if line.startswith("Proxy saw all")]
        assert line == f"{'Proxy saw all the server activity':46}{said}"
