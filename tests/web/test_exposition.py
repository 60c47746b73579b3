"""exporter/web/exposition.py: our own /metrics over real fake servers (names, types, labels, live
numbers), and MetricsWriter on its own."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from aiohttp import web
from conftest import Clock
from prometheus_client.parser import text_string_to_metric_families

from exporter.config.model import validate_config
from exporter.server.service import ExporterService
from exporter.web.exposition import MetricsWriter


async def _metrics_text(exp) -> str:
    response = await exp.client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    return await response.text()


async def _families(exp) -> dict:
    return {f.name: f for f in text_string_to_metric_families(await _metrics_text(exp))}


def _samples(families: dict, family: str, name: str | None = None) -> dict:
    """{frozenset(labels): value} of one family's samples called `name` (default: the family)."""
    name = name or family
    return {
        frozenset(s.labels.items()): s.value
        for s in families[family].samples if s.name == name
    } if family in families else {}


def _value(families: dict, family: str, labels: dict, name: str | None = None) -> float | None:
    return _samples(families, family, name).get(frozenset(labels.items()))


# (family as the parser names it, sample name, type, label names) from CONTRACT.md's table.
CONTRACT = [
    ("specdec_target_up", "specdec_target_up", "gauge", {"target"}),
    ("specdec_scrape_duration_seconds", "specdec_scrape_duration_seconds", "gauge", {"target"}),
    ("specdec_scrape_errors", "specdec_scrape_errors_total", "counter", {"target"}),
    ("specdec_drafts", "specdec_drafts_total", "counter", {"target", "model_name"}),
    ("specdec_draft_tokens", "specdec_draft_tokens_total", "counter", {"target", "model_name"}),
    ("specdec_accepted_tokens", "specdec_accepted_tokens_total", "counter",
     {"target", "model_name"}),
    ("specdec_accepted_tokens_per_position", "specdec_accepted_tokens_per_position_total",
     "counter", {"target", "model_name", "position"}),
    ("specdec_acceptance_ratio", "specdec_acceptance_ratio", "gauge", {"target"}),
    ("specdec_acceptance_length", "specdec_acceptance_length", "gauge", {"target"}),
    ("specdec_position_acceptance_ratio", "specdec_position_acceptance_ratio", "gauge",
     {"target", "position"}),
    ("specdec_last_window_acceptance_ratio", "specdec_last_window_acceptance_ratio", "gauge",
     {"target"}),
    ("specdec_last_window_acceptance_length", "specdec_last_window_acceptance_length", "gauge",
     {"target"}),
    ("specdec_last_window_position_acceptance_ratio",
     "specdec_last_window_position_acceptance_ratio", "gauge", {"target", "position"}),
    ("specdec_windows_open", "specdec_windows_open", "gauge", set()),
    ("specdec_config_last_reload_successful", "specdec_config_last_reload_successful", "gauge",
     set()),
]

PER_TARGET = {row[0] for row in CONTRACT if "target" in row[3]}
CONTRACT_SAMPLE = {row[0]: row[1] for row in CONTRACT}


async def _with_window(fake_vllm, exporter, clock: Clock):
    """Two targets (one with labels), traffic, a stopped window and one more round."""
    fake = await fake_vllm(k=3, engines=2)
    other = await fake_vllm(k=2)
    exp = await exporter({"live_window": "60s", "targets": [
        {"name": "a", "url": fake.url, "labels": {"cluster": "c1", "zone": "z"}},
        {"name": "b", "url": other.url},
    ]}, clock=clock)
    await exp.round()
    start = await exp.client.post("/api/v1/windows", json={"id": "w1"})
    assert start.status == 201
    fake.server.add(0, 10, 30, [9, 6, 3])
    fake.server.add(1, 10, 30, [8, 4, 0])
    other.server.add(0, 5, 10, [5, 2])
    clock.now += 10
    await exp.round()
    clock.now += 10
    stop = await exp.client.post("/api/v1/windows/w1/stop")
    assert stop.status == 200
    return exp, fake, other


class TestContractMetrics:
    async def test_every_metric_with_type_and_labels(self, fake_vllm, exporter):
        exp, _, _ = await _with_window(fake_vllm, exporter, Clock())
        families = await _families(exp)
        for family, sample, kind, labels in CONTRACT:
            assert family in families, family
            assert families[family].type == kind, family
            samples = [s for s in families[family].samples if s.name == sample]
            assert samples, f"{sample} has no samples"
            for s in samples:
                extra = {"cluster", "zone"} if s.labels.get("target") == "a" else set()
                assert set(s.labels) == labels | extra, (sample, s.labels)

    async def test_target_labels_added_to_every_per_target_series(self, fake_vllm, exporter):
        exp, _, _ = await _with_window(fake_vllm, exporter, Clock())
        families = await _families(exp)
        for name, family in families.items():
            for s in family.samples:
                if s.labels.get("target") == "a":
                    assert s.labels["cluster"] == "c1" and s.labels["zone"] == "z", name
                elif s.labels.get("target") == "b":
                    assert "cluster" not in s.labels, name
        for family in PER_TARGET:
            samples = _samples(families, family, CONTRACT_SAMPLE[family])
            targets = {dict(k)["target"] for k in samples}
            assert targets == {"a", "b"}, family

    async def test_names_and_ratio_ranges(self, fake_vllm, exporter):
        exp, _, _ = await _with_window(fake_vllm, exporter, Clock())
        families = await _families(exp)
        ours = [f for name, f in families.items() if name.startswith("specdec_")]
        assert ours
        for family in ours:
            assert ":" not in family.name
            if family.type != "counter":
                assert not family.name.endswith("_total")
            if family.name.endswith("_ratio"):
                assert all(0.0 <= s.value <= 1.0 for s in family.samples), family.name

    async def test_counters_summed_over_engines_per_model(self, fake_vllm, exporter):
        exp, fake, _ = await _with_window(fake_vllm, exporter, Clock())
        families = await _families(exp)
        labels = {"target": "a", "cluster": "c1", "zone": "z", "model_name": fake.server.model_name}
        assert _value(families, "specdec_drafts", labels, "specdec_drafts_total") == 20
        assert _value(families, "specdec_draft_tokens", labels, "specdec_draft_tokens_total") == 60
        assert _value(families, "specdec_accepted_tokens", labels,
                      "specdec_accepted_tokens_total") == 30
        per_pos = {
            dict(k)["position"]: v for k, v in _samples(
                families, "specdec_accepted_tokens_per_position",
                "specdec_accepted_tokens_per_position_total",
            ).items() if dict(k)["target"] == "a"
        }
        assert per_pos == {"0": 17, "1": 10, "2": 3}

    async def test_down_target_has_no_counters(self, exporter, unused_tcp_port):
        exp = await exporter({"targets": [
            {"name": "down", "url": f"http://127.0.0.1:{unused_tcp_port}/metrics"}
        ]})
        await exp.round()
        families = await _families(exp)
        assert _value(families, "specdec_target_up", {"target": "down"}) == 0
        assert _value(families, "specdec_scrape_errors", {"target": "down"},
                      "specdec_scrape_errors_total") == 1
        assert _samples(families, "specdec_drafts", "specdec_drafts_total") == {}
        assert _samples(families, "specdec_acceptance_ratio") == {}

    async def test_per_engine_tokens_only_for_servers_with_several(self, exporter, fake_vllm):
        two, one = await fake_vllm(k=2, engines=2), await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "dp2", "url": two.url},
                                          {"name": "single", "url": one.url}]})
        two.server.add(0, 10, 20, [8, 4])
        two.server.add(1, 10, 20, [2, 1])
        one.server.add(0, 10, 20, [8, 4])
        await exp.round()
        families = await _families(exp)
        tokens = _samples(families, "specdec_engine_draft_tokens",
                          "specdec_engine_draft_tokens_total")
        accepted = _samples(families, "specdec_engine_accepted_tokens",
                            "specdec_engine_accepted_tokens_total")
        by_engine = {dict(k)["engine"]: v for k, v in accepted.items()}
        assert {dict(k)["target"] for k in tokens} == {"dp2"}
        assert by_engine["0"] - by_engine["1"] == 12 - 3  # engine 0 accepted 9 more
        assert sum(v for v in tokens.values()) == _value(
            families, "specdec_draft_tokens", {"target": "dp2", "model_name":
                                               two.server.model_name},
            "specdec_draft_tokens_total")

    async def test_last_scrape_time_and_interval(self, exporter, fake_vllm, unused_tcp_port):
        """What SpecDecTargetNotScraped compares: last scrape time (good or failed), interval."""
        clock = Clock(1234.5)
        fake = await fake_vllm()
        exp = await exporter({"scrape_interval": "7s", "scrape_timeout": "1s", "targets": [
            {"name": "a", "url": fake.url},
            {"name": "down", "url": f"http://127.0.0.1:{unused_tcp_port}/metrics"}]},
            clock=clock)
        families = await _families(exp)
        assert _samples(families, "specdec_target_last_scrape_timestamp_seconds") == {}
        assert _value(families, "specdec_scrape_interval_seconds", {}) == 7
        await exp.round()
        clock.now = 2000.0
        families = await _families(exp)
        for target in ("a", "down"):
            assert _value(families, "specdec_target_last_scrape_timestamp_seconds",
                          {"target": target}) == 1234.5

    async def test_before_first_round(self, exporter, fake_vllm):
        fake = await fake_vllm()
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        families = await _families(exp)
        assert _value(families, "specdec_target_up", {"target": "a"}) == 0
        assert _samples(families, "specdec_scrape_duration_seconds") == {}
        assert _value(families, "specdec_windows_open", {}) == 0


class TestLiveGauges:
    async def test_ratios_over_live_window_by_hand(self, fake_vllm, exporter):
        clock = Clock(5000.0)
        fake = await fake_vllm(k=3)
        fake.server.add(0, 1000, 3000, [900, 800, 700])  # history before we started
        exp = await exporter({"live_window": "30s", "scrape_interval": "10s",
                              "targets": [{"name": "a", "url": fake.url}]}, clock=clock)
        await exp.round()  # t=5000
        steps = [
            (10, (10, 30, [9, 6, 3])),   # t=5010
            (10, (20, 60, [18, 10, 2])),  # t=5020
            (10, (5, 15, [5, 5, 5])),    # t=5030
            (10, (40, 120, [20, 10, 0])),  # t=5040
        ]
        for dt, (drafts, tokens, per_pos) in steps:
            clock.now += dt
            fake.server.add(0, drafts, tokens, per_pos)
            await exp.round()
        # now = 5040, live_window 30s: the increase from the scrape at 5010 to the one at 5040.
        drafts = 20 + 5 + 40
        tokens = 60 + 15 + 120
        per_pos = [18 + 5 + 20, 10 + 5 + 10, 2 + 5 + 0]
        accepted = sum(per_pos)
        families = await _families(exp)
        labels = {"target": "a"}
        assert _value(families, "specdec_acceptance_ratio", labels) == pytest.approx(
            accepted / tokens)
        assert _value(families, "specdec_acceptance_length", labels) == pytest.approx(
            1 + accepted / drafts)
        positions = {
            dict(k)["position"]: v
            for k, v in _samples(families, "specdec_position_acceptance_ratio").items()
        }
        assert positions == pytest.approx({str(i): per_pos[i] / drafts for i in range(3)})

        # Five seconds later, no new scrape: the span start moves to the scrape at 5010 still.
        clock.now = 5045
        families = await _families(exp)
        assert _value(families, "specdec_acceptance_ratio", labels) == pytest.approx(
            accepted / tokens)

    async def test_span_start_moves_with_the_clock(self, fake_vllm, exporter):
        clock = Clock(100.0)
        fake = await fake_vllm(k=1)
        exp = await exporter({"live_window": "20s", "scrape_interval": "10s",
                              "targets": [{"name": "a", "url": fake.url}]}, clock=clock)
        await exp.round()  # t=100
        clock.now = 110
        fake.server.add(0, 10, 10, [10])  # ratio 1.0
        await exp.round()
        clock.now = 120
        fake.server.add(0, 10, 10, [0])  # ratio 0.0
        await exp.round()
        clock.now = 130
        fake.server.add(0, 10, 10, [5])
        await exp.round()
        families = await _families(exp)  # span 110..130: 5 accepted of 20
        assert _value(families, "specdec_acceptance_ratio", {"target": "a"}) == 0.25
        clock.now = 140
        await exp.round()  # span 120..140: 5 of 10
        families = await _families(exp)
        assert _value(families, "specdec_acceptance_ratio", {"target": "a"}) == 0.5

    async def test_absent_not_zero_without_drafts(self, fake_vllm, exporter):
        clock = Clock()
        fake = await fake_vllm(k=2)
        fake.server.add(0, 50, 100, [40, 20])  # before we started: outside every span
        exp = await exporter({"live_window": "60s",
                              "targets": [{"name": "idle", "url": fake.url}]}, clock=clock)
        for _ in range(4):
            await exp.round()
            clock.now += 10
        families = await _families(exp)
        assert _value(families, "specdec_target_up", {"target": "idle"}) == 1
        for family in ("specdec_acceptance_ratio", "specdec_acceptance_length",
                       "specdec_position_acceptance_ratio"):
            assert _samples(families, family) == {}, family
        targets = (await (await exp.client.get("/api/v1/targets")).json())["targets"]
        assert targets[0]["live"] is None

    async def test_absent_with_one_scrape(self, fake_vllm, exporter):
        fake = await fake_vllm(k=2)
        fake.server.add(0, 50, 100, [40, 20])
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]}, clock=Clock())
        await exp.round()
        assert _samples(await _families(exp), "specdec_acceptance_ratio") == {}

    async def test_absent_once_the_last_scrape_is_older_than_the_span(self, fake_vllm, exporter):
        clock = Clock()
        fake = await fake_vllm(k=1)
        exp = await exporter({"live_window": "30s",
                              "targets": [{"name": "a", "url": fake.url}]}, clock=clock)
        await exp.round()
        clock.now += 10
        fake.server.add(0, 10, 10, [7])
        await exp.round()
        assert _value(await _families(exp), "specdec_acceptance_ratio", {"target": "a"}) == 0.7
        await fake.stop()
        clock.now += 60
        await exp.round()
        families = await _families(exp)
        assert _value(families, "specdec_target_up", {"target": "a"}) == 0
        assert _samples(families, "specdec_acceptance_ratio") == {}

    async def test_server_without_spec_decode(self, fake_vllm, exporter):
        clock = Clock()
        fake = await fake_vllm(spec_decode=False)
        exp = await exporter({"targets": [{"name": "plain", "url": fake.url}]}, clock=clock)
        await exp.round()
        clock.now += 5
        await exp.round()
        families = await _families(exp)
        assert _value(families, "specdec_target_up", {"target": "plain"}) == 1
        assert _value(families, "specdec_target_spec_decode_present", {"target": "plain"}) == 0
        assert _samples(families, "specdec_drafts", "specdec_drafts_total") == {}
        assert _samples(families, "specdec_acceptance_ratio") == {}


class TestLastWindowGauges:
    async def test_after_a_window(self, fake_vllm, exporter):
        exp, _, _ = await _with_window(fake_vllm, exporter, Clock())
        families = await _families(exp)
        a = {"target": "a", "cluster": "c1", "zone": "z"}
        b = {"target": "b"}
        assert _value(families, "specdec_last_window_acceptance_ratio", a) == 30 / 60
        assert _value(families, "specdec_last_window_acceptance_length", a) == 1 + 30 / 20
        assert _value(families, "specdec_last_window_acceptance_ratio", b) == 7 / 10
        assert _value(families, "specdec_last_window_acceptance_length", b) == 1 + 7 / 5
        positions = {
            (dict(k)["target"], dict(k)["position"]): v for k, v in
            _samples(families, "specdec_last_window_position_acceptance_ratio").items()
        }
        assert positions == {("a", "0"): 17 / 20, ("a", "1"): 10 / 20, ("a", "2"): 3 / 20,
                             ("b", "0"): 5 / 5, ("b", "1"): 2 / 5}
        info = _samples(families, "specdec_last_window_info")
        assert list(info) == [frozenset({"id": "w1", "name": "w1"}.items())]

    async def test_absent_before_any_window(self, fake_vllm, exporter):
        fake = await fake_vllm()
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        await exp.round()
        families = await _families(exp)
        for family in ("specdec_last_window_acceptance_ratio",
                       "specdec_last_window_acceptance_length",
                       "specdec_last_window_position_acceptance_ratio"):
            assert _samples(families, family) == {}

    async def test_na_target_absent(self, fake_vllm, exporter):
        fake = await fake_vllm(k=2)
        idle = await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "a", "url": fake.url},
                                          {"name": "idle", "url": idle.url}]})
        await exp.client.post("/api/v1/windows", json={"id": "w"})
        fake.server.add(0, 4, 8, [4, 2])
        assert (await exp.client.post("/api/v1/windows/w/stop")).status == 200
        families = await _families(exp)
        ratios = _samples(families, "specdec_last_window_acceptance_ratio")
        assert ratios == {frozenset({"target": "a"}.items()): 0.75}


class TestWindowsOpen:
    async def test_counts_open_windows(self, fake_vllm, exporter):
        fake = await fake_vllm()
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        for window_id in ("w1", "w2"):
            assert (await exp.client.post("/api/v1/windows", json={"id": window_id})).status == 201
        assert _value(await _families(exp), "specdec_windows_open", {}) == 2
        await exp.client.post("/api/v1/windows/w1/stop")
        assert _value(await _families(exp), "specdec_windows_open", {}) == 1


class TestReloadStatus:
    async def test_refused_reload_sets_zero_then_good_one_sets_one(self, exporter, tmp_path):
        path = tmp_path / "exporter.yaml"
        path.write_text("targets: []\n")
        clock = Clock(777.0)
        exp = await exporter({"targets": []}, config_path=path, clock=clock)
        families = await _families(exp)
        assert _value(families, "specdec_config_last_reload_successful", {}) == 1
        assert _value(families, "specdec_config_last_reload_success_timestamp_seconds", {}) == 777
        path.write_text("targets: [{ulr: x}]\n")
        clock.now = 800.0
        assert (await exp.client.post("/-/reload")).status == 400
        families = await _families(exp)
        assert _value(families, "specdec_config_last_reload_successful", {}) == 0
        assert _value(families, "specdec_config_last_reload_success_timestamp_seconds", {}) == 777
        # A good file names a target: one with none is refused on reload (editors truncate).
        path.write_text("scrape_interval: 10s\ntargets: [{url: 'http://127.0.0.1:9/metrics'}]\n")
        clock.now = 900.0
        assert (await exp.client.post("/-/reload")).status == 200
        families = await _families(exp)
        assert _value(families, "specdec_config_last_reload_successful", {}) == 1
        assert _value(families, "specdec_config_last_reload_success_timestamp_seconds", {}) == 900


# The exposition's HELP/TYPE lines of our families, in order: a change here is a change to users.
GOLDEN_TYPES = [
    "# TYPE specdec_build_info gauge",
    "# TYPE specdec_target_up gauge",
    "# TYPE specdec_scrape_duration_seconds gauge",
    "# TYPE specdec_target_last_scrape_timestamp_seconds gauge",
    "# TYPE specdec_scrape_errors_total counter",
    "# TYPE specdec_target_spec_decode_present gauge",
    "# TYPE specdec_target_read_filtered gauge",
    "# TYPE specdec_drafts_total counter",
    "# TYPE specdec_draft_tokens_total counter",
    "# TYPE specdec_accepted_tokens_total counter",
    "# TYPE specdec_accepted_tokens_per_position_total counter",
    "# TYPE specdec_engine_draft_tokens_total counter",
    "# TYPE specdec_engine_accepted_tokens_total counter",
    "# TYPE specdec_acceptance_ratio gauge",
    "# TYPE specdec_acceptance_length gauge",
    "# TYPE specdec_position_acceptance_ratio gauge",
    "# TYPE specdec_acceptance_ratio_by_load gauge",
    "# TYPE specdec_acceptance_length_by_load gauge",
    "# TYPE specdec_last_window_acceptance_ratio gauge",
    "# TYPE specdec_last_window_acceptance_length gauge",
    "# TYPE specdec_last_window_position_acceptance_ratio gauge",
    "# TYPE specdec_last_window_info gauge",
    "# TYPE specdec_windows_open gauge",
    "# TYPE specdec_config_last_reload_successful gauge",
    "# TYPE specdec_config_last_reload_success_timestamp_seconds gauge",
    "# TYPE specdec_scrape_interval_seconds gauge",
    "# TYPE specdec_state_write_errors_total counter",
    "# TYPE specdec_result_write_errors_total counter",
]

GOLDEN_HELP = {
    "specdec_target_up": "1 if the last scrape of the target succeeded.",
    "specdec_scrape_duration_seconds": "How long the last scrape of the target took.",
    "specdec_scrape_errors_total": "Failed scrapes of the target since we started.",
    "specdec_windows_open": "Benchmark windows open now.",
    "specdec_config_last_reload_successful":
        "1 if the last config (re)load succeeded, 0 if it was refused.",
}


class TestExposition:
    async def test_golden_type_lines(self, fake_vllm, exporter):
        exp, _, _ = await _with_window(fake_vllm, exporter, Clock())
        text = await _metrics_text(exp)
        types = [line for line in text.splitlines() if line.startswith("# TYPE specdec_")]
        assert types == GOLDEN_TYPES

    async def test_help_lines(self, fake_vllm, exporter):
        exp, _, _ = await _with_window(fake_vllm, exporter, Clock())
        text = await _metrics_text(exp)
        helps = {
            line.split(" ", 3)[2]: line.split(" ", 3)[3]
            for line in text.splitlines() if line.startswith("# HELP specdec_")
        }
        assert set(helps) == {line.split()[2] for line in GOLDEN_TYPES}
        for name, doc in GOLDEN_HELP.items():
            assert helps[name] == doc
        for name in ("specdec_acceptance_ratio", "specdec_acceptance_length",
                     "specdec_position_acceptance_ratio"):
            # Live gauges come from background scrapes, and their HELP says so.
            assert "background scrapes" in helps[name] and "live_window" in helps[name]
        assert all(doc.strip() for doc in helps.values())

    async def test_also_process_metrics(self, exporter):
        exp = await exporter({"targets": []})
        text = await _metrics_text(exp)
        assert "\n# TYPE process_cpu_seconds_total counter" in text
        assert "python_gc_objects_collected_total" in text

    @pytest.mark.e2e
    async def test_promtool_check_metrics(self, fake_vllm, exporter, promtool):
        exp, _, _ = await _with_window(fake_vllm, exporter, Clock())
        text = await _metrics_text(exp)
        done = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                              capture_output=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == b"" and done.stderr == b""

    @pytest.mark.e2e
    async def test_promtool_check_metrics_with_failures(self, exporter, promtool, unused_tcp_port):
        exp = await exporter({"targets": [
            {"name": "down", "url": f"http://127.0.0.1:{unused_tcp_port}/metrics"}
        ]})
        await exp.round()
        done = subprocess.run([promtool, "check", "metrics"],
                              input=(await _metrics_text(exp)).encode(),
                              capture_output=True, timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


class TestMetricsWriterUnit:
    def test_render_needs_no_loop_and_no_scraper(self, tmp_path):
        config = validate_config({"output_dir": str(tmp_path), "targets": [
            {"name": "a", "url": "http://127.0.0.1:9/metrics", "labels": {"cluster": "x"}}]})
        service = ExporterService(config, clock=lambda: 42.0)
        try:
            text = MetricsWriter(service.view, process_metrics=False).render().decode()
        finally:
            service.book.close()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        up = families["specdec_target_up"].samples
        assert [(s.labels, s.value) for s in up] == [({"target": "a", "cluster": "x"}, 0.0)]
        assert families["specdec_acceptance_ratio"].samples == []

    def test_odd_label_values_round_trip(self, tmp_path):
        odd = 'q"uote \\back\nslash {} é'
        config = validate_config({"output_dir": str(tmp_path), "targets": [
            {"name": "a", "url": "http://127.0.0.1:9/metrics", "labels": {"zone": odd}}]})
        service = ExporterService(config)
        try:
            text = MetricsWriter(service.view, process_metrics=False).render().decode()
        finally:
            service.book.close()
        up = {f.name: f for f in text_string_to_metric_families(text)}["specdec_target_up"]
        assert up.samples[0].labels == {"target": "a", "zone": odd}

    async def test_new_scrape_state_is_rendered_not_a_stale_cache(self, exporter,
                                                                  unused_tcp_port):
        exp = await exporter({"targets": [
            {"name": "a", "url": f"http://127.0.0.1:{unused_tcp_port}/metrics"}]})
        writer = MetricsWriter(exp.service.view, process_metrics=False)
        assert b'specdec_scrape_errors_total{target="a"} 0.0' in writer.render()
        await exp.round()  # refused: one more scrape error
        assert b'specdec_scrape_errors_total{target="a"} 1.0' in writer.render()
        await exp.round()
        assert b'specdec_scrape_errors_total{target="a"} 2.0' in writer.render()


class TestMetricsWriterCache:
    """The per-target lines a writer keeps: always what a fresh writer would render."""

    @staticmethod
    def _fresh(exp) -> bytes:
        return MetricsWriter(exp.service.view, process_metrics=False).render()

    async def test_equals_a_fresh_render_through_scrapes_reloads_and_stops(
            self, fake_vllm, exporter, tmp_path):
        clock = Clock(5000.0)
        a, b, c = await fake_vllm(k=3, engines=2), await fake_vllm(k=2), await fake_vllm(k=4)
        path = tmp_path / "exporter.yaml"

        def configure(targets: list[dict]) -> dict:
            config = {"output_dir": str(tmp_path / "out"), "live_window": "30s",
                      "targets": targets}
            path.write_text(json.dumps(config))
            return config

        exp = await exporter(configure([
            {"name": "a", "url": a.url, "labels": {"zone": "z1"}}, {"name": "b", "url": b.url}]),
            config_path=path, clock=clock)
        cached = MetricsWriter(exp.service.view, process_metrics=False)
        renders = []

        async def step(prepare: bool = False) -> None:
            if prepare:  # built ahead, a target per chunk, then rendered
                for _ in cached.prepare(1):
                    pass
            text = cached.render()
            assert text == self._fresh(exp)
            renders.append(text)

        await step()  # nothing scraped yet
        await exp.round()
        await step()
        for i in range(3):
            clock.now += 10
            a.server.add(0, 10 + i, 30, [9, 6, i])
            a.server.add(1, 10, 30, [8, 4, 0])
            b.server.add(0, 5, 10, [5, i])
            await exp.round()
            await step(prepare=i % 2 == 1)
        await exp.start(id="w1")
        clock.now += 10
        a.server.add(0, 10, 30, [9, 6, 3])
        await exp.round()
        await step()
        await exp.stop("w1")
        await step()  # the last window's gauges
        # A reload: a's labels change, b leaves, c comes.
        configure([{"name": "a", "url": a.url, "labels": {"zone": "z2"}},
                   {"name": "c", "url": c.url}])
        assert (await exp.client.post("/-/reload")).status == 200
        await step(prepare=True)
        assert b'zone="z1"' not in renders[-1] and b'target="b"' not in renders[-1]
        clock.now += 10
        c.server.add(0, 4, 16, [4, 3, 2, 1])
        await exp.round()
        await step()
        await b.stop()
        await a.stop()  # down: its counters leave, its errors count
        clock.now += 10
        await exp.round()
        await step(prepare=True)
        clock.now += 100  # every live span is older than live_window now
        await step()
        assert b"specdec_acceptance_ratio{" not in renders[-1]
        assert len(set(renders)) == len(renders)  # each step changed what was rendered

    async def test_openmetrics_is_the_text_converted(self, fake_vllm, exporter):
        exp, _, _ = await _with_window(fake_vllm, exporter, Clock())
        writer = MetricsWriter(exp.service.view, process_metrics=False)
        text = writer.render()
        assert b"# TYPE specdec_drafts_total counter" in text
        # Every family named `_total` is a counter: OpenMetrics names those without it.
        assert set(re.findall(rb"# TYPE \w+_total (\w+)", text)) == {b"counter"}
        converted = re.sub(rb"(?m)^(# (?:HELP|TYPE) \w+)_total ", rb"\1 ", text) + b"# EOF\n"
        assert writer.render(openmetrics=True) == converted

    async def test_a_scrape_rebuilds_exactly_that_targets_lines(self, fake_vllm, exporter):
        clock = Clock(5000.0)
        a, b = await fake_vllm(k=2), await fake_vllm(k=2)
        exp = await exporter({"live_window": "60s", "targets": [
            {"name": "a", "url": a.url}, {"name": "b", "url": b.url}]}, clock=clock)
        await exp.round()
        writer = MetricsWriter(exp.service.view, process_metrics=False)
        before = writer.render()
        assert list(writer.prepare(1)) == []  # nothing changed since the render
        clock.now += 10
        a.server.add(0, 10, 20, [8, 4])
        await exp.service.scrape_target("a")
        assert list(writer.prepare(1)) == [1]  # a's lines, not b's
        assert list(writer.prepare(1)) == []
        after = writer.render()
        assert after == self._fresh(exp)
        lines = set(after.splitlines()) - set(before.splitlines())
        assert lines and all(b'target="a"' in line for line in lines)

    async def test_a_failing_scrape_listener_fails_no_scrape(self, fake_vllm, exporter, caplog):
        a = await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "a", "url": a.url}]})

        def broken(*_args) -> None:
            raise RuntimeError("listener bug")

        exp.service.on_scraped(broken)
        result = await exp.service.scrape_target("a")
        assert result.ok
        assert exp.service.view().targets["a"].last is result
        assert any(r.getMessage() == "scrape listener failed target=a" and r.exc_info
                   for r in caplog.records)
        assert (await exp.client.get("/metrics")).status == 200


class TestSampleText:
    """The numbers and label values of per-target blocks, written a run of samples at a time."""

    async def test_percent_in_label_values_round_trips(self, fake_vllm, exporter):
        odd = "50%s %d %% %(x)r"
        a = await fake_vllm(k=3)
        exp = await exporter({"live_window": "60s", "targets": [
            {"name": "a%", "url": a.url, "labels": {"zone": odd}}]})
        await exp.round()
        a.server.add(0, 10, 30, [9, 6, 3])
        await exp.round()
        families = await _families(exp)
        want = {"target": "a%", "zone": odd}
        for family, name, positions in (
                ("specdec_accepted_tokens_per_position", None, [9.0, 6.0, 3.0]),
                ("specdec_position_acceptance_ratio", None, [0.9, 0.6, 0.3])):
            samples = _samples(families, family, name or
                               CONTRACT_SAMPLE.get(family, family))
            got = {dict(k)["position"]: v for k, v in samples.items()
                   if {n: dict(k)[n] for n in want} == want}
            assert got == {str(i): v for i, v in enumerate(positions)}, family

    async def test_sums_past_the_largest_float_are_infinite(self, aiohttp_server, exporter):
        """Two engines' finite counters can sum past 1.8e308: written as +Inf, as before."""
        series = "".join(
            f'vllm:spec_decode_num_{name}_total{{engine="{e}",model_name="m"}} {value}\n'
            for name, value in (("drafts", 1), ("draft_tokens", 9e307), ("accepted_tokens", 1))
            for e in (0, 1))
        series += "".join(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",model_name="m",'
            f'position="{pos}"}} {value}\n' for pos, value in ((0, 9e307), (1, 1)) for e in (0, 1))

        async def page(_request: web.Request) -> web.Response:
            return web.Response(text=series, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", page)
        server = await aiohttp_server(app)
        odd = "50%r %s%"  # what a `%` format would read as its own
        exp = await exporter({"targets": [
            {"name": "a", "url": str(server.make_url("/metrics")), "labels": {"zone": odd}}]})
        await exp.round()
        text = await _metrics_text(exp)
        lines = text.splitlines()
        for family, want in (("specdec_accepted_tokens_per_position_total", ["+Inf", "2.0"]),
                             ("specdec_draft_tokens_total", ["+Inf"]),
                             ("specdec_drafts_total", ["2.0"])):
            assert [line.rsplit(" ", 1)[1] for line in lines
                    if line.startswith(family + "{")] == want, family
        per_pos = _samples({f.name: f for f in text_string_to_metric_families(text)},
                           "specdec_accepted_tokens_per_position",
                           "specdec_accepted_tokens_per_position_total")
        assert {dict(k)["zone"] for k in per_pos} == {odd}


class TestLoadGauges:
    """Live acceptance by the target's running-requests band, over live_window."""

    async def test_ratio_and_length_per_band_over_the_span(self, fake_vllm, exporter):
        clock = Clock()
        fake = await fake_vllm(k=3)
        exp = await exporter({"live_window": "60s", "targets": [
            {"name": "a", "url": fake.url, "labels": {"cluster": "c1"}}]}, clock=clock)
        await exp.round()
        for background, per_pos in ((3, [9, 6, 3]), (8, [5, 2, 0]), (8, None)):
            fake.server.background = background
            if per_pos:
                fake.server.add(0, 10, 30, per_pos)
            clock.now += 10
            await exp.round()
        families = await _families(exp)
        a = {"target": "a", "cluster": "c1"}

        def at(band: str) -> frozenset:
            return frozenset((a | {"band": band}).items())

        # 0 -> 3 running: mean 1.5, band 2-3; 3 -> 8: band 4-7; 8 -> 8 without drafts: absent.
        assert _samples(families, "specdec_acceptance_ratio_by_load") == {
            at("2-3"): 18 / 30, at("4-7"): 7 / 30}
        assert _samples(families, "specdec_acceptance_length_by_load") == {
            at("2-3"): 1 + 18 / 10, at("4-7"): 1 + 7 / 10}
        # Once the first interval is out of the span, its band is too.
        clock.now += 45
        await exp.round()
        families = await _families(exp)
        assert _samples(families, "specdec_acceptance_ratio_by_load") == {at("4-7"): 7 / 30}

    async def test_absent_for_a_server_without_counters(self, fake_vllm, exporter):
        clock = Clock()
        fake = await fake_vllm(k=3, dialect="sglang")
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]}, clock=clock)
        for _ in range(3):
            fake.server.simulate(20)
            clock.now += 5
            await exp.round()
        text = await _metrics_text(exp)
        assert "specdec_acceptance_ratio_by_load{" not in text
