"""The recording proxy before a real vLLM: per-request sums against the server's counters."""

from __future__ import annotations

from realvllm.conftest import ask, exporter_over, get, read_counters

SUMS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")


class TestPerRequestSums:
    def test_every_request_n1_with_usage_sums_to_the_counters_exactly(self, fleet, tmp_path):
        server = fleet.ngram
        with exporter_over(server, tmp_path, proxy=True) as exporter:
            exporter.start("all")
            before = read_counters(get(server.metrics_url))
            for chat in (False, True):
                for stream in (False, True):
                    ask(exporter.proxy, chat=chat, stream=stream)
            after = read_counters(get(server.metrics_url))
            answer = exporter.stop("all")
        increase = after.minus(before)
        block = answer["per_request"]["targets"]["real"]
        assert (block["requests"], block["with_stats"], block["without_stats"]) == (4, 4, 0)
        assert [block[k] for k in SUMS] == [
            increase.drafts, increase.draft_tokens, increase.accepted]
        assert block["covers_all"] is True
        # The histogram's per-position figures are the counters' per-position increase.
        assert block["per_position_acceptance_rates"] == {
            str(p): n / increase.drafts for p, n in enumerate(increase.per_position)}

    def test_requests_without_figures_are_counted_and_the_cross_check_says_no(
            self, fleet, tmp_path):
        server = fleet.ngram
        with exporter_over(server, tmp_path, proxy=True) as exporter:
            exporter.start("some")
            before = read_counters(get(server.metrics_url))
            ask(exporter.proxy, chat=False, stream=False)
            ask(exporter.proxy, chat=True, stream=True, usage=False)  # no usage chunk
            # Sampled (vLLM refuses n > 1 when greedy); vLLM's figures are null for n > 1.
            ask(exporter.proxy, chat=False, stream=False, n=2, temperature=1.0, seed=5)
            after = read_counters(get(server.metrics_url))
            answer = exporter.stop("some")
        increase = after.minus(before)
        block = answer["per_request"]["targets"]["real"]
        assert (block["requests"], block["with_stats"], block["without_stats"]) == (3, 1, 2)
        assert block["unreadable"] == 0
        assert block["covers_all"] is False
        assert 0 < block["num_spec_steps"] < increase.drafts
        assert block["share_of_drafts"] == block["num_spec_steps"] / increase.drafts
        assert answer["results"]["real"]["data"]["num_drafts"] == increase.drafts
