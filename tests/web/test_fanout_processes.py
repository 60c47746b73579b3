"""Shards at real sizes: 400 targets over 2 and 3 real exporter processes, every target exact
through any shard, in the stop answer, the list, the series and both HTML pages."""

from __future__ import annotations

import sys
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from clitools import CLI, free_port, http, process, wait_http, write_config

from exporter.core.shards import owner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from manytargets import name  # noqa: E402

TOKEN = "fleet-token"
COUNT = 400


class BigFleet:
    """`shards` exporter processes over COUNT targets of one manytargets server."""

    def __init__(self, stack: ExitStack, tmp: Path, shards: int):
        self.target_port = free_port()
        stack.enter_context(process([sys.executable, str(Path(__file__).parent / "manytargets.py"),
                                     str(self.target_port), str(COUNT)]))
        wait_http(f"http://127.0.0.1:{self.target_port}/{name(0)}/metrics")
        self.names = [name(i) for i in range(COUNT)]
        targets = [{"name": n, "url": f"http://127.0.0.1:{self.target_port}/{n}/metrics"}
                   for n in self.names]
        ports = [free_port() for _ in range(shards)]
        self.urls = [f"http://127.0.0.1:{p}" for p in ports]
        for i, port in enumerate(ports):
            config = write_config(tmp / f"shard{i}.yaml", port, targets,
                                  output_dir=str(tmp / f"out{i}"), scrape_interval="5s",
                                  scrape_timeout="3s")
            env = {"SPECDEC_SHARDS": str(shards), "SPECDEC_SHARD_INDEX": str(i),
                   "SPECDEC_PEERS": ",".join(self.urls), "SPECDEC_TOKEN": TOKEN}
            stack.enter_context(process(CLI + ["serve", "--config", str(config)], env=env))
        for url in self.urls:
            wait_http(f"{url}/-/ready", deadline=60)

    def grow(self) -> None:
        status, body = http("POST", f"http://127.0.0.1:{self.target_port}/grow")
        assert status == 200, body

    def call(self, method: str, via: int, path: str, **body):
        return http(method, f"{self.urls[via]}{path}", body if method == "POST" else None,
                    token=TOKEN)

    def page(self, via: int, path: str) -> tuple[str, dict[str, str]]:
        with urllib.request.urlopen(f"{self.urls[via]}{path}", timeout=30) as response:
            return response.read().decode(), dict(response.headers)

    def window(self, via: int, window_id: str, stop_via: int) -> dict:
        status, started = self.call("POST", via, "/api/v1/windows", id=window_id)
        assert status == 201, started
        assert sorted(started["targets"]) == self.names and "errors" not in started, started
        self.grow()
        status, answer = self.call("POST", stop_via, f"/api/v1/windows/{window_id}/stop")
        assert status == 200, answer
        return answer


@pytest.fixture
def big_fleet(tmp_path):
    with ExitStack() as stack:
        yield lambda shards: BigFleet(stack, tmp_path, shards)


def _drafts(grown: int) -> int:
    return grown * sum(i + 1 for i in range(COUNT))


@pytest.mark.e2e
@pytest.mark.parametrize("shards", [2, 3])
class TestFourHundredTargets:
    def test_every_target_exact_through_any_shard(self, big_fleet, shards):
        f = big_fleet(shards)
        answer = f.window(0, "w1", stop_via=shards - 1)
        assert sorted(answer["results"]) == f.names
        for i, n in enumerate(f.names):
            result = answer["results"][n]
            assert result["status"] == "ok", result
            assert result["data"]["num_drafts"] == i + 1
            assert result["shard"] == owner(n, shards)
        assert answer["aggregate"]["data"]["num_drafts"] == _drafts(1)
        assert [s["error"] for s in answer["shards"]] == [None] * shards
        for via in range(shards):  # a GET of the stopped window: the same counts
            status, read = f.call("GET", via, "/api/v1/windows/w1")
            assert status == 200 and read["aggregate"] == answer["aggregate"], via

        # The list, through every shard: one item for the window, over every target.
        second = f.window(1, "w2", stop_via=0)
        assert second["aggregate"]["data"]["num_drafts"] == _drafts(1)
        for via in range(shards):
            status, listed = f.call("GET", via, "/api/v1/windows")
            assert status == 200, listed
            items = {w["id"]: w for w in listed["windows"]}
            assert sorted(items) == ["w1", "w2"], listed
            for item in items.values():
                assert sorted(item["targets"]) == f.names and item["state"] == "stopped"
                assert item["aggregate"]["num_drafts"] == _drafts(1)
                assert item["aggregate"]["acceptance_length"] == 3.0

        # The series: every target's, from its own shard.
        status, series = f.call("GET", shards - 1, "/api/v1/windows/w1/series")
        assert status == 200 and sorted(series["targets"]) == f.names

        # The HTML pages name every target.
        html, headers = f.page(0, "/windows/w1")
        assert "X-Specdec-Scope" not in headers
        assert [n for n in f.names if n not in html] == []
        html, _ = f.page(shards - 1, "/compare?a=w1&b=w2")
        assert [n for n in f.names if n not in html] == []
        picker, _ = f.page(1, "/compare")
        assert "w1" in picker and "w2" in picker

    def test_a_local_answer_says_so(self, big_fleet, shards):
        f = big_fleet(shards)
        with urllib.request.urlopen(f"{f.urls[1]}/api/v1/targets", timeout=30) as response:
            scope = response.headers["X-Specdec-Scope"]
            import json

            listed = json.loads(response.read())
        assert scope == f"shard 1 of {shards}: this shard's targets only"
        assert sorted(t["name"] for t in listed["targets"]) == sorted(
            n for n in f.names if owner(n, shards) == 1)
