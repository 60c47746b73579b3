"""`measure -- CMD` and `run -- CMD` with vLLM's own benchmark client, `vllm bench serve`, as
CMD: a client nobody here wrote, against a real server; the AISBench-format file it leaves."""

from __future__ import annotations

import json

from realvllm import servers
from realvllm.conftest import cli, exporter_over, get, read_counters, vllm_cli

SEED_KEYS = {"num_drafts", "draft_tokens", "accepted_tokens", "acceptance_rate",
             "acceptance_length", "per_position_acceptance_rates"}


def bench_serve(server: servers.RealVllm, model, prompts: int = 6) -> list[str]:
    """`vllm bench serve` over a random dataset, every answer its full length."""
    return [*vllm_cli(), "bench", "serve", "--backend", "openai",
            "--base-url", server.base_url, "--model", servers.MODEL_NAME,
            "--tokenizer", str(model), "--dataset-name", "random", "--random-input-len", "24",
            "--random-output-len", "40", "--num-prompts", str(prompts), "--ignore-eos",
            "--seed", "7", "--temperature", "0", "--disable-tqdm", "--max-concurrency", "2"]


class TestMeasure:
    def test_measure_around_vllm_bench_serve_writes_the_aisbench_file(
            self, fleet, tiny_model, tmp_path):
        server = fleet.ngram
        before = read_counters(get(server.metrics_url))
        done = cli("measure", "--target", f"127.0.0.1:{server.port}", "--work-dir",
                   str(tmp_path), "--", *bench_serve(server, tiny_model))
        after = read_counters(get(server.metrics_url))
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Serving Benchmark Result" in done.stdout  # vLLM's client ran to its end
        [path] = tmp_path.glob(f"**/performances/spec_decode_127.0.0.1_{server.port}.json")
        written = json.loads(path.read_text())
        assert {"status", "url", "error", "data", "raw"} <= written.keys()
        assert (written["status"], written["error"]) == ("ok", None)
        assert written["url"] == server.metrics_url
        assert SEED_KEYS <= written["data"].keys()
        assert set(written["raw"]) == {"before", "after"}
        increase = after.minus(before)
        data = written["data"]
        assert increase.drafts > 0
        assert (data["num_drafts"], data["draft_tokens"], data["accepted_tokens"]) == (
            increase.drafts, increase.draft_tokens, increase.accepted)
        assert data["acceptance_length"] == 1 + increase.accepted / increase.drafts
        assert list(data["per_position_acceptance_rates"]) == ["0", "1", "2"]
        title = f"========== Speculative Decoding Metrics  [127.0.0.1:{server.port}] =========="
        assert title in done.stdout
        assert f"\n{'Drafts':46}{increase.drafts}\n" in done.stdout


class TestRun:
    def test_run_around_vllm_bench_serve_counts_its_requests(self, fleet, tiny_model, tmp_path):
        server = fleet.ngram
        with exporter_over(server, tmp_path) as exporter:
            before = read_counters(get(server.metrics_url))
            done = cli("run", "--exporter", exporter.url, "--id", "bench", "--",
                       *bench_serve(server, tiny_model, prompts=4))
            after = read_counters(get(server.metrics_url))
        assert done.returncode == 0, done.stderr[-3000:]
        increase = after.minus(before)
        saved = json.loads((exporter.out / "bench" / "window.json").read_text())
        data = saved["results"]["real"]["data"]
        assert increase.drafts > 0
        assert (data["num_drafts"], data["draft_tokens"], data["accepted_tokens"]) == (
            increase.drafts, increase.draft_tokens, increase.accepted)
        assert f"\n{'Draft tokens':46}{increase.draft_tokens}\n" in done.stdout
