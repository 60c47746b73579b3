"""Known answers from a real draft_model server (the model drafting for itself), k = 5."""

from __future__ import annotations

from realvllm.conftest import ask, exporter_over


class TestDraftModel:
    def test_greedy_accepts_every_draft_at_each_of_five_positions(self, fleet, tmp_path):
        with exporter_over(fleet.draft, tmp_path) as exporter:
            exporter.start("greedy")
            ask(fleet.draft.base_url, chat=False, stream=False)
            ask(fleet.draft.base_url, chat=True, stream=True)
            answer = exporter.stop("greedy")
        data = answer["results"]["real"]["data"]
        assert data["num_drafts"] > 0
        assert data["draft_tokens"] == 5 * data["num_drafts"]
        assert data["accepted_tokens"] == data["draft_tokens"]
        assert data["acceptance_rate"] == 100.0
        assert data["acceptance_length"] == 6.0
        assert data["per_position_acceptance_rates"] == {str(p): 1.0 for p in range(5)}

    def test_sampling_at_temperature_1_accepts_nothing_past_the_first_position(
            self, fleet, tmp_path):
        with exporter_over(fleet.draft, tmp_path) as exporter:
            exporter.start("sampled")
            for chat in (False, True):
                ask(fleet.draft.base_url, chat=chat, stream=False, temperature=1.0, seed=3)
            answer = exporter.stop("sampled")
        data = answer["results"]["real"]["data"]
        rates = data["per_position_acceptance_rates"]
        assert list(rates) == ["0", "1", "2", "3", "4"]
        assert data["num_drafts"] > 0 and data["draft_tokens"] == 5 * data["num_drafts"]
        assert [rates[str(p)] for p in range(1, 5)] == [0.0] * 4
        assert data["acceptance_rate"] < 20.0  # position 0 alone: at most one draft in five
