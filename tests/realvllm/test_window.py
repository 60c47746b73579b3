"""A window over a real vLLM server counts exactly what the server's /metrics counted."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from exporter.core.loadbands import band_of
from realvllm.conftest import ask, exporter_over, get, read_counters


class TestWindow:
    def test_counts_equal_the_increase_read_from_metrics(self, fleet, tmp_path):
        server = fleet.ngram
        with exporter_over(server, tmp_path) as exporter:
            exporter.start("w")
            before = read_counters(get(server.metrics_url))
            for chat in (False, True):
                ask(server.base_url, chat=chat, stream=False)
                ask(server.base_url, chat=chat, stream=True, max_tokens=64)
            after = read_counters(get(server.metrics_url))
            answer = exporter.stop("w")
        increase = after.minus(before)
        data = answer["results"]["real"]["data"]
        assert answer["results"]["real"]["status"] == "ok"
        assert increase.drafts > 0 and increase.accepted > 0
        assert (data["num_drafts"], data["draft_tokens"], data["accepted_tokens"]) == (
            increase.drafts, increase.draft_tokens, increase.accepted)
        assert data["per_position_acceptance_rates"] == {
            str(p): n / increase.drafts for p, n in enumerate(increase.per_position)}
        assert data["acceptance_rate"] == 100 * increase.accepted / increase.draft_tokens


def _load(base: str, clients: int, seconds: float) -> None:
    """`clients` clients each asking one request after another for about `seconds`."""
    deadline = time.monotonic() + seconds

    def one(_: int) -> None:
        while time.monotonic() < deadline:
            ask(base, chat=False, stream=True, max_tokens=64)

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(clients)))


def _bands_equal_counters(by_load: dict, increase) -> None:
    """The bands' sums are the counters' increase, position by position."""
    assert "unknown" not in by_load  # the gauge on every (filtered) page
    sums = [sum(b["increase"][key] for b in by_load.values())
            for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")]
    assert sums == [increase.drafts, increase.draft_tokens, increase.accepted]
    assert tuple(sum(b["increase"]["accepted_per_pos"][str(p)] for b in by_load.values())
                 for p in range(len(increase.per_position))) == increase.per_position


class TestByLoad:
    def test_bands_of_two_concurrency_levels_sum_to_the_counters(self, fleet, tmp_path):
        server = fleet.ngram
        busy: dict[int, list[int]] = {}
        # A busy CPU server (and the suite's coverage) can slow a scrape past 1 s: scrapes at 2 s
        # with 2 s to answer, over 8 s of load, still sample it several times in each window.
        with exporter_over(server, tmp_path, interval="2s", timeout="2s") as exporter:
            for clients in (1, 6):
                exporter.start(f"c{clients}")
                before = read_counters(get(server.metrics_url))
                _load(server.base_url, clients, 8.0)
                after = read_counters(get(server.metrics_url))
                result = exporter.stop(f"c{clients}")["results"]["real"]
                assert result["status"] == "ok" and result["read"] == "filtered"
                _bands_equal_counters(result["by_load"], after.minus(before))
                busy[clients] = [band_of(label) for label, band in result["by_load"].items()
                                 if band["num_drafts"]]
            errors = [line for line in get(f"{exporter.url}/metrics").decode().splitlines()
                      if line.startswith("specdec_scrape_errors_total")]
        # One client never has two requests running; six have, at some scrape.
        assert max(busy[1]) <= 1 and max(busy[6]) >= 2, (busy, errors)
