"""Windows from a store's raw samples: the live window's exact, reset-safe accounting."""

from __future__ import annotations

import math

from exporter.core.storecount import (
    RawSeries,
    coverage,
    family_names,
    group_targets,
    history_answer,
)

DRAFTS = "vllm:spec_decode_num_drafts_total"
TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def _series(name: str, instance: str, samples: list[tuple[float, float]],
            **labels: str) -> RawSeries:
    return RawSeries({"__name__": name, "instance": instance, "model_name": "m", **labels},
                     samples)


def _target(instance: str, drafts: list[float], start: float = 100.0) -> list[RawSeries]:
    times = [start + i for i in range(len(drafts))]
    return [_series(DRAFTS, instance, list(zip(times, drafts, strict=True))),
            _series(TOKENS, instance, [(t, 3 * d) for t, d in zip(times, drafts, strict=True)]),
            _series(ACCEPTED, instance, [(t, 2 * d) for t, d in zip(times, drafts, strict=True)])]


def test_every_dialects_families_are_queried() -> None:
    names = family_names()
    assert DRAFTS in names and "vllm:spec_decode_num_drafts_created" in names
    assert "vllm:spec_decode_num_emitted_tokens_total" in names  # V0
    assert "llamacpp:spec_decode_num_drafts_total" in names
    assert "sglang:spec_accept_length" in names
    assert "trtllm_spec_decode_drafted_tokens_total" in names


def test_a_restart_counts_before_and_after_it() -> None:
    # 10 -> 25 (+15), restart to 4 (+4), -> 9 (+5): 24 drafts.
    answer = history_answer(_target("a:1", [10, 25, 4, 9]), 99.0, 104.0,
                            query_url="http://user:pw@store:9090")
    result = answer["results"]["a:1"]
    assert result["increase"]["num_drafts"] == 24
    assert result["increase"]["num_draft_tokens"] == 72
    assert result["increase"]["num_accepted_tokens"] == 48
    assert "restart" in result["reset_note"]
    assert answer["source"] == "prometheus"
    assert "pw" not in answer["query"] and "store:9090" in answer["query"]


def test_a_nan_scrape_is_skipped_and_bridged_exactly() -> None:
    answer = history_answer(_target("a:1", [10, math.nan, 30, 31]), 99.0, 104.0,
                            query_url="http://store")
    assert answer["results"]["a:1"]["increase"]["num_drafts"] == 21


def test_targets_are_grouped_by_instance_or_by_labels() -> None:
    series = [*_target("a:1", [1, 2]), *_target("b:1", [5, 9])]
    assert sorted(group_targets(series, ())) == ["a:1", "b:1"]
    pods = [_series(DRAFTS, "x", [(1.0, 1.0)], pod="p1"),
            _series(DRAFTS, "y", [(1.0, 1.0)], pod="p1")]
    assert list(group_targets(pods, ["pod"])) == ["p1"]
    answer = history_answer(series, 99.0, 102.0, query_url="http://store")
    assert answer["results"]["b:1"]["increase"]["num_drafts"] == 4


def test_coverage_names_the_samples_ends_interval_and_gaps() -> None:
    seen = coverage([10.0, 11.0, 12.0, 20.0, 21.0], 5.0, 30.0)
    assert seen["first_sample"] == 10.0 and seen["last_sample"] == 21.0
    assert seen["interval"] == 1.0
    assert seen["gaps"] == [[12.0, 20.0]]
    assert seen["first_sample_iso"] in seen["note"] and "not in them" in seen["note"]
    assert "1 gap(s)" in seen["note"]
    empty = coverage([], 5.0, 30.0)
    assert empty["first_sample"] is None and "no sample" in empty["note"]


def test_the_coverage_note_is_in_the_result() -> None:
    answer = history_answer(_target("a:1", [1, 5, 9]), 50.0, 150.0, query_url="http://store")
    result = answer["results"]["a:1"]
    assert result["history"]["first_sample"] == 100.0
    assert result["history"]["first_sample_iso"] in result["coverage_note"]


def test_label_values_with_quotes_survive_the_rebuilt_page() -> None:
    odd = 'a "quoted" \\ model\nname'
    series = [RawSeries({"__name__": DRAFTS, "instance": "a:1", "model_name": odd},
                        [(1.0, 1.0), (2.0, 4.0)])]
    answer = history_answer(series, 0.0, 3.0, query_url="http://store")
    assert answer["results"]["a:1"]["increase"]["num_drafts"] == 3


def _server(instance: str, drafts: list[float], start: float, k: int) -> list[RawSeries]:
    """One server under job "vllm": its counters and k per-position counters, 1 s apart."""
    times = [start + i for i in range(len(drafts))]
    labels = {"job": "vllm"}
    out = [_series(name, instance, [(t, f * d) for t, d in zip(times, drafts, strict=True)],
                   **labels)
           for name, f in ((DRAFTS, 1), (TOKENS, k), (ACCEPTED, 1))]
    out += [_series("vllm:spec_decode_num_accepted_tokens_per_pos_total", instance,
                    [(t, d - p) for t, d in zip(times, drafts, strict=True)],
                    position=str(p), **labels) for p in range(k)]
    return out


class TestGroups:
    """A group of servers (`by` a label they share) is the exact sum of its servers."""

    def test_two_servers_out_of_phase_sum_exactly(self) -> None:
        # Scraped half a second apart: no timestamp holds both servers' series.
        series = [*_server("a:1", [10, 20, 35, 50, 60], 100.0, 3),
                  *_server("b:1", [400, 500, 610, 700, 800], 100.5, 5)]
        each = history_answer(series, 99.0, 106.0, query_url="http://store")["results"]
        grouped = history_answer(series, 99.0, 106.0, query_url="http://store", by=["job"])
        group = grouped["results"]["vllm"]
        assert each["a:1"]["increase"]["num_drafts"] == 50
        assert each["b:1"]["increase"]["num_drafts"] == 400
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            assert group["increase"][key] == (each["a:1"]["increase"][key]
                                              + each["b:1"]["increase"][key]), key
        per_pos = group["increase"]["accepted_per_pos"]
        assert per_pos == {str(p): sum(e["increase"]["accepted_per_pos"].get(str(p), 0)
                                       for e in each.values()) for p in range(5)}
        assert group["resets"] == 0 and group["coverage"] == "full"
        assert set(group["history"]["servers"]) == {"vllm [vllm/a:1]", "vllm [vllm/b:1]"}
        assert grouped["aggregate"]["increase"] == group["increase"]
        assert grouped["targets"] == ["vllm"]

    def test_a_server_that_starts_inside_the_range_is_said(self) -> None:
        series = [*_server("a:1", [10, 20, 35, 50, 60, 70, 80], 100.0, 3),
                  *_server("b:1", [400, 500, 610], 104.0, 5)]
        grouped = history_answer(series, 99.5, 107.0, query_url="http://store", by=["job"])
        group = grouped["results"]["vllm"]
        # a: 70; b counted from its own first sample: 210 (not 610 from zero).
        assert group["increase"]["num_drafts"] == 280
        assert group["coverage"] == "partial"
        assert "after the range's start" in group["coverage_note"]
        assert "vllm [vllm/b:1]" in group["coverage_note"]
        alone = history_answer(series, 99.5, 107.0, query_url="http://store")["results"]
        assert alone["b:1"]["coverage"] == "partial"
        assert "counted from it" in alone["b:1"]["coverage_note"]
        assert alone["a:1"]["coverage"] == "full"

    def test_a_scraped_server_without_spec_decode_series_is_na(self) -> None:
        series = _server("a:1", [10, 20, 35], 100.0, 3)
        scraped = [{"job": "vllm", "instance": "a:1"}, {"job": "vllm", "instance": "plain:1"}]
        answer = history_answer(series, 99.0, 103.0, query_url="http://store", scraped=scraped)
        assert sorted(answer["results"]) == ["a:1", "plain:1"]
        plain = answer["results"]["plain:1"]
        assert plain["status"] == "na"
        assert plain["error"] == "No spec decode metrics found on server"
        assert answer["aggregate"]["increase"]["num_drafts"] == 25


def test_a_late_server_is_said_once() -> None:
    series = [*_server("a:1", [10, 20, 35, 50, 60, 70, 80], 100.0, 3),
              *_server("b:1", [400, 500, 610], 104.0, 5)]
    alone = history_answer(series, 99.5, 107.0, query_url="http://store")["results"]["b:1"]
    assert alone["coverage_note"].count("after the range's start") == 1
