"""Config reloads that hurt are refused, and the old config keeps serving."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from clitools import CLI

from exporter.config.model import MAX_CONFIG_BYTES
from faults.checks import still_serving, value


@pytest.fixture
async def running(exporter, target, tmp_path):
    """An exporter over one target from a config file, with window w1 open."""
    path = tmp_path / "exporter.yaml"
    config = {"listen": "127.0.0.1:9400", "output_dir": str(tmp_path / "out"),
              "targets": [{"name": "a", "url": target.url}]}
    path.write_text(json.dumps(config))
    exp = await exporter(config, config_path=path)
    await exp.round()
    await exp.start(id="w1")
    exp.path = path
    exp.base = config
    return exp


async def _refused(exp, needle: str) -> dict:
    """POST /-/reload is 400 with `needle` in a problem; the old config and w1 keep going."""
    old = exp.service.config
    response = await exp.client.post("/-/reload")
    assert response.status == 400, await response.text()
    body = await response.json()
    assert any(needle in problem for problem in body["problems"]), body
    assert exp.service.config is old
    found = await still_serving(exp.client)
    assert value(found, "specdec_config_last_reload_successful") == 0
    assert value(found, "specdec_target_up", target="a") == 1.0
    window = await (await exp.client.get("/api/v1/windows/w1")).json()
    assert window["status"] == "open" and window["errors"] == {}
    return body


def _check(tmp_path, content: bytes, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "check.yaml"
    path.write_bytes(content)
    return subprocess.run(CLI + ["check-config", *flags, str(path)], capture_output=True,
                          text=True, timeout=120)


class TestEmpty:
    @pytest.mark.parametrize(
        ("content", "needle"),
        [(b"", "(file): empty: refused"), (b"\n  \n", "(file): empty: refused"),
         (b"targets: []\n", "targets: no targets and no discovery"),
         (b"scrape_interval: 5s\n", "targets: no targets and no discovery")],
    )
    async def test_reload_to_an_empty_config_is_refused(self, running, target, content, needle):
        running.path.write_bytes(content)
        await _refused(running, needle)
        # The window counts on: stopping it gives the numbers, not N/A.
        target.counters.add(5, 10, [4, 3])
        await running.round()
        answer = await running.stop("w1")
        assert answer["results"]["a"]["status"] == "ok"
        assert answer["results"]["a"]["data"]["num_drafts"] == 5

    @pytest.mark.e2e
    def test_check_config_refuses_empty_unless_allowed(self, tmp_path):
        done = _check(tmp_path, b"")
        assert done.returncode == 1
        assert done.stdout.startswith("(file): empty: refused")
        allowed = _check(tmp_path, b"", "--allow-empty")
        assert allowed.returncode == 0, allowed.stdout
        assert _check(tmp_path, b"targets: []\n", "--allow-empty").returncode == 0


@pytest.mark.e2e
class TestDurations:
    @pytest.mark.parametrize(
        ("text", "message"),
        [(".nan", "must be a finite duration"), (".inf", "must be a finite duration"),
         ("-.inf", "must be a finite duration"), ("-1", "must be greater than 0"),
         ("0", "must be greater than 0"), ("1000000000", "must be at most 7 days")],
    )
    @pytest.mark.parametrize("key", ["scrape_interval", "live_window", "state_save_interval"])
    async def test_non_finite_and_non_positive_durations_are_refused(
        self, running, tmp_path, key, text, message
    ):
        content = f"{key}: {text}\ntargets: [{{name: a, url: 'http://h:1/metrics'}}]\n"
        if key == "scrape_interval":  # the real CLI once per value: it is slow to start
            done = _check(tmp_path, content.encode())
            assert done.returncode == 1
            assert done.stdout.startswith(f"{key}: {message}"), done.stdout
        running.path.write_text(content)
        await _refused(running, f"{key}: {message}")


class TestHostileFiles:
    @pytest.mark.e2e
    async def test_20000_levels_of_nesting(self, running, tmp_path):
        content = b"targets: " + b"[" * 20_000 + b"]" * 20_000 + b"\n"
        done = _check(tmp_path, content)
        assert done.returncode == 1
        assert done.stdout.startswith("(yaml): nested too deeply"), done.stdout
        assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
        running.path.write_bytes(content)
        await _refused(running, "nested too deeply")

    async def test_block_style_nesting(self, running):
        running.path.write_text("".join(f"{' ' * i}k{i}:\n" for i in range(3000)))
        body = await _refused(running, "")
        assert "Traceback" not in body["error"]

    @pytest.mark.e2e
    async def test_over_one_mebibyte_is_refused_unread(self, running, tmp_path):
        content = b"# " + b"x" * MAX_CONFIG_BYTES + b"\ntargets: []\n"
        assert _check(tmp_path, content).stdout.startswith(
            f"(file): over {MAX_CONFIG_BYTES} bytes")
        running.path.write_bytes(content)
        await _refused(running, f"over {MAX_CONFIG_BYTES} bytes")

    @pytest.mark.parametrize(
        ("content", "needle"),
        [(bytes(range(256)) * 4, "not UTF-8 text: byte 0x80 at offset 128"),
         (b"targets:\n  - url: http://h:1/\xff\xfe\n", "not UTF-8 text: byte 0xff at offset 29"),
         (b"\x00\x01\x02\x03garbage", "(yaml): invalid YAML"),
         (b"\x7fELF\x02\x01\x01\x00" * 64, "(yaml): invalid YAML")],
        ids=["bytes", "latin1", "nul", "elf"],
    )
    async def test_binary_garbage_and_invalid_utf8_are_400(self, running, content, needle):
        running.path.write_bytes(content)
        await _refused(running, needle)


class TestListen:
    async def test_reload_changing_listen_is_refused_with_the_reason(self, running):
        running.path.write_text(json.dumps(running.base | {"listen": "127.0.0.1:9555"}))
        await _refused(running, "listen: changed from 127.0.0.1:9400 to 127.0.0.1:9555")
        # The same file without the change is taken.
        running.path.write_text(json.dumps(running.base | {"scrape_timeout": "1s"}))
        assert (await running.client.post("/-/reload")).status == 200
        assert running.service.config.scrape_timeout == 1.0


class TestHugeReloads:
    def _targets(self, count: int) -> list[dict]:
        return [{"name": f"t{i}", "url": f"http://10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:1/"}
                for i in range(count)]

    async def _metrics_during(self, exp) -> tuple[object, int]:
        """The reload's answer, and how many /metrics answers came while it was in flight."""
        reload = asyncio.ensure_future(exp.client.post("/-/reload"))
        answered = 0
        while not reload.done():
            response = await exp.client.get("/metrics")
            assert response.status == 200
            await response.read()
            answered += 1 if not reload.done() else 0
        return await reload, answered

    async def test_100000_targets_are_refused_and_metrics_answers_meanwhile(self, running):
        running.path.write_text(json.dumps(running.base | {"targets": self._targets(100_000)}))
        response, answered = await self._metrics_during(running)
        assert response.status == 400
        assert f"over {MAX_CONFIG_BYTES} bytes" in (await response.json())["error"]
        assert len(running.service.view().targets) == 1

    async def test_max_targets_refuses_before_building_them(self, running):
        running.path.write_text(json.dumps(running.base | {
            "max_targets": 50, "targets": self._targets(51)}))
        await _refused(running, "targets: 51 targets is over max_targets (50)")

    async def test_a_large_reload_is_read_off_the_loop(self, running):
        # ~9,000 targets: under the 1 MiB cap, seconds of YAML parsing and validation.
        targets = [{"name": "a", "url": running.base["targets"][0]["url"]}] + self._targets(9_000)
        text = json.dumps(running.base | {"targets": targets}, indent=1)
        assert len(text) < MAX_CONFIG_BYTES
        running.path.write_text(text)
        response, answered = await self._metrics_during(running)
        assert response.status == 200, await response.text()
        assert len(running.service.view().targets) == 9_001
        # Were the reading and checking on the loop, no /metrics answer could come before the
        # reload's (they would queue behind it); off the loop, they keep coming.
        assert answered >= 5, answered

    async def test_a_discovery_source_over_max_targets_keeps_its_last_list(
        self, exporter, target, tmp_path
    ):
        sd = tmp_path / "sd.json"
        sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{target.port}"]}]))
        exp = await exporter({"max_targets": 20, "file_sd": [{"files": [str(sd)]}]})
        await exp.round()
        assert list(exp.service.view().targets) == [f"127.0.0.1:{target.port}"]
        sd.write_text(json.dumps([{"targets": [f"10.0.0.{i}:1" for i in range(21)]}]))
        await exp.round()
        assert list(exp.service.view().targets) == [f"127.0.0.1:{target.port}"]
        errors = list(exp.service.view().discovery_errors.values())
        assert errors == [f"{sd}: 21 targets is over max_targets (20)"]
