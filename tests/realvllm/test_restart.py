"""kill -9 of a real vLLM inside a window, and its restart: partial, the hole named."""

from __future__ import annotations

from realvllm.conftest import ask, exporter_over

SUMS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")


class TestKilledServer:
    def test_a_window_across_kill_9_and_restart_is_partial_and_names_the_hole(
            self, fleet, tmp_path):
        server = fleet.ngram
        # Rounds 20 s apart: the request just before the kill finishes after the window's
        # last scrape of the old process, inside the span nobody saw.
        with exporter_over(server, tmp_path, proxy=True, interval="20s") as exporter:
            exporter.start("crash")
            ask(exporter.proxy, chat=False, stream=False)
            server.kill9()
            server.start().wait_ready()
            ask(exporter.proxy, chat=True, stream=False)
            ask(exporter.proxy, chat=False, stream=True)
            answer = exporter.stop("crash")
        result = answer["results"]["real"]
        assert result["status"] == "ok"
        assert result["coverage"] == "partial"
        [span] = result["unobserved"]
        block = answer["per_request"]["targets"]["real"]
        [hole] = block["unobserved"]
        assert (hole["from"], hole["to"]) == (span["from"], span["to"])
        assert hole["requests"] >= 1 and hole["complete"] is True
        # Every request had figures: what the counters saw plus what the hole held is all of it.
        data = result["data"]
        assert block["with_stats"] == block["requests"] == 3
        assert block["num_draft_tokens"] == data["draft_tokens"] + hole["num_draft_tokens"]
        assert block["num_accepted_draft_tokens"] == (
            data["accepted_tokens"] + hole["num_accepted_draft_tokens"])
        assert block["covers_all"] is False
