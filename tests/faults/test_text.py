"""Text that is not text (lone UTF-16 surrogates) is refused where it enters."""

from __future__ import annotations

import json
import subprocess

import pytest
from clitools import CLI

from exporter.core.text import TextError, clean_text
from faults.checks import still_serving, value

EMOJI = "\U0001f600"


class TestCleanText:
    @pytest.mark.parametrize(
        ("given", "expected"),
        [("plain", "plain"), ("x\ud83d\ude00y", f"x{EMOJI}y"), (EMOJI, EMOJI), ("", "")],
    )
    def test_pairs_are_joined(self, given, expected):
        assert clean_text(given) == expected

    @pytest.mark.parametrize(
        ("given", "where"),
        [("\ud800", 0), ("ab\udc00", 2), ("\ud83d", 0), ("\ude00\ud83d", 0), ("x\ud83dy", 1)],
    )
    def test_lone_surrogates_are_refused_with_the_place(self, given, where):
        with pytest.raises(TextError) as caught:
            clean_text(given, "labels.k")
        assert str(caught.value).startswith("labels.k: not valid Unicode text: lone UTF-16")
        assert f"at character {where}" in str(caught.value)


class TestApi:
    @pytest.mark.parametrize(
        ("body", "field"),
        [
            (b'{"name": "w\\ud800"}', "name"),
            (b'{"labels": {"k": "\\udfff"}}', "labels.k"),
            (b'{"labels": {"\\ud800": "v"}}', "labels"),
            (b'{"targets": ["a\\ud800"]}', "targets.0"),
        ],
    )
    async def test_window_start_with_a_lone_surrogate_is_400_naming_the_field(
        self, exp, body, field
    ):
        response = await exp.client.post(
            "/api/v1/windows", data=body, headers={"Content-Type": "application/json"})
        assert response.status == 400, await response.text()
        error = (await response.json())["error"]
        assert error.startswith(f"{field}: not valid Unicode text"), error
        listing = await (await exp.client.get("/api/v1/windows")).json()
        assert listing["windows"] == []
        landing = await exp.client.get("/")
        assert landing.status == 200

    async def test_a_surrogate_pair_is_one_character_and_the_window_works(self, exp, target):
        body = b'{"id": "w1", "name": "n\\ud83d\\ude00", "labels": {"e": "\\ud83d\\ude00"}}'
        response = await exp.client.post(
            "/api/v1/windows", data=body, headers={"Content-Type": "application/json"})
        assert response.status == 201, await response.text()
        assert (await response.json())["name"] == f"n{EMOJI}"
        target.counters.add(4, 8, [3, 2])
        await exp.round()
        assert (await exp.client.get("/")).status == 200
        answer = await exp.stop("w1")
        assert answer["name"] == f"n{EMOJI}"
        assert answer["results"]["a"]["status"] == "ok"


class TestConfig:
    def _check(self, tmp_path, text: str) -> subprocess.CompletedProcess:
        path = tmp_path / "c.yaml"
        path.write_text(text, encoding="utf-8")
        return subprocess.run(CLI + ["check-config", str(path)], capture_output=True,
                              text=True, timeout=60)

    @pytest.mark.parametrize(
        ("text", "key"),
        [
            ('targets: [{url: "http://h:1/metrics", labels: {c: "\\ud800"}}]\n',
             "targets.0.labels.c"),
            ('targets: [{url: "http://h:1/metrics", name: "n\\udc00"}]\n', "targets.0.name"),
            (json.dumps({"targets": [{"url": "http://h:1/metrics", "labels": {"c": "\ud800"}}]}),
             "targets.0.labels.c"),
        ],
        ids=["yaml-label", "yaml-name", "json-label"],
    )
    @pytest.mark.e2e
    def test_check_config_names_the_key(self, tmp_path, text, key):
        done = self._check(tmp_path, text)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout.startswith(f"{key}: not valid Unicode text: lone UTF-16"), done.stdout
        assert "Traceback" not in done.stderr

    @pytest.mark.e2e
    def test_json_dumps_with_an_emoji_is_a_valid_config(self, tmp_path):
        text = json.dumps({"targets": [{"url": "http://h:1/metrics", "name": f"t{EMOJI}",
                                        "labels": {"c": EMOJI}}]})
        assert "\\ud83d\\ude00" in text  # json.dumps spells it as a pair
        done = self._check(tmp_path, text)
        assert done.returncode == 0, done.stdout

    async def test_emoji_labels_reach_metrics_as_one_character(self, exporter, target):
        config = json.loads(json.dumps({"targets": [
            {"name": "a", "url": target.url, "labels": {"c": EMOJI}}]}))
        # What yaml.safe_load gives for json.dumps' text: the pair as two surrogates.
        config["targets"][0]["labels"]["c"] = "\ud83d\ude00"
        exp = await exporter(config)
        await exp.round()
        found = await still_serving(exp.client)
        assert value(found, "specdec_target_up", target="a", c=EMOJI) == 1.0

    async def test_reload_with_a_lone_surrogate_is_refused_old_config_serves(
        self, exporter, target, tmp_path
    ):
        path = tmp_path / "c.yaml"
        path.write_text(json.dumps({"targets": [{"name": "a", "url": target.url}]}))
        exp = await exporter({"targets": [{"name": "a", "url": target.url}]}, config_path=path)
        path.write_text(f'targets: [{{name: a, url: "{target.url}", labels: {{c: "\\ud800"}}}}]')
        response = await exp.client.post("/-/reload")
        assert response.status == 400
        assert "targets.0.labels.c: not valid Unicode" in (await response.json())["error"]
        await exp.round()
        found = await still_serving(exp.client)
        assert value(found, "specdec_target_up", target="a") == 1.0


class TestDiscovery:
    async def test_file_sd_entry_with_a_lone_surrogate_is_refused_others_kept(
        self, exporter, target, tmp_path
    ):
        sd = tmp_path / "sd.json"
        # Written as bytes: the JSON escape, exactly as a generator might write it.
        sd.write_text(
            '[{"targets": ["127.0.0.1:1"], "labels": {"c": "\\ud800"}},'
            f' {{"targets": ["127.0.0.1:{target.port}"], "labels": {{"c": "\\ud83d\\ude00"}}}}]'
        )
        exp = await exporter({"file_sd": [{"files": [str(sd)]}]})
        await exp.round()
        found = await still_serving(exp.client)
        name = f"127.0.0.1:{target.port}"
        assert value(found, "specdec_target_up", target=name, c=EMOJI) == 1.0
        assert value(found, "specdec_target_up", target="127.0.0.1:1") is None
        errors = exp.service.view().discovery_errors
        assert any("0.labels.c: not valid Unicode text" in e for e in errors.values()), errors
        landing = await exp.client.get("/")
        assert landing.status == 200
        assert "not valid Unicode text" in await landing.text()
