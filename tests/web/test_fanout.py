"""Transparent shards: 2 and 3 real exporter processes on loopback, windows through any one.

Every shard has the same config and `peers`; a window start, stop or GET sent to any shard acts
on all of them and answers for every target. One shard is killed mid-window: its targets come
back N/A with the reason, the aggregate is the others' counts.
"""

from __future__ import annotations

import json
import signal
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from clitools import CLI, fake_add, fake_vllm, free_port, http, process, wait_http, write_config

from exporter.core.shards import owner

TOKEN = "fleet-token"


class Fleet:
    """N exporter processes as shards of one fleet over the same fake servers."""

    def __init__(self, stack: ExitStack, tmp: Path, shards: int, fakes: list[int],
                 tokens: list[str] | None = None, proxied: bool = False):
        self.fakes = fakes
        self.targets = [{"name": f"t{i}", "url": f"http://127.0.0.1:{p}/metrics"}
                        | ({"proxy": {"listen": f"127.0.0.1:{free_port()}"}} if proxied else {})
                        for i, p in enumerate(fakes)]
        ports = [free_port() for _ in range(shards)]
        self.tmp = tmp
        self.urls = [f"http://127.0.0.1:{p}" for p in ports]
        self.procs = []
        for i, port in enumerate(ports):
            config = write_config(tmp / f"shard{i}.yaml", port, self.targets,
                                  output_dir=str(tmp / f"out{i}"))
            env = {"SPECDEC_SHARDS": str(shards), "SPECDEC_SHARD_INDEX": str(i),
                   "SPECDEC_PEERS": ",".join(self.urls),
                   "SPECDEC_TOKEN": tokens[i] if tokens else TOKEN}
            self.procs.append(stack.enter_context(
                process(CLI + ["serve", "--config", str(config)], env=env)))
        for url in self.urls:
            wait_http(f"{url}/-/ready")

    def owner(self, name: str) -> int:
        return owner(name, len(self.urls))

    def start(self, via: int, **body):
        return http("POST", f"{self.urls[via]}/api/v1/windows", body, token=TOKEN)

    def stop(self, via: int, window_id: str):
        return http("POST", f"{self.urls[via]}/api/v1/windows/{window_id}/stop", token=TOKEN)

    def get(self, via: int, window_id: str):
        return http("GET", f"{self.urls[via]}/api/v1/windows/{window_id}")

    def delete(self, via: int, window_id: str):
        return http("DELETE", f"{self.urls[via]}/api/v1/windows/{window_id}", token=TOKEN)

    def out(self, shard: int) -> Path:
        return self.tmp / f"out{shard}"

    def local_ids(self, shard: int) -> list[str]:
        """The windows one shard itself holds: its list as a peer asks it (not fanned out)."""
        request = urllib.request.Request(f"{self.urls[shard]}/api/v1/windows",
                                         headers={"X-Specdec-Peer": "1"})
        with urllib.request.urlopen(request, timeout=10) as response:
            listed = json.loads(response.read())
        return [w["id"] for w in listed["windows"]]

    def local(self, shard: int, window_id: str) -> dict:
        """One shard's own answer for a window, as a peer asks it (not fanned out)."""
        request = urllib.request.Request(f"{self.urls[shard]}/api/v1/windows/{window_id}",
                                         headers={"X-Specdec-Peer": "1"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return dict(json.loads(response.read()))

    def ask(self, target: int, max_tokens: int) -> None:
        """One completion through target `t{target}`'s proxy port."""
        port = self.targets[target]["proxy"]["listen"].rsplit(":", 1)[1]
        status, answer = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                              {"model": "m", "prompt": "p", "max_tokens": max_tokens})
        assert status == 200 and answer["metrics"]["speculative_decoding"], answer

    def traffic(self):
        for i, port in enumerate(self.fakes):
            fake_add(port, 10 * (i + 1), 30 * (i + 1), [10 * (i + 1), 5 * (i + 1), 0])


@pytest.fixture
def fleet(tmp_path):
    def make(shards: int, servers: int, tokens: list[str] | None = None,
             proxied: bool = False) -> Fleet:
        per_request = ("--per-request-spec-decode-metrics", "summary") if proxied else ()
        fakes = [stack.enter_context(fake_vllm("--k", "3", *per_request))
                 for _ in range(servers)]
        return Fleet(stack, tmp_path, shards, fakes, tokens, proxied)

    with ExitStack() as stack:
        yield make


@pytest.mark.e2e
class TestTwoShards:
    def test_windows_through_any_shard_cover_every_target(self, fleet):
        f = fleet(2, 5)
        names = [t["name"] for t in f.targets]
        assert {f.owner(n) for n in names} == {0, 1}, "the test wants both shards used"
        status, started = f.start(1, id="w2", name="two")
        assert status == 201, started
        assert sorted(started["targets"]) == names
        assert {s["shard"]: sorted(s["targets"]) for s in started["shards"]} == {
            i: sorted(n for n in names if f.owner(n) == i) for i in (0, 1)}
        # The same id again, through the other shard: the same window, nothing new.
        status, again = f.start(0, id="w2", name="two")
        assert status == 200 and again["started_at"] == started["started_at"]
        f.traffic()
        status, state = f.get(0, "w2")
        assert status == 200 and state["status"] == "open" and sorted(state["targets"]) == names
        status, answer = f.stop(0, "w2")
        assert status == 200, answer
        for i, name in enumerate(names):
            result = answer["results"][name]
            assert result["status"] == "ok", result
            assert result["shard"] == f.owner(name)
            assert result["data"]["num_drafts"] == 10 * (i + 1)
        data = answer["aggregate"]["data"]
        assert data["num_drafts"] == sum(10 * (i + 1) for i in range(5))  # counted once each
        assert data["accepted_tokens"] == sum(15 * (i + 1) for i in range(5))
        assert data["acceptance_rate"] == pytest.approx(100 * 15 / 30)
        assert sorted(answer["aggregate"]["targets"]) == names
        # A second stop, and a GET, through the other shard: the same merged answer.
        status, second = f.stop(1, "w2")
        assert status == 200 and second["aggregate"] == answer["aggregate"]
        status, read = f.get(1, "w2")
        assert status == 200 and read["results"] == answer["results"]

    def test_subset_unknown_target_and_peer_marker(self, fleet):
        f = fleet(2, 4)
        status, body = f.start(0, id="bad", targets=["t0", "nope"])
        assert status == 400 and 'unknown target "nope"' in body["error"]
        assert f.get(0, "bad")[0] == 404 and f.get(1, "bad")[0] == 404  # started nowhere
        status, started = f.start(1, id="sub", targets=["t1", "t3"])
        assert status == 201 and sorted(started["targets"]) == ["t1", "t3"]
        f.traffic()
        status, answer = f.stop(0, "sub")
        assert sorted(answer["results"]) == ["t1", "t3"]
        assert answer["aggregate"]["data"]["num_drafts"] == 20 + 40
        # A peer's call (marker set) acts on that shard only, with its own targets.
        request = urllib.request.Request(
            f"{f.urls[0]}/api/v1/windows", data=json.dumps({"id": "local"}).encode(),
            method="POST", headers={"X-Specdec-Peer": "1", "Authorization": f"Bearer {TOKEN}",
                                    "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            local = json.loads(response.read())
        assert sorted(local["targets"]) == sorted(
            t["name"] for t in f.targets if f.owner(t["name"]) == 0)
        assert "shards" not in local
        status, body = f.get(1, "local")  # GET fans out: shard 0 has it, shard 1 does not
        assert status == 200 and body["shards"][0]["error"] is None
        assert body["shards"][1]["error"] == (
            f'shard 1 at {f.urls[1]} answered 404: unknown window "local"')

    def test_token_is_required_and_carried_to_peers(self, fleet):
        f = fleet(2, 3)
        status, body = http("POST", f"{f.urls[0]}/api/v1/windows", {"id": "x"})
        assert status == 401
        status, started = f.start(0, id="tok")
        assert status == 201 and not started.get("errors"), started  # peers took the token


    def test_a_peer_that_refuses_the_token_is_named(self, fleet):
        f = fleet(2, 4, tokens=[TOKEN, "another-token"])
        status, started = f.start(0, id="refused")
        assert status == 201, started
        reason = f"shard 1 at {f.urls[1]} answered 401: token wrong"
        assert started["errors"]["shard 1"].startswith(reason), started
        status, answer = f.stop(0, "refused")
        assert status == 200, answer
        for name, result in answer["results"].items():
            if f.owner(name) == 1:
                assert result["status"] == "na" and result["error"].startswith(reason)
            else:
                assert result["shard"] == 0


@pytest.mark.e2e
class TestDeleteOnEveryShard:
    def test_delete_through_one_shard_forgets_the_window_on_all(self, fleet):
        f = fleet(2, 3)
        assert f.start(0, id="gone")[0] == 201
        # Open on both shards: refused, and neither forgets it.
        status, refused = f.delete(1, "gone")
        assert status == 409, refused
        assert refused["error"].count("is open: stop it first") == 2, refused
        assert all("gone" in f.local_ids(i) for i in range(2))
        assert f.stop(0, "gone")[0] == 200
        status, deleted = f.delete(1, "gone")
        assert (status, deleted) == (200, {"id": "gone", "deleted": True})
        assert all("gone" not in f.local_ids(i) for i in range(2))
        assert f.get(0, "gone")[0] == 404
        assert f.delete(0, "gone")[0] == 404  # a second delete: nobody has it
        # Each shard's result files stay.
        assert all(any((f.out(i) / "gone").iterdir()) for i in range(2))


@pytest.mark.e2e
class TestThreeShardsOneKilled:
    def test_one_shard_killed_mid_window(self, fleet):
        f = fleet(3, 7)
        names = [t["name"] for t in f.targets]
        owners = {n: f.owner(n) for n in names}
        assert set(owners.values()) == {0, 1, 2}, owners
        status, started = f.start(0, id="w3")
        assert status == 201, started
        f.traffic()
        # Every shard scrapes its targets at least once before the kill.
        for via in range(3):
            wait_for = f.get(via, "w3")[1]["scrapes"]
            assert set(wait_for) == set(names), wait_for
        f.procs[2].send_signal(signal.SIGKILL)
        f.procs[2].wait(10)
        status, state = f.get(1, "w3")
        assert status == 200 and state["status"] == "open"
        dead = sorted(n for n, o in owners.items() if o == 2)
        reason = f"shard 2 at {f.urls[2]} unreachable: "
        assert all(state["errors"][n].startswith(reason) for n in dead), state["errors"]
        status, answer = f.stop(1, "w3")
        assert status == 200, answer
        for i, name in enumerate(names):
            result = answer["results"][name]
            if owners[name] == 2:
                assert result["status"] == "na" and result["error"].startswith(reason), result
                assert result["url"] == f.targets[i]["url"]
            else:
                assert result["status"] == "ok" and result["data"]["num_drafts"] == 10 * (i + 1)
        alive = [i for i, n in enumerate(names) if owners[n] != 2]
        assert answer["aggregate"]["data"]["num_drafts"] == sum(10 * (i + 1) for i in alive)
        assert sorted(answer["aggregate"]["targets"]) == sorted(names[i] for i in alive)
        assert answer["shards"][2]["error"].startswith(reason)
        assert [s["error"] for s in answer["shards"][:2]] == [None, None]
        # Forgetting it: the live shards forget, the dead one is named as still holding it.
        status, deleted = f.delete(0, "w3")
        assert status == 200 and deleted["deleted"] is True, deleted
        assert list(deleted["errors"]) == ["shard 2"], deleted
        assert deleted["errors"]["shard 2"].startswith(reason)
        assert "w3" not in f.local_ids(0) + f.local_ids(1)


class TestPeersConfig:
    @pytest.mark.parametrize(("data", "problem"), [
        ({"shards": 2, "peers": ["http://a:1"]},
         "peers: must list every shard: 1 URL(s) for shards=2"),
        ({"shards": 1, "peers": ["ftp://a:1"]},
         "peers.0: must be an http:// or https:// URL with a host, not 'ftp://a:1'"),
    ])
    def test_bad_peers(self, data, problem):
        from exporter.config.model import validate_config
        from exporter.core.errors import ConfigError

        with pytest.raises(ConfigError) as info:
            validate_config(data)
        assert info.value.problems == [problem]

    def test_env_gives_the_peers(self, monkeypatch):
        from exporter.cli.serving import env_overrides
        from exporter.config.model import validate_config

        monkeypatch.setenv("SPECDEC_SHARDS", "2")
        monkeypatch.setenv("SPECDEC_SHARD_INDEX", "1")
        monkeypatch.setenv("SPECDEC_PEERS", " http://s0:9400/, http://s1:9400 ,")
        config = validate_config(env_overrides())
        assert config.peers == ["http://s0:9400", "http://s1:9400"]
        assert (config.shards, config.shard_index) == (2, 1)


class TestRebalance:
    async def test_a_target_that_moves_shard_closes_there_with_the_reason(
            self, exporter, fake_vllm, tmp_path):
        """shards 2 -> 3 on reload: what shard 0 gives to the new shard 2 leaves its window.

        With rendezvous hashing shard 0 keeps the rest (t0, t15 of its t0, t10-t12, t15).
        """
        fakes = [await fake_vllm(k=2) for _ in range(16)]
        targets = [{"name": f"t{i}", "url": f.url} for i, f in enumerate(fakes)]
        path = tmp_path / "exporter.yaml"

        def write(shards: int) -> dict:
            data = {"output_dir": str(tmp_path / "out"), "shards": shards, "shard_index": 0,
                    "targets": targets}
            path.write_text(json.dumps(data))
            return data

        exp = await exporter(write(2), config_path=path)
        mine = sorted(exp.service.view().targets)
        moving = [n for n in mine if owner(n, 3) == 2]
        staying = [n for n in mine if owner(n, 3) == 0]
        assert moving and staying, (mine, moving)
        await exp.start(id="rb")
        for fake in fakes:
            fake.server.add(0, 5, 10, [5, 0])
        await exp.round()
        write(3)
        assert (await exp.client.post("/-/reload")).status == 200
        answer = await exp.stop("rb")
        for name in moving:
            result = answer["results"][name]
            assert result["status"] == "na"
            assert result["error"].startswith("target moved to shard 2 of 3 at "), result
            assert result["increase_until_removed"]["num_drafts"] == 5
        for name in staying:
            assert answer["results"][name]["status"] == "ok"
        assert sorted(answer["aggregate"]["targets"]) == staying


@pytest.mark.e2e
@pytest.mark.prometheus
class TestNoDoubleCountingInPrometheus:
    def test_two_shards_scraped_by_prometheus_count_each_target_once(self, fleet, tmp_path,
                                                                      prometheus):
        """Each target is exported by one shard; a fan-out window is one open window."""
        import time
        import urllib.parse

        import yaml

        f = fleet(2, 5)
        f.traffic()
        prom_port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "specdec", "static_configs": [
                {"targets": [u.removeprefix("http://") for u in f.urls]}]}]}))
        prom = f"http://127.0.0.1:{prom_port}"

        def query(expr: str) -> list[dict]:
            url = f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.loads(response.read())["data"]["result"]

        def wait(expr: str, want: float) -> float:
            end = time.monotonic() + 30
            while True:
                result = query(expr)
                value = float(result[0]["value"][1]) if result else None
                if value == want or time.monotonic() > end:
                    return value
                time.sleep(0.5)

        with process([prometheus, f"--config.file={config}",
                      f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                      f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"]):
            wait_http(f"{prom}/-/ready", deadline=30)
            total = sum(10 * (i + 1) for i in range(5))
            assert wait('sum(specdec_drafts_total{job="specdec"})', total) == total
            assert wait('count(specdec_target_up{job="specdec"})', 5) == 5
            status, _ = f.start(0, id="once")
            assert status == 201
            # Both shards hold the window: the dashboard's max() counts it once.
            dashboard = json.loads((Path(__file__).resolve().parents[2] / "deploy" / "grafana" /
                                    "specdec-exporter.json").read_text())
            (panel,) = [p for p in dashboard["panels"] if p["title"] == "Open windows"]
            expr = panel["targets"][0]["expr"].replace("$job", "specdec").replace(
                "$instance", ".*")
            assert wait(expr, 1) == 1
            assert wait('sum(specdec_windows_open{job="specdec"})', 2) == 2  # why not sum


@pytest.mark.e2e
class TestPerRequestAcrossShards:
    @pytest.mark.parametrize("shards", [2, 3])
    def test_every_answer_carries_every_proxied_targets_figures_as_its_shard_made_them(
            self, fleet, shards):
        f = fleet(shards, 4, proxied=True)
        names = [t["name"] for t in f.targets]
        assert len({f.owner(n) for n in names}) >= 2, "the test wants two shards used"
        assert f.start(0, id="pr")[0] == 201
        for i in range(len(names)):
            for max_tokens in range(8, 8 + 6 * (i + 1), 6):
                f.ask(i, max_tokens)
        status, state = f.get(shards - 1, "pr")
        assert status == 200 and state["status"] == "open"
        assert {n: b["requests"] for n, b in state["per_request"]["targets"].items()} == {
            n: i + 1 for i, n in enumerate(names)}
        status, answer = f.stop(shards - 1, "pr")
        assert status == 200, answer
        merged = answer["per_request"]
        assert sorted(merged["targets"]) == names
        for name in names:
            own = f.local(f.owner(name), "pr")
            assert merged["targets"][name] == own["per_request"]["targets"][name]
            assert merged["targets"][name]["covers_all"] is True
            # Each shard's window.json is its own stop answer: its targets' figures.
            written = json.loads((Path(own["results_dir"]) / "window.json").read_text())
            assert written["per_request"]["targets"][name] == merged["targets"][name]
        aggregate = merged["aggregate"]
        assert aggregate["requests"] == sum(range(1, len(names) + 1))
        assert aggregate["covers_all"] is True
        assert aggregate["num_spec_steps"] == answer["aggregate"]["data"]["num_drafts"]
        for via in range(shards):
            status, read = f.get(via, "pr")
            assert status == 200 and read["per_request"] == merged
        with urllib.request.urlopen(f"{f.urls[0]}/windows/pr", timeout=10) as response:
            page = response.read().decode()
        assert "Acceptance across requests" in page
        assert all(f"<td>{name}</td><td>{i + 1}</td>" in page for i, name in enumerate(names))
