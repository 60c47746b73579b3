"""Segments from one run through the proxy before a real vLLM: two tags, two concurrency levels;
each dimension's segments sum to the window's per-request totals, and those to the counters."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from realvllm import servers
from realvllm.conftest import exporter_over, get, read_counters

SUMS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")


def _ask(base: str, tag: str) -> None:
    """One greedy completion (n = 1, usage on) tagged `tag`."""
    body = {"model": servers.MODEL_NAME, "prompt": f"{tag} hello world the a of and to in",
            "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(
        base + "/v1/completions", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "X-Specdec-Tag": tag})
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert answer.status == 200
        answer.read()


class TestSegmentsFromOneRun:
    def test_two_tags_at_two_concurrency_levels_sum_to_the_totals_and_the_counters(
            self, fleet, tmp_path):
        server = fleet.ngram
        with exporter_over(server, tmp_path, proxy=True) as exporter:
            assert exporter.proxy is not None
            exporter.start("seg")
            before = read_counters(get(server.metrics_url))
            for tag in ("chat", "code"):  # one at a time: concurrency 1
                _ask(exporter.proxy, tag)
            with ThreadPoolExecutor(4) as pool:  # four at once: the later ones meet the others
                list(pool.map(lambda tag: _ask(exporter.proxy or "", tag),
                              ["chat", "code", "chat", "code"]))
            after = read_counters(get(server.metrics_url))
            answer = exporter.stop("seg")
        increase = after.minus(before)
        block = answer["per_request"]["targets"]["real"]
        assert (block["requests"], block["with_stats"]) == (6, 6)
        assert [block[k] for k in SUMS] == [
            increase.drafts, increase.draft_tokens, increase.accepted]
        assert block["covers_all"] is True
        by = block["by"]
        assert {t: s["requests"] for t, s in by["tag"].items()} == {"chat": 3, "code": 3}
        assert by["concurrency"]["1"]["requests"] >= 2 and len(by["concurrency"]) >= 2
        assert list(by["temperature"]) == ["0"] and list(by["model"]) == [servers.MODEL_NAME]
        for dimension, segments in by.items():
            for key in ("requests", "with_stats", *SUMS):
                assert sum(s[key] for s in segments.values()) == block[key], (dimension, key)
            hist = [sum(c) for c in zip(*(s["acceptance_histogram"]
                                          for s in segments.values()), strict=True)]
            assert hist == block["acceptance_histogram"], dimension
            shares = sum(s["share_of_drafts"] for s in segments.values())
            assert abs(shares - 1.0) < 1e-12, dimension
