"""Table tests of other engines' answers read by the proxy's parse (`from_json`, `from_sse`):
SGLang's `sglext.spec_tokens_details` and llama.cpp's `timings.draft_n`, from fixtures made
after each project's source (tests/testdata/engines/README.md), then missing and hostile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.core.perrequest import (
    MAX_HISTOGRAM,
    PerRequest,
    RequestStats,
    Unreadable,
    format_block,
    from_json,
    from_sse,
)

DATA = Path(__file__).resolve().parent.parent / "testdata" / "engines"
UNKNOWN_LLAMA = ["num_spec_steps", "acceptance_histogram"]
SGLANG = {"engine": "sglang", "num_spec_steps": 10, "num_draft_tokens": 30,
          "num_accepted_draft_tokens": 15, "acceptance_histogram": [2, 3, 3, 2], "unknown": []}
LLAMA = {"engine": "llama.cpp", "num_spec_steps": None, "num_draft_tokens": 24,
         "num_accepted_draft_tokens": 17, "acceptance_histogram": None, "unknown": UNKNOWN_LLAMA}
SGLANG_ID = "8f3c2a1be4d54f6a9c0d7e21b5a4c3d2"
LLAMA_ID = "chatcmpl-Xq3vJ9kT2mR8wL5nB1cD7fH4pZ6sY0aE"
LLAMA_MODEL = "qwen2.5-7b-instruct-q4_k_m.gguf"
DETAILS = json.loads((DATA / "sglang_chat.json").read_text())["sglext"]["spec_tokens_details"]
TIMINGS = json.loads((DATA / "llamacpp_chat.json").read_text())["timings"]


def _read(name: str) -> RequestStats:
    data = (DATA / name).read_bytes()
    return from_sse(data) if name.endswith(".sse") else from_json(data)


def _sse(*objects: object) -> bytes:
    events = [json.dumps(o).encode() for o in objects] + [b"[DONE]"]
    return b"".join(b"data: " + e + b"\n\n" for e in events)


def _both(answer: dict[str, Any]) -> list[RequestStats]:
    """The answer read as a body, and streamed as vLLM-style chunks (figures in the last)."""
    head = {"id": "x", "model": "m", "choices": [{"delta": {"content": "t"}}]}
    return [from_json(json.dumps(answer).encode()),
            from_sse(_sse(head, head, {"id": "x", "choices": [], **answer}))]


class TestFixtures:
    @pytest.mark.parametrize(("name", "stats"), [
        ("sglang_chat.json", RequestStats(SGLANG_ID, "qwen3-8b", 12, 25, SGLANG)),
        ("sglang_chat_stream.sse", RequestStats(SGLANG_ID, "qwen3-8b", 12, 25, SGLANG)),
        ("sglang_completions_n2.json", RequestStats(
            SGLANG_ID, "qwen3-8b", 12, 39,
            SGLANG | {"num_spec_steps": 18, "num_draft_tokens": 54,
                      "num_accepted_draft_tokens": 21, "acceptance_histogram": [6, 5, 5, 2]})),
        ("llamacpp_chat.json", RequestStats(LLAMA_ID, LLAMA_MODEL, 14, 32, LLAMA)),
        # timings on the finish chunk, after token chunks the fast path skips
        ("llamacpp_chat_stream.sse", RequestStats(LLAMA_ID, LLAMA_MODEL, None, None, LLAMA)),
        ("llamacpp_chat_stream_usage.sse", RequestStats(LLAMA_ID, LLAMA_MODEL, 14, 32, LLAMA)),
    ])
    def test_each_engines_answer_reads_into_our_names(self, name: str,
                                                      stats: RequestStats) -> None:
        assert _read(name) == stats

    def test_llamacpp_per_token_timings_read_the_last_running_totals(self) -> None:
        head = {"id": "c", "model": "m", "choices": []}
        chunks = [head | {"timings": TIMINGS | {"draft_n": n, "draft_n_accepted": a}}
                  for n, a in ((4, 2), (12, 9), (24, 17))]
        assert from_sse(_sse(head, *chunks)).spec == LLAMA


class TestMissing:
    @pytest.mark.parametrize("answer", [
        {}, {"sglext": None}, {"sglext": {}}, {"sglext": {"spec_tokens_details": None}},
        {"sglext": {"spec_tokens_details": []}}, {"sglext": {"cached_tokens_details": {}}},
        {"timings": {k: v for k, v in TIMINGS.items() if not k.startswith("draft")}},
        {"timings": None}, {"timings": "x"}, {"timings": []},
    ])
    def test_an_answer_without_figures_reads_without_them(self, answer: dict[str, Any]) -> None:
        for stats in _both(answer):
            assert stats.unreadable is None and stats.spec is None

    def test_an_sglang_histogram_it_did_not_keep_is_unknown_not_invented(self) -> None:
        for stats in _both({"sglext": {"spec_tokens_details": DETAILS | {
                "spec_correct_drafts_histogram": []}}}):
            assert stats.spec == SGLANG | {"acceptance_histogram": None,
                                           "unknown": ["acceptance_histogram"]}

    def test_requests_without_steps_count_their_tokens_only(self) -> None:
        acc, other = PerRequest(), PerRequest()
        acc.record(_read("sglang_chat.json"))
        acc.record(_read("llamacpp_chat.json"))
        other.record(_read("llamacpp_chat_stream.sse"))
        acc.merge(other)
        block = acc.answer()
        assert (block["requests"], block["with_stats"], block["without_steps"]) == (3, 3, 2)
        assert (block["num_spec_steps"], block["num_draft_tokens"],
                block["num_accepted_draft_tokens"]) == (10, 30 + 2 * 24, 15 + 2 * 17)
        assert block["acceptance_histogram"] == [2, 3, 3, 2]
        assert block["acceptance_length"]["max"] == 2.5  # the SGLang request's only
        assert block["draft_acceptance_rate"]["max"] == 17 / 24
        assert [row["request_id"] for row in block["lowest"]] == [SGLANG_ID]
        assert "Requests (proxied / with stats)               3 / 3" in format_block("t", block)
        # a peer's block or a restored window keeps them; an older block has none
        assert PerRequest.from_block(block).answer()["without_steps"] == 2
        older = {k: v for k, v in block.items() if k not in ("without_steps", "by")}
        assert PerRequest.from_block(older).answer()["without_steps"] == 0
        for bad in (3, "2", -1):  # more with figures than requests; not a count
            with pytest.raises(ValueError):
                PerRequest.from_block(block | {"without_steps": bad})


def _sglang(**changed: object) -> dict[str, Any]:
    return {"sglext": {"spec_tokens_details": DETAILS | changed}}


def _llama(**changed: object) -> dict[str, Any]:
    return {"timings": TIMINGS | changed}


class TestHostile:
    @pytest.mark.parametrize(("answer", "reason"), [
        (_sglang(spec_verify_ct=-1), Unreadable.BAD_COUNTS),
        (_sglang(spec_num_proposed_drafts=True), Unreadable.BAD_COUNTS),
        (_sglang(spec_num_correct_drafts=1.5), Unreadable.BAD_COUNTS),
        (_sglang(spec_num_correct_drafts=2**53 + 1), Unreadable.BAD_COUNTS),
        (_sglang(spec_correct_drafts_histogram=[2, "3", 3, 2]), Unreadable.BAD_COUNTS),
        (_sglang(spec_correct_drafts_histogram={"0": 10}), Unreadable.BAD_COUNTS),
        (_sglang(spec_verify_ct=None), Unreadable.BAD_COUNTS),
        ({"sglext": {"spec_tokens_details": "10 steps"}}, Unreadable.BAD_COUNTS),
        ({"sglext": {"spec_tokens_details": [DETAILS, 7]}}, Unreadable.BAD_COUNTS),
        (_sglang(spec_num_correct_drafts=31, spec_correct_drafts_histogram=[0, 0, 0, 10]),
         Unreadable.ACCEPTED_OVER_DRAFTED),
        (_sglang(spec_correct_drafts_histogram=[2, 3, 3, 3]), Unreadable.HISTOGRAM_NOT_STEPS),
        (_sglang(spec_correct_drafts_histogram=[4, 0, 4, 2]), Unreadable.HISTOGRAM_NOT_ACCEPTED),
        (_sglang(spec_accept_rate=1.5), Unreadable.RATE_OUT_OF_RANGE),
        (_sglang(spec_accept_rate="0.5"), Unreadable.RATE_OUT_OF_RANGE),
        (_sglang(spec_correct_drafts_histogram=[10] + [0] * MAX_HISTOGRAM),
         Unreadable.HISTOGRAM_TOO_LONG),
        (_sglang(spec_correct_drafts_histogram=["x"] * 200_001), Unreadable.HISTOGRAM_TOO_LONG),
        ({"sglext": {"spec_tokens_details": [DETAILS] * (MAX_HISTOGRAM + 1)}},
         Unreadable.HISTOGRAM_TOO_LONG),
        ({"sglext": {"spec_tokens_details": [DETAILS, DETAILS | {"spec_verify_ct": 11}]}},
         Unreadable.HISTOGRAM_NOT_STEPS),
        (_llama(draft_n="24"), Unreadable.BAD_COUNTS),
        (_llama(draft_n=-1), Unreadable.BAD_COUNTS),
        (_llama(draft_n=True), Unreadable.BAD_COUNTS),
        (_llama(draft_n=2**53 + 1), Unreadable.BAD_COUNTS),
        (_llama(draft_n_accepted=None), Unreadable.BAD_COUNTS),
        ({"timings": {"draft_n": 24}}, Unreadable.BAD_COUNTS),
        (_llama(draft_n_accepted=25), Unreadable.ACCEPTED_OVER_DRAFTED),
    ])
    def test_figures_that_break_the_engines_rules_are_unreadable(
            self, answer: dict[str, Any], reason: Unreadable) -> None:
        for stats in _both(answer):
            assert stats == RequestStats.unread(reason)
        acc = PerRequest()
        acc.record(_both(answer)[0])
        block = acc.answer()
        assert (block["unreadable"], block["with_stats"], block["num_draft_tokens"]) == (1, 0, 0)
        assert block["unreadable_reasons"] == {str(reason): 1}

    def test_a_sound_list_at_the_cap_reads(self) -> None:
        stats = from_json(json.dumps({"sglext": {"spec_tokens_details": [DETAILS] * (
            MAX_HISTOGRAM)}}).encode())
        assert stats.spec is not None and stats.spec["num_spec_steps"] == 10 * MAX_HISTOGRAM
