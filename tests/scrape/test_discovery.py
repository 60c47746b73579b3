"""Discovery sources: file_sd files and http_sd URLs, their changes, and broken content."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import aiohttp
import pytest
from aiohttp import web

from exporter.config.model import PrometheusSDConfig, validate_config
from exporter.core.errors import ConfigError
from exporter.scrape.discovery import (
    Discovery,
    DiscoveryError,
    targets_from_document,
    targets_from_prometheus,
)


def _bump(path):
    # Make sure a rewrite within the same clock tick still looks changed.
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


class TestTargetsFromDocument:
    def test_groups_labels_and_meta_labels(self):
        targets = targets_from_document([
            {"targets": ["10.0.0.1:8000", "10.0.0.2:8000"], "labels": {"cluster": "a"}},
            {"targets": ["10.0.0.3:9000"], "labels": {
                "__scheme__": "https", "__metrics_path__": "/prometheus/metrics",
                "__specdec_name__": "trt", "__specdec_dialect__": "trtllm", "__ignored": "x"}},
        ], "sd.json", [])
        assert [t.name for t in targets] == ["10.0.0.1:8000", "10.0.0.2:8000", "trt"]
        assert targets[0].labels == {"cluster": "a"}
        assert targets[2].url == "https://10.0.0.3:9000/prometheus/metrics"
        assert targets[2].dialect == "trtllm" and targets[2].labels == {}

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ({"targets": []}, "sd.json: must be a list of {targets, labels} groups"),
            ([{"labels": {}}], "sd.json: 0: each group needs a `targets` list"),
            ([{"targets": ["nohost"]}], "sd.json: 0.targets.0: want host:port, not 'nohost'"),
            ([{"targets": ["h:1"], "labels": []}], "sd.json: 0.labels: must be a mapping"),
            ([{"targets": ["h:1"], "labels": {"target": "x"}}],
             "sd.json: 0.targets.0: labels: 'target' is reserved by the exporter"),
        ],
    )
    def test_bad_documents_name_the_entry(self, data, message):
        with pytest.raises(DiscoveryError) as info:
            targets_from_document(data, "sd.json", [])
        assert str(info.value) == message


class TestFileSD:
    async def test_add_change_remove_and_broken_file(self, tmp_path):
        config = validate_config({"file_sd": [{"files": [str(tmp_path / "*.json"),
                                                         str(tmp_path / "*.yml")]}]})
        discovery = Discovery(config)
        assert await discovery.refresh(None, 0.0) is False
        first = tmp_path / "a.json"
        first.write_text(json.dumps([{"targets": ["127.0.0.1:1"]}]))
        assert await discovery.refresh(None, 1.0) is True
        assert [t.name for t in discovery.targets()] == ["127.0.0.1:1"]
        assert await discovery.refresh(None, 2.0) is False  # unchanged file is not re-read
        (tmp_path / "b.yml").write_text("- targets: ['127.0.0.1:2']\n  labels: {pool: b}\n")
        assert await discovery.refresh(None, 3.0) is True
        assert sorted(t.name for t in discovery.targets()) == ["127.0.0.1:1", "127.0.0.1:2"]
        first.write_text("[{not json")
        _bump(first)
        assert await discovery.refresh(None, 4.0) is False  # broken: last good list kept
        assert "a.json: not valid json" in next(iter(discovery.errors().values())).lower()
        first.write_text(json.dumps([{"targets": ["127.0.0.1:3"]}]))
        _bump(first)
        assert await discovery.refresh(None, 5.0) is True
        assert discovery.errors() == {}
        first.unlink()
        assert await discovery.refresh(None, 6.0) is True
        assert [t.name for t in discovery.targets()] == ["127.0.0.1:2"]


class TestHttpSD:
    async def test_polled_on_its_interval_and_errors_kept(self, aiohttp_server, monkeypatch):
        answers = [
            (200, json.dumps([{"targets": ["127.0.0.1:5"], "labels": {"zone": "z1"}}])),
            (500, "oops"),
            (200, json.dumps([{"targets": ["127.0.0.1:6"]}])),
        ]
        seen_auth = []

        async def handler(request):
            seen_auth.append(request.headers.get("Authorization"))
            status, body = answers.pop(0)
            return web.Response(status=status, text=body)

        app = web.Application()
        app.router.add_get("/sd", handler)
        server = await aiohttp_server(app)
        monkeypatch.setenv("SD_TEST_TOKEN", "tok")
        config = validate_config({"http_sd": [{"url": str(server.make_url("/sd")),
                                               "refresh_interval": "10s",
                                               "token_env": "SD_TEST_TOKEN"}]})
        discovery = Discovery(config)
        async with aiohttp.ClientSession() as session:
            assert await discovery.refresh(session, 100.0) is True
            assert discovery.targets()[0].labels == {"zone": "z1"}
            assert await discovery.refresh(session, 105.0) is False  # not due yet
            assert await discovery.refresh(session, 110.0) is False  # 500: list kept
            assert "HTTP 500" in next(iter(discovery.errors().values()))
            assert [t.name for t in discovery.targets()] == ["127.0.0.1:5"]
            assert await discovery.refresh(session, 120.0) is True
            assert [t.name for t in discovery.targets()] == ["127.0.0.1:6"]
        assert seen_auth == ["Bearer tok"] * 3


    async def test_credentials_follow_a_redirect_only_within_the_configured_origin(
            self, aiohttp_server, monkeypatch):
        seen: dict[str, dict[str, str | None]] = {}
        document = json.dumps([{"targets": ["127.0.0.1:7"]}])

        def recorder(where: str, body: str | None = None, to: str | None = None):
            async def handler(request):
                seen[where] = {k: request.headers.get(k) for k in ("Authorization", "X-Api-Key")}
                if to is not None:
                    raise web.HTTPFound(to)
                return web.Response(text=body or "")
            return handler

        foreign_app = web.Application()
        foreign_app.router.add_get("/sd", recorder("foreign", document))
        foreign = await aiohttp_server(foreign_app)
        home_app = web.Application()
        home_app.router.add_get("/moved", recorder("moved", to="/here"))
        home_app.router.add_get("/here", recorder("here", document))
        home_app.router.add_get("/away", recorder("away", to=str(foreign.make_url("/sd"))))
        home = await aiohttp_server(home_app)
        monkeypatch.setenv("SD_TEST_TOKEN", "tok-s3cret")
        async with aiohttp.ClientSession() as session:
            for path in ("/moved", "/away"):
                config = validate_config({"http_sd": [{
                    "url": str(home.make_url(path)), "token_env": "SD_TEST_TOKEN",
                    "headers": {"X-Api-Key": "hdr-s3cret"}}]})
                discovery = Discovery(config)
                assert await discovery.refresh(session, 100.0) is True, discovery.errors()
                assert [t.name for t in discovery.targets()] == ["127.0.0.1:7"]
        owned = {"Authorization": "Bearer tok-s3cret", "X-Api-Key": "hdr-s3cret"}
        assert seen == {"moved": owned, "here": owned, "away": owned,
                        "foreign": {"Authorization": None, "X-Api-Key": None}}


    async def test_a_plain_http_source_behind_a_proxy_gets_its_proxy_credentials(
            self, aiohttp_server, monkeypatch):
        seen: list[tuple[str, str | None]] = []

        async def proxy(request):
            seen.append((request.raw_path, request.headers.get("Proxy-Authorization")))
            return web.Response(text=json.dumps([{"targets": ["127.0.0.1:8"]}]))

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", proxy)
        server = await aiohttp_server(app)
        for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "all_proxy",
                     "ALL_PROXY", "HTTP_PROXY", "http_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("http_proxy", f"http://user:pw@127.0.0.1:{server.port}")
        config = validate_config({"http_sd": [{"url": "http://sd.invalid:9/sd"}]})
        discovery = Discovery(config)
        async with aiohttp.ClientSession() as session:
            assert await discovery.refresh(session, 100.0) is True, discovery.errors()
        assert [t.name for t in discovery.targets()] == ["127.0.0.1:8"]
        assert seen == [("http://sd.invalid:9/sd", "Basic dXNlcjpwdw==")]


@pytest.mark.e2e
class TestDiscoveryInTheExporter:
    async def test_targets_come_and_go_and_windows_close_them(self, fake_vllm, exporter,
                                                              tmp_path, promtool):
        a, b = await fake_vllm(k=2), await fake_vllm(k=2)
        sd = tmp_path / "fleet.json"
        sd.write_text(json.dumps([{"targets": [a.host_port], "labels": {"pool": "x"}}]))
        exp = await exporter({
            "targets": [{"name": "static", "url": b.url}],
            "file_sd": [{"files": [str(tmp_path / "*.json")]}],
        })
        await exp.round()
        names = [t["name"] for t in (await (await exp.client.get("/api/v1/targets")).json())
                 ["targets"]]
        assert names == ["static", a.host_port]
        metrics = await (await exp.client.get("/metrics")).text()
        assert f'specdec_target_up{{pool="x",target="{a.host_port}"}} 1.0' in metrics
        assert f'specdec_discovery_source_up{{source="{sd}"}} 1.0' in metrics

        started = await (await exp.client.post("/api/v1/windows", json={"id": "d"})).json()
        assert sorted(started["targets"]) == sorted(["static", a.host_port])
        a.server.add(0, 5, 10, [5, 0])
        await exp.round()

        sd.write_text("[{broken")
        _bump(sd)
        await exp.round()  # a broken file keeps its last good list
        assert a.host_port in exp.service.view().targets
        metrics = await (await exp.client.get("/metrics")).text()
        assert f'specdec_discovery_source_up{{source="{sd}"}} 0.0' in metrics
        checked = subprocess.run([promtool, "check", "metrics"], input=metrics.encode(),
                                 capture_output=True, timeout=60)
        assert (checked.returncode, checked.stdout, checked.stderr) == (0, b"", b"")
        page = await (await exp.client.get("/")).text()
        assert "discovery: " in page and "fleet.json: not valid json" in page.lower()

        sd.write_text("[]")
        _bump(sd)
        await exp.round()
        assert a.host_port not in exp.service.view().targets
        answer = await (await exp.client.post("/api/v1/windows/d/stop")).json()
        left = answer["results"][a.host_port]
        assert left["status"] == "na"
        assert left["error"].startswith("target no longer discovered at ")
        assert left["increase_until_removed"]["num_drafts"] == 5
        assert answer["results"]["static"]["status"] == "na"  # no traffic there


PROMETHEUS_TARGETS = {"status": "success", "data": {"activeTargets": [
    {"scrapePool": "vllm", "scrapeUrl": "http://10.0.0.1:8000/metrics", "health": "up",
     "labels": {"job": "vllm", "instance": "10.0.0.1:8000", "namespace": "llm",
                "cluster": "a", "model": "llama-3-8b"}},
    {"scrapePool": "vllm", "scrapeUrl": "https://10.0.0.2:8443/metrics?x=1", "health": "down",
     "labels": {"job": "vllm", "instance": "10.0.0.2:8443", "namespace": "llm",
                "cluster": "b", "model": "qwen-7b", "target": "clash"}},
    {"scrapePool": "node", "scrapeUrl": "http://10.0.0.9:9100/metrics", "health": "up",
     "labels": {"job": "node", "instance": "10.0.0.9:9100", "cluster": "a"}},
], "droppedTargets": []}}


class TestTargetsFromPrometheus:
    def _sd(self, **fields):
        return PrometheusSDConfig(url="http://prom:9090", **fields)

    def test_every_active_target_with_its_labels(self):
        targets = targets_from_prometheus(PROMETHEUS_TARGETS, "p", self._sd())
        assert [t.name for t in targets] == ["10.0.0.1:8000", "10.0.0.2:8443", "10.0.0.9:9100"]
        assert targets[0].url == "http://10.0.0.1:8000/metrics"
        assert targets[1].url == "https://10.0.0.2:8443/metrics?x=1"  # down ones too: up=0
        # job/instance are Prometheus's own, `target` is ours: the rest are kept.
        assert targets[0].labels == {"namespace": "llm", "cluster": "a", "model": "llama-3-8b"}
        assert "target" not in targets[1].labels

    @pytest.mark.parametrize(("job", "matchers", "expected"), [
        ("vllm", [], ["10.0.0.1:8000", "10.0.0.2:8443"]),
        (None, ['cluster="a"'], ["10.0.0.1:8000", "10.0.0.9:9100"]),
        ("vllm", ['cluster!="a"'], ["10.0.0.2:8443"]),
        ("vllm", ['model=~"llama.*"'], ["10.0.0.1:8000"]),
        ("vllm", ['model!~"llama.*"', 'namespace="llm"'], ["10.0.0.2:8443"]),
        (None, ['namespace=""'], ["10.0.0.9:9100"]),  # absent label = empty, as in PromQL
        ("nope", [], []),
        (None, ['model=~"llama"'], []),  # regexes are anchored
    ])
    def test_job_and_matchers(self, job, matchers, expected):
        targets = targets_from_prometheus(PROMETHEUS_TARGETS, "p",
                                          self._sd(job=job, matchers=matchers))
        assert [t.name for t in targets] == expected

    @pytest.mark.parametrize(("data", "message"), [
        ({"status": "error", "error": "x"}, "p: not a successful Prometheus API answer"),
        ([], "p: not a successful Prometheus API answer"),
        ({"status": "success", "data": {}}, "p: data.activeTargets must be a list"),
        ({"status": "success", "data": {"activeTargets": [{"scrapeUrl": "http://a:1/"}]}},
         "p: activeTargets.0: needs a labels mapping"),
        ({"status": "success", "data": {"activeTargets": [
            {"scrapeUrl": "ftp://a:1/", "labels": {}}]}},
         "p: activeTargets.0: must be an http:// or https:// URL with a host, not 'ftp://a:1/'"),
    ])
    def test_bad_answers_name_the_problem(self, data, message):
        with pytest.raises(DiscoveryError) as info:
            targets_from_prometheus(data, "p", self._sd())
        assert str(info.value) == message

    @pytest.mark.parametrize(("matcher", "message"), [
        ("cluster", 'prometheus_sd.0.matchers: must be a label matcher like name="value" or '
                    "name=~\"regex\", not 'cluster'"),
        ('cluster=~"("', "prometheus_sd.0.matchers: 'cluster=~\"(\"': bad regex: "
                         "missing ), unterminated subpattern at position 0"),
    ])
    def test_bad_matchers_are_config_errors(self, matcher, message):
        with pytest.raises(ConfigError) as info:
            validate_config({"prometheus_sd": [{"url": "http://p:9090", "matchers": [matcher]}]})
        assert info.value.problems == [message]


@pytest.mark.e2e
@pytest.mark.prometheus
class TestPrometheusSDAgainstRealPrometheus:
    def test_follows_prometheus_and_keeps_the_list_when_it_goes(self, tmp_path, prometheus):
        import time

        import yaml
        from clitools import CLI, fake_vllm, free_port, http, process, wait_http, write_config

        prom_port, port = free_port(), free_port()
        prom_url = f"http://127.0.0.1:{prom_port}"
        exporter_url = f"http://127.0.0.1:{port}"
        with fake_vllm("--k", "2") as v1, fake_vllm("--k", "3") as v2:
            config = tmp_path / "prometheus.yml"
            config.write_text(yaml.safe_dump({
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {"job_name": "vllm", "static_configs": [
                        {"targets": [f"127.0.0.1:{v1}"],
                         "labels": {"cluster": "a", "namespace": "llm"}},
                        {"targets": [f"127.0.0.1:{v2}"],
                         "labels": {"cluster": "b", "namespace": "llm"}}]},
                    {"job_name": "prometheus", "static_configs": [
                        {"targets": [f"127.0.0.1:{prom_port}"], "labels": {"cluster": "a"}}]},
                ]}))
            exporter_config = write_config(tmp_path / "exporter.yaml", port, [], prometheus_sd=[
                {"url": prom_url, "job": "vllm", "refresh_interval": "500ms"}])
            source = f"{prom_url}/api/v1/targets?state=active&job=vllm"

            def targets():
                status, body = http("GET", f"{exporter_url}/api/v1/targets")
                assert status == 200, body
                return {t["name"]: t for t in body["targets"]}

            def wait(what, probe, seconds=30):
                end = time.monotonic() + seconds
                while not (result := probe()):
                    assert time.monotonic() < end, f"timed out waiting for {what}"
                    time.sleep(0.25)
                return result

            prom = process([prometheus, f"--config.file={config}",
                            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
            with prom as prom_proc, process(CLI + ["serve", "--config", str(exporter_config)]):
                wait_http(f"{prom_url}/-/ready", deadline=30)
                wait_http(f"{exporter_url}/-/healthy")
                found = wait("both vLLM targets", lambda: len(targets()) == 2 and targets())
                assert set(found) == {f"127.0.0.1:{v1}", f"127.0.0.1:{v2}"}
                assert found[f"127.0.0.1:{v1}"]["labels"] == {"cluster": "a", "namespace": "llm"}
                assert found[f"127.0.0.1:{v2}"]["labels"] == {"cluster": "b", "namespace": "llm"}
                wait("the targets scraped", lambda: all(t["up"] for t in targets().values()))
                _, metrics = http("GET", f"{exporter_url}/metrics?format=text")
                assert f'specdec_discovery_source_up{{source="{source}"}} 1.0' in metrics
                assert f'cluster="b",namespace="llm",target="127.0.0.1:{v2}"' in metrics

                prom_proc.terminate()  # Prometheus goes away
                prom_proc.wait(30)
                wait("the source marked down", lambda: f'specdec_discovery_source_up{{source="'
                     f'{source}"}} 0.0' in http("GET", f"{exporter_url}/metrics?format=text")[1])
                assert set(targets()) == set(found)  # the last good list is kept
                page = http("GET", f"{exporter_url}/")[1]
                assert "api/v1/targets" in page and "discovery" in page

    def test_reads_300_active_targets_of_a_real_prometheus(self, tmp_path, prometheus):
        # Prometheus answers ~140 KB for 300 active targets, in several writes; the targets
        # need not listen (Prometheus lists them active, down).
        import time

        import yaml
        from clitools import CLI, free_port, http, process, wait_http, write_config

        prom_port, port = free_port(), free_port()
        prom_url = f"http://127.0.0.1:{prom_port}"
        wanted = {f"127.0.0.1:{40_000 + i}" for i in range(300)}
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "vllm", "static_configs": [
                {"targets": sorted(wanted), "labels": {"cluster": "a", "namespace": "llm"}}]}],
        }))
        exporter_config = write_config(tmp_path / "exporter.yaml", port, [], prometheus_sd=[
            {"url": prom_url, "job": "vllm", "refresh_interval": "500ms"}])
        source = f"{prom_url}/api/v1/targets?state=active&job=vllm"
        with process([prometheus, f"--config.file={config}",
                      f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                      f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"]), \
                process(CLI + ["serve", "--config", str(exporter_config)]):
            wait_http(f"{prom_url}/-/ready", deadline=30)
            wait_http(f"http://127.0.0.1:{port}/-/healthy")
            end = time.monotonic() + 60
            while True:
                _, body = http("GET", f"http://127.0.0.1:{port}/api/v1/targets")
                names = {t["name"] for t in body["targets"]}
                if names == wanted or time.monotonic() > end:
                    break
                time.sleep(0.5)
            assert names == wanted
            _, raw = http("GET", f"{prom_url}/api/v1/targets?state=active&job=vllm")
            assert len(str(raw)) > 100_000  # the answer is as large as the issue's
            _, metrics = http("GET", f"http://127.0.0.1:{port}/metrics?format=text")
            assert f'specdec_discovery_source_up{{source="{source}"}} 1.0' in metrics


class TestRelabelledTarget:
    async def test_last_window_gauges_follow_a_label_change(self, fake_vllm, exporter,
                                                            tmp_path):
        """A file_sd label change shows in every family of one exposition, the last window's
        included (an identity-keyed cache kept the old labels there)."""
        a = await fake_vllm(k=2)
        sd = tmp_path / "fleet.json"
        sd.write_text(json.dumps([{"targets": [a.host_port], "labels": {"pool": "x"}}]))
        exp = await exporter({"file_sd": [{"files": [str(tmp_path / "*.json")]}]})
        await exp.round()
        await exp.client.post("/api/v1/windows", json={"id": "w"})
        a.server.add(0, 5, 10, [5, 3])
        assert (await exp.client.post("/api/v1/windows/w/stop")).status == 200
        metrics = await (await exp.client.get("/metrics")).text()
        assert f'specdec_last_window_acceptance_ratio{{pool="x",target="{a.host_port}"}}' in metrics

        sd.write_text(json.dumps([{"targets": [a.host_port], "labels": {"pool": "y"}}]))
        _bump(sd)
        await exp.round()
        metrics = await (await exp.client.get("/metrics")).text()
        assert f'specdec_target_up{{pool="y",target="{a.host_port}"}} 1.0' in metrics
        assert f'specdec_last_window_acceptance_ratio{{pool="y",target="{a.host_port}"}}' in metrics
        assert 'pool="x"' not in metrics


def _laughs() -> str:
    """A YAML "billion laughs": 9 levels of 9 aliases, ~600 bytes, 9**9 values walked."""
    lines = ['- &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        refs = ", ".join([f"*l{level - 1}"] * 9)
        lines.append(f"- &l{level} [{refs}]")
    return "\n".join(lines) + "\n"


DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON, nested 100,000 deep


@pytest.mark.e2e
class TestNothingASourceSendsStopsTheLoop:
    """Each hostile answer is that source's error; the loop scrapes on and a window open
    across it counts every draft (10 before, 12 after)."""

    @pytest.mark.parametrize("kind", ["file_sd_deep_json", "file_sd_yaml_laughs",
                                      "http_sd_deep_json", "prometheus_sd_data_list"])
    async def test_the_loop_scrapes_on(self, fake_vllm, exporter, aiohttp_server, tmp_path,
                                       kind):
        vllm = await fake_vllm(k=2)
        bodies = {"http_sd_deep_json": DEEP,
                  "prometheus_sd_data_list": '{"status":"success","data":[1,2]}'}

        async def answer(request):
            return web.Response(text=bodies[kind], content_type="application/json")

        app = web.Application()
        app.router.add_get("/sd", answer)
        app.router.add_get("/api/v1/targets", answer)
        server = await aiohttp_server(app)
        config: dict = {"targets": [{"name": "static", "url": vllm.url}]}
        if kind.startswith("file_sd"):
            suffix = "yml" if "yaml" in kind else "json"
            (tmp_path / f"sd.{suffix}").write_text(_laughs() if "yaml" in kind else DEEP)
            config["file_sd"] = [{"files": [str(tmp_path / f"*.{suffix}")]}]
        elif kind.startswith("http_sd"):
            config["http_sd"] = [{"url": str(server.make_url("/sd"))}]
        else:
            config["prometheus_sd"] = [{"url": str(server.make_url("/"))}]
        exp = await exporter(config)
        await exp.round()
        await exp.client.post("/api/v1/windows", json={"id": "w"})
        vllm.server.add(0, 10, 20, [10, 10])
        await exp.round()
        await exp.round()
        errors = dict(exp.service.view().discovery_errors)
        assert len(errors) == 1, errors
        vllm.server.add(0, 12, 24, [12, 12])
        await exp.round()
        answer = await (await exp.client.post("/api/v1/windows/w/stop")).json()
        assert answer["results"]["static"]["increase"]["num_drafts"] == 22


class TestHttpSDAtRealSizes:
    async def test_5000_targets_served_in_several_writes(self):
        groups = [{"targets": [f"10.0.{i // 250}.{i % 250}:8000"], "labels": {"n": str(i)}}
                  for i in range(5000)]
        body = json.dumps(groups).encode()
        writes = []

        async def serve(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
            step = 64 * 1024
            for start in range(0, len(body), step):
                writer.write(body[start:start + step])
                writes.append(start)
                await writer.drain()
                await asyncio.sleep(0)  # each write its own segment, as a busy server sends
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            config = validate_config({"http_sd": [{"url": f"http://127.0.0.1:{port}/sd"}]})
            discovery = Discovery(config)
            async with aiohttp.ClientSession() as session:
                assert await discovery.refresh(session, 1.0) is True
        assert len(writes) > 4
        assert discovery.errors() == {}
        assert len(discovery.targets()) == 5000
        assert discovery.targets()[4999].labels == {"n": "4999"}
