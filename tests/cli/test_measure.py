"""`measure`'s target list: specs, AISBench model configs (inheriting ones through mmengine)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from aiohttp import web

from exporter.cli.measure import (
    distinct_names,
    measure,
    run_command,
    target_from_spec,
    targets_from_model_config,
)
from exporter.config.model import TargetConfig
from exporter.core.errors import ExporterError

# Shaped like AISBench's shipped configs: the base imports AISBench's classes (not installed
# here, as on a machine where only the config files are), the user's config inherits it
# through mmengine's read_base() and overrides the server's address.
BASE = """\
from ais_bench.benchmark.models import VLLMCustomAPIChat
from ais_bench.benchmark.utils.postprocess.model_postprocessors import extract_non_reasoning_content

models = [
    dict(
        attr="service",
        type=VLLMCustomAPIChat,
        abbr="vllm-api-stream-chat",
        path="",
        model="",
        stream=True,
        request_rate=0,
        retry=2,
        api_key="",
        host_ip="localhost",
        host_port=8080,
        url="",
        max_out_len=512,
        batch_size=1,
        generation_kwargs=dict(temperature=0.01, ignore_eos=False),
        pred_postprocessor=dict(type=extract_non_reasoning_content),
    )
]
"""
CHILD = """\
from mmengine import read_base

with read_base():
    from .vllm_api_stream_chat import models

models[0]['host_ip'] = "10.1.2.3"
models[0]['host_port'] = 9001
models[0]['request_rate'] = 50
"""


def _inheriting_config(tmp_path: Path) -> Path:
    folder = tmp_path / "configs" / "models" / "vllm_api"
    folder.mkdir(parents=True)
    (folder / "vllm_api_stream_chat.py").write_text(BASE)
    child = folder / "my_run.py"
    child.write_text(CHILD)
    return child


@pytest.fixture
def mmengine():
    """mmengine's Config; the test extra installs it, so a missing one fails in CI."""
    try:
        import mmengine.config
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("mmengine missing in CI: the test extra installs mmengine-lite")
        pytest.skip("mmengine not installed (pip install mmengine-lite)")
    return mmengine.config.Config


class TestModelConfig:
    def test_inheriting_config_read_with_mmengine(self, tmp_path, mmengine):
        targets = targets_from_model_config(_inheriting_config(tmp_path))
        assert [t.url for t in targets] == ["http://10.1.2.3:9001/metrics"]
        assert [t.name for t in targets] == ["10.1.2.3:9001"]

    def test_base_alone_read_with_mmengine(self, tmp_path, mmengine):
        _inheriting_config(tmp_path)
        base = tmp_path / "configs" / "models" / "vllm_api" / "vllm_api_stream_chat.py"
        assert [t.url for t in targets_from_model_config(base)] == [
            "http://localhost:8080/metrics"]

    def _without_mmengine(self, path: Path) -> subprocess.CompletedProcess[str]:
        # A fresh interpreter in which `import mmengine` fails, as where it is not installed.
        code = textwrap.dedent(f"""
            import sys
            sys.modules["mmengine"] = None
            from exporter.core.errors import ExporterError
            from exporter.cli.measure import targets_from_model_config
            try:
                print([t.url for t in targets_from_model_config({str(path)!r})])
            except ExporterError as exc:
                print("error:", exc)
        """)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, env=os.environ | {"PYTHONPATH": os.getcwd()})

    @pytest.mark.e2e
    def test_plain_config_without_mmengine_uses_the_simple_reader(self, tmp_path):
        _inheriting_config(tmp_path)
        base = tmp_path / "configs" / "models" / "vllm_api" / "vllm_api_stream_chat.py"
        done = self._without_mmengine(base)
        assert done.stdout == "['http://localhost:8080/metrics']\n", done.stderr

    @pytest.mark.e2e
    def test_inheriting_config_without_mmengine_says_what_to_install(self, tmp_path):
        child = _inheriting_config(tmp_path)
        done = self._without_mmengine(child)
        assert done.stdout == (
            f"error: {child}: no model entry with host_ip/host_port or url (the config "
            "inherits through read_base(): install mmengine, e.g. pip install "
            "'specdec-exporter[aisbench]', to read it)\n"
        ), done.stderr

    def test_broken_inheriting_config_names_the_file(self, tmp_path, mmengine):
        child = _inheriting_config(tmp_path)
        (child.parent / "vllm_api_stream_chat.py").unlink()
        with pytest.raises(ExporterError) as caught:
            targets_from_model_config(child)
        assert str(caught.value).startswith(f"{child}: mmengine cannot read it: ")

    def test_yaml_config(self, tmp_path):
        path = tmp_path / "models.yaml"
        path.write_text(json.dumps({"models": [{"host_ip": "h", "host_port": 1},
                                               {"url": "https://s:2/v1/chat/completions"}]}))
        assert [t.url for t in targets_from_model_config(path)] == [
            "http://h:1/metrics", "https://s:2/metrics"]


class TestDistinctNames:
    def test_same_host_port_different_paths_keep_both(self):
        targets = [target_from_spec("http://h:1/a/metrics"), target_from_spec("http://h:1/b"),
                   target_from_spec("h:2")]
        assert [t.name for t in distinct_names(targets)] == [
            "h:1/a/metrics", "h:1/b", "h:2"]

    def test_the_same_target_twice_is_one(self):
        targets = [target_from_spec("h:1"), TargetConfig(host="h", port=1)]
        assert [t.url for t in distinct_names(targets)] == ["http://h:1/metrics"]


@pytest.mark.e2e
class TestMeasureWindow:
    async def test_unusable_stop_scrape_is_said_not_counted(self, aiohttp_server, tmp_path):
        # The stop scrape's accepted counter reads NaN: no span is left, and the file says so.
        pages = [
            "vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\n"
            "vllm:spec_decode_num_accepted_tokens_total 20\n",
            "vllm:spec_decode_num_drafts_total 20\nvllm:spec_decode_num_draft_tokens_total 60\n"
            "vllm:spec_decode_num_accepted_tokens_total NaN\n",
        ]
        served = []

        async def metrics(request: web.Request) -> web.Response:
            served.append(request.path)
            return web.Response(text=pages[min(len(served), 2) - 1])

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        server = await aiohttp_server(app)
        # Without the name filter's probe at first contact, which would be served a page.
        target = target_from_spec(f"127.0.0.1:{server.port}").model_copy(
            update={"name_filter": False})
        code, answer = await measure([target], [sys.executable, "-c", "pass"], tmp_path,
                                     interval=3600)
        assert code == 0 and len(served) == 2
        result = answer["results"][target.name]
        assert result["status"] == "na"
        assert result["error"].startswith(
            "No span of the window with every spec decode counter usable: "
            "num_accepted_tokens was NaN at ")
        assert result["raw"] == {"before": {"num_drafts": 10, "num_draft_tokens": 30,
                                            "num_accepted_tokens": 20, "accepted_per_pos": {}},
                                 "after": None}
        written = json.loads((tmp_path / "performances" /
                              f"spec_decode_127.0.0.1_{server.port}.json").read_text())
        assert written == result


@pytest.mark.e2e
class TestRunCommand:
    async def test_a_ctrl_c_while_the_command_starts_reaches_it(self, tmp_path):
        # The signal comes while the command is being started. Ours then, it would leave the
        # command running (and a run's window open): here it would only be recorded.
        ours: list[int] = []
        previous = signal.signal(signal.SIGINT, lambda sig, frame: ours.append(sig))
        pid_file = tmp_path / "pid"
        command = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w')"
                   ".write(str(os.getpid())); time.sleep(30)"]
        try:
            task = asyncio.create_task(run_command(command))
            await asyncio.sleep(0)  # the task is starting the command now
            os.kill(os.getpid(), signal.SIGINT)
            try:
                code = await asyncio.wait_for(asyncio.shield(task), 15)
            finally:
                if not task.done() and pid_file.exists():  # not forwarded: end the command
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
                    await task
        finally:
            signal.signal(signal.SIGINT, previous)
        assert code == 128 + signal.SIGINT and ours == []


class TestMeasureCommand:
    def test_inheriting_model_config_through_the_cli(self, tmp_path, mmengine):
        from clitools import CLI, fake_vllm, measured

        child = _inheriting_config(tmp_path)
        with fake_vllm("--k", "2") as port:
            child.write_text(CHILD.replace('"10.1.2.3"', '"127.0.0.1"').replace("9001", str(port)))
            # The benchmark: ten drafts on the fake server while measure watches.
            body = json.dumps({"engine": 0, "drafts": 10, "draft_tokens": 20,
                               "accepted_per_pos": [6, 3]})
            bench = (
                "import urllib.request as u; u.build_opener(u.ProxyHandler({})).open(u.Request("
                f"'http://127.0.0.1:{port}/control/add', data={body.encode()!r}, "
                "headers={'Content-Type': 'application/json'}, method='POST'))"
            )
            done = subprocess.run(
                CLI + ["measure", "--model-config", str(child), "--work-dir", str(tmp_path / "w"),
                       "--", sys.executable, "-c", bench],
                capture_output=True, text=True, timeout=120,
            )
        assert done.returncode == 0, done.stderr
        result = json.loads((measured(tmp_path / "w") /
                             f"spec_decode_127.0.0.1_{port}.json").read_text())
        assert result["status"] == "ok", result
        assert result["data"]["num_drafts"] == 10 and result["data"]["accepted_tokens"] == 9
        assert f"[127.0.0.1:{port}]" in done.stdout


@pytest.mark.e2e
class TestMeasureProtocol:
    """`measure` runs the same window protocol as `serve` (the window book)."""

    async def test_spec_series_gone_at_stop_is_said(self, aiohttp_server, tmp_path):
        from aiohttp import web
        from faults.servers import Counters

        counters = Counters(k=2)
        counters.add(10, 20, [9, 8])
        plain = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1.0\n"
        state = {"spec": True}

        async def page(request: web.Request) -> web.Response:
            return web.Response(body=counters.page() if state["spec"] else plain,
                                content_type="text/plain")

        async def flip(request: web.Request) -> web.Response:
            counters.add(5, 10, [4, 3])
            state["spec"] = False  # a server restarted without speculative decoding
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/metrics", page)
        app.router.add_post("/flip", flip)
        server = await aiohttp_server(app)
        from exporter.cli.measure import measure

        target = TargetConfig(url=f"http://127.0.0.1:{server.port}/metrics")
        cmd = [sys.executable, "-c", "import urllib.request; urllib.request.urlopen("
               f"'http://127.0.0.1:{server.port}/flip', data=b'')"]
        code, answer = await measure([target], cmd, tmp_path, interval=60.0)
        assert code == 0
        result = next(iter(answer["results"].values()))
        # As serve says it: the stop's page had no spec decode series.
        assert "no spec decode series on the page" in json.dumps(result)
        assert (tmp_path / "window.json").exists()


async def test_measure_scrapes_every_second_while_the_command_runs(tmp_path, aiohttp_server):
    # What a server counted between our last scrape and its restart is lost: by default the
    # targets are scraped every second, as an exporter's window_scrape_interval does.
    page = (Path(__file__).resolve().parents[1] / "testdata" / "pages"
            / "vllm-0.33.0-rendered-k3.txt").read_text()
    scrapes = []

    async def metrics(_: web.Request) -> web.Response:
        scrapes.append(1)
        return web.Response(text=page)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    target = TargetConfig(url=f"http://127.0.0.1:{server.port}/metrics")
    code, _ = await measure([target], [sys.executable, "-c", "import time; time.sleep(3.5)"],
                            tmp_path)
    assert code == 0
    assert 2 + 2 <= len(scrapes) <= 2 + 4  # start, stop, and one a second between
