"""The importable client against real exporters: one exporter, and a sharded fleet of two."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from clitools import (
    CLI,
    fake_add,
    fake_vllm,
    free_port,
    process,
    serve_over,
    wait_http,
    write_config,
)

from exporter.client import ClientError, ExporterClient, FleetClient, merge_answers
from exporter.core.console import format_window
from exporter.core.shards import owner

pytestmark = pytest.mark.e2e


@contextmanager
def _two_shards(tmp_path: Path, targets: list[dict],
                second: dict[str, str]) -> Iterator[list[str]]:
    """Two served exporters sharding `targets`, both ready: the first is shard 0, the second
    learns its shard from the `second` environment. Yields their URLs."""
    listen = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in listen]
    configs = [write_config(tmp_path / f"c{i}.yaml", listen[i], targets,
                            output_dir=str(tmp_path / f"out{i}")) for i in range(2)]
    with process(CLI + ["serve", "--config", str(configs[0])],
                 env={"SPECDEC_SHARDS": "2", "SPECDEC_SHARD_INDEX": "0"}), \
            process(CLI + ["serve", "--config", str(configs[1])],
                    env={"SPECDEC_SHARDS": "2"} | second):
        for url in urls:
            wait_http(f"{url}/-/ready")
        yield urls


class TestExporterClient:
    def test_start_stop_and_console(self, tmp_path):
        with fake_vllm("--k", "2") as vllm:
            port, serve = serve_over(tmp_path, vllm)
            with process(serve):
                wait_http(f"http://127.0.0.1:{port}/-/ready")
                client = ExporterClient(f"http://127.0.0.1:{port}")
                window = client.start(name="py", labels={"run": "1"})
                fake_add(vllm, 8, 16, [6, 2])
                answer = client.stop(window["id"])
                with pytest.raises(ClientError, match="400.*unknown target"):
                    client.start(targets=["nope"])
        assert answer.body["results"]["a"]["data"]["num_drafts"] == 8
        assert answer.console().startswith("\n" + "=" * 66)  # AISBench: an empty line first
        assert f"[127.0.0.1:{vllm}]" in answer.console()

    @pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
    def test_loopback_exporter_is_reached_past_a_bogus_proxy(self, tmp_path, host):
        # A fresh interpreter: urllib reads the proxy variables once, into a cached opener.
        port = free_port()
        config = write_config(tmp_path / "c.yaml", port, [])
        code = ("import sys; from exporter.client import ExporterClient; "
                "print(ExporterClient(sys.argv[1]).start(window_id='no-proxy')['id'])")
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env |= {"HTTP_PROXY": "http://proxy.invalid:3128", "http_proxy": "http://proxy.invalid:3128"}
        with process(CLI + ["serve", "--config", str(config)]):
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            out = subprocess.run([sys.executable, "-c", code, f"http://{host}:{port}"], env=env,
                                 capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == "no-proxy", out.stderr

    def test_non_loopback_exporter_goes_through_the_proxy(self):
        # 192.0.2.1 (TEST-NET-1) is never routed: only the refused proxy can answer first.
        code = ("from exporter.client import ExporterClient, ClientError\n"
                "try:\n ExporterClient('http://192.0.2.1:9400', timeout=5).start()\n"
                "except ClientError as exc:\n print(exc)")
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["HTTP_PROXY"] = f"http://127.0.0.1:{free_port()}"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
        assert "unreachable" in out.stdout and "refused" in out.stdout, out

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
            # The second shard finds its index in its pod's name, as a StatefulSet's does.
            with _two_shards(tmp_path, targets, {"SPECDEC_POD_NAME": "specdec-1"}) as urls:
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

    def test_start_errors_of_every_shard_are_merged(self, tmp_path):
        targets = [{"name": f"dead{i}", "url": f"http://127.0.0.1:{free_port()}/metrics"}
                   for i in range(4)]
        assert {owner(t["name"], 2) for t in targets} == {0, 1}  # both shards have some
        with _two_shards(tmp_path, targets, {"SPECDEC_SHARD_INDEX": "1"}) as urls:
            started = subprocess.run(
                CLI + ["window", "start", "--exporter", ",".join(urls), "--id", "all-dead"],
                capture_output=True, text=True, timeout=60)
        assert started.returncode == 3 and started.stdout == "all-dead\n"
        named = sorted(re.findall(r"target (dead\d) failed at window start", started.stderr))
        assert named == ["dead0", "dead1", "dead2", "dead3"]  # both shards' targets

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


class TestCredentialsInTheExporterUrl:
    """`--exporter http://user:pass@host` (a reverse proxy with basic auth in front of us)."""

    async def test_url_credentials_are_sent_as_basic_auth(self, aiohttp_server):
        from aiohttp import web
        seen: list[str | None] = []

        async def start(request: web.Request) -> web.Response:
            seen.append(request.headers.get("Authorization"))
            if request.headers.get("Authorization") != "Basic dXNlcjpzM2NyZXQ6IUA=":
                return web.json_response({"error": "who are you"}, status=401)
            return web.json_response({"id": "w", "name": "w", "targets": [], "started_at": 1.0},
                                     status=201)

        app = web.Application()
        app.router.add_post("/api/v1/windows", start)
        server = await aiohttp_server(app)
        # "s3cret:!@" percent-encoded in the URL, decoded before it is sent.
        url = f"http://user:s3cret%3A%21%40@127.0.0.1:{server.port}"
        client = ExporterClient(url, token="")
        answer = await asyncio.to_thread(client.start)
        assert answer["id"] == "w" and seen == ["Basic dXNlcjpzM2NyZXQ6IUA="]
        assert "s3cret" not in client.url and client.url.endswith(f"@127.0.0.1:{server.port}")

    async def test_a_refusal_names_the_exporter_without_its_password(self, aiohttp_server):
        from aiohttp import web

        async def refuse(request: web.Request) -> web.Response:
            return web.json_response({"error": "no"}, status=403)

        app = web.Application()
        app.router.add_post("/api/v1/windows", refuse)
        server = await aiohttp_server(app)
        client = ExporterClient(f"http://user:hunter22@127.0.0.1:{server.port}", token="")
        with pytest.raises(ClientError) as caught:
            await asyncio.to_thread(client.start)
        assert "403" in str(caught.value) and "hunter22" not in str(caught.value)
        assert "<secret>@127.0.0.1" in str(caught.value)

    @pytest.mark.parametrize("command", [["window", "start"], ["window", "stop", "w1"]])
    def test_cli_errors_never_print_the_password(self, command):
        dead = f"http://user:hunter22@127.0.0.1:{free_port()}"
        other = f"http://u:pa55word@127.0.0.1:{free_port()}"
        out = subprocess.run(CLI + command + ["--exporter", f"{dead},{other}"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0
        assert "unreachable" in out.stderr and "Name or service" not in out.stderr, out.stderr
        assert "hunter22" not in out.stderr + out.stdout
        assert "pa55word" not in out.stderr + out.stdout
        assert out.stderr.count("<secret>@127.0.0.1") == 2, out.stderr

    def test_compare_error_never_prints_the_password(self):
        dead = f"http://user:hunter22@127.0.0.1:{free_port()}"
        out = subprocess.run(CLI + ["compare", "a", "b", "--exporter", dead],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "unreachable" in out.stderr, out.stderr
        assert "hunter22" not in out.stderr + out.stdout
