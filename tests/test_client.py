"""The importable client against real exporters: one exporter, and a sharded fleet of two."""

from __future__ import annotations

import json
import subprocess

import pytest
from clitools import CLI, fake_add, fake_vllm, free_port, process, wait_http, write_config

from exporter.client import ClientError, ExporterClient, FleetClient, merge_answers
from exporter.console import format_window


class TestExporterClient:
    def test_start_stop_and_console(self, tmp_path):
        with fake_vllm("--k", "2") as vllm:
            port = free_port()
            config = write_config(tmp_path / "c.yaml", port,
                                  [{"name": "a", "url": f"http://127.0.0.1:{vllm}/metrics"}])
            with process(CLI + ["serve", "--config", str(config)]):
                wait_http(f"http://127.0.0.1:{port}/-/ready")
                client = ExporterClient(f"http://127.0.0.1:{port}")
                window = client.start(name="py", labels={"run": "1"})
                fake_add(vllm, 8, 16, [6, 2])
                answer = client.stop(window["id"])
                with pytest.raises(ClientError, match="400.*unknown target"):
                    client.start(targets=["nope"])
        assert answer.body["results"]["a"]["data"]["num_drafts"] == 8
        assert answer.console().startswith("=" * 66)
        assert f"[127.0.0.1:{vllm}]" in answer.console()

    def test_unreachable_exporter_is_a_client_error(self):
        with pytest.raises(ClientError, match="unreachable"):
            ExporterClient(f"http://127.0.0.1:{free_port()}", timeout=2).start()


class TestFleetClient:
    def test_two_shards_split_targets_and_merge_results(self, tmp_path):
        with fake_vllm("--k", "2") as v1, fake_vllm("--k", "2") as v2, \
                fake_vllm("--k", "2") as v3, fake_vllm("--k", "2") as v4:
            ports = [v1, v2, v3, v4]
            targets = [{"name": f"t{i}", "url": f"http://127.0.0.1:{p}/metrics"}
                       for i, p in enumerate(ports)]
            listen = [free_port(), free_port()]
            urls = [f"http://127.0.0.1:{p}" for p in listen]
            configs = [write_config(tmp_path / f"c{i}.yaml", listen[i], targets,
                                    output_dir=str(tmp_path / f"out{i}")) for i in range(2)]
            with process(CLI + ["serve", "--config", str(configs[0])],
                         env={"SPECDEC_SHARDS": "2", "SPECDEC_SHARD_INDEX": "0"}), \
                    process(CLI + ["serve", "--config", str(configs[1])],
                            env={"SPECDEC_SHARDS": "2", "SPECDEC_POD_NAME": "specdec-1"}):
                for url in urls:
                    wait_http(f"{url}/-/ready")
                fleet = FleetClient(urls)
                started = fleet.start(name="fleet")
                for i, port in enumerate(ports):
                    fake_add(port, 10 * (i + 1), 20 * (i + 1), [10 * (i + 1), 0])
                answer = fleet.stop(started["id"])
                again = subprocess.run(  # the CLI takes the shards as one --exporter list
                    CLI + ["window", "stop", "--exporter", ",".join(urls), started["id"],
                           "--json"], capture_output=True, text=True, timeout=60)
        assert sorted(started["targets"]) == ["t0", "t1", "t2", "t3"]  # each exactly once
        assert sorted(answer.body["results"]) == ["t0", "t1", "t2", "t3"]
        aggregate = answer.body["aggregate"]["data"]
        assert aggregate["num_drafts"] == 100 and aggregate["draft_tokens"] == 200
        assert aggregate["acceptance_rate"] == 50.0
        assert answer.console().count("[all]") == 1
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["aggregate"] == answer.body["aggregate"]

    def test_merge_recomputes_the_aggregate_from_counts(self):
        def result(drafts, tokens, accepted):
            return {"status": "ok", "increase": {"num_drafts": drafts, "num_draft_tokens": tokens,
                                                 "num_accepted_tokens": accepted,
                                                 "accepted_per_pos": {"0": accepted}},
                    "raw": {"before": {}, "after": {}}, "host_port": "h:1"}

        merged = merge_answers([
            {"id": "w", "targets": ["a"], "results": {"a": result(10, 10, 10)}},
            {"id": "w", "targets": ["b"], "results": {"b": result(90, 90, 0)}},
        ])
        assert merged["aggregate"]["data"]["acceptance_rate"] == 10.0  # not (100 + 0) / 2
        assert merged["targets"] == ["a", "b"]
        assert "[all]" in format_window(merged)
