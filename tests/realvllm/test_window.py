"""A window over a real vLLM server counts exactly what the server's /metrics counted."""

from __future__ import annotations

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
