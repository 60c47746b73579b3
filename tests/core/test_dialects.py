"""Each dialect: fixture pages vs prometheus_client's parser, detection, a window end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.config.model import validate_config
from exporter.core.console import format_window
from exporter.core.counting import Accumulator
from exporter.core.dialects import Dialect, dialect_note
from exporter.core.parse import detect_dialect, parse_page
from exporter.core.snapshot import Field, SeriesKey, Snapshot
from exporter.fakevllm import FakeServer

PAGES = Path(__file__).resolve().parents[1] / "testdata" / "pages"

# Written out here from each project's source, independently of exporter.core.parse's tables:
# sample name -> (field, kind); kind "first" reads only token_position 0.
NAMES = {
    "vllm-v0": {
        "vllm:spec_decode_num_accepted_tokens_total": (Field.ACCEPTED, "value"),
        "vllm:spec_decode_num_draft_tokens_total": (Field.DRAFT_TOKENS, "value"),
        "vllm:spec_decode_num_emitted_tokens_total": (Field.EMITTED, "value"),
        "vllm:spec_decode_num_accepted_tokens_created": (Field.ACCEPTED, "created"),
        "vllm:spec_decode_num_draft_tokens_created": (Field.DRAFT_TOKENS, "created"),
        "vllm:spec_decode_num_emitted_tokens_created": (Field.EMITTED, "created"),
        "vllm:spec_decode_draft_acceptance_rate": (None, "gauge"),
        "vllm:spec_decode_efficiency": (None, "gauge"),
    },
    "llamacpp": {
        "llamacpp:spec_decode_num_drafts_total": (Field.DRAFTS, "value"),
        "llamacpp:spec_decode_num_draft_tokens_total": (Field.DRAFT_TOKENS, "value"),
        "llamacpp:spec_decode_num_accepted_tokens_total": (Field.ACCEPTED, "value"),
        "llamacpp:spec_decode_num_accepted_tokens_per_pos_total": (Field.PER_POS, "value"),
    },
    "sglang": {
        "sglang:spec_accept_length": (None, "gauge"),
        "sglang:spec_accept_rate": (None, "gauge"),
    },
    "trtllm": {
        "trtllm_spec_decode_num_draft_tokens_total": (Field.DRAFT_TOKENS, "value"),
        "trtllm_spec_decode_num_accepted_tokens_total": (Field.ACCEPTED, "value"),
        "trtllm_spec_decode_accepted_tokens_total": (Field.PER_POS, "value"),
        "trtllm_spec_decode_drafted_tokens_total": (Field.DRAFTS, "first"),
        "trtllm_spec_decode_acceptance_length": (None, "gauge"),
    },
}
POSITION_LABEL = {"trtllm": "token_position"}

FIXTURES = [
    ("vllm-v0-0.6-engine-metrics-rendered.txt", Dialect.VLLM, "vllm-v0"),
    ("llamacpp-server-task-to_metrics.txt", Dialect.LLAMACPP, "llamacpp"),
    ("sglang-collector-dp3-rendered.txt", Dialect.SGLANG, "sglang"),
    ("trtllm-collector-prometheus-rendered.txt", Dialect.TRTLLM, "trtllm"),
]


def reference(text: str, name: str) -> Snapshot:
    """What parse_page must find, from prometheus_client's samples and the table above."""
    table, position_label = NAMES[name], POSITION_LABEL.get(name, "position")
    values: dict[SeriesKey, float] = {}
    created: dict[SeriesKey, float] = {}
    gauge_series: dict[tuple, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in table:
                continue
            fld, kind = table[sample.name]
            labels = dict(sample.labels)
            if kind == "gauge":
                gauge_series[(sample.name, tuple(sorted(labels.items())))] = sample.value
                continue
            position = -1
            if fld is Field.PER_POS or kind == "first":
                text_pos = labels.pop(position_label)
                if kind == "first" and text_pos != "0":
                    continue
                position = int(text_pos) if kind != "first" else -1
            model, engine = labels.pop("model_name", ""), labels.pop("engine", "")
            key = SeriesKey(fld, model, engine, position, tuple(sorted(labels.items())))
            (created if kind == "created" else values)[key] = sample.value
    if name == "sglang":  # ranks whose length gauge is still 0 have measured nothing
        live = {
            labels for (n, labels), v in gauge_series.items()
            if n == "sglang:spec_accept_length" and v > 0
        }
        gauge_series = {k: v for k, v in gauge_series.items() if k[1] in live}
    by_name: dict[str, list[float]] = {}
    for (gauge, _), value in gauge_series.items():
        by_name.setdefault(gauge, []).append(value)
    gauges = {g: sum(vs) / len(vs) for g, vs in by_name.items()}
    return Snapshot(values, created, gauges, name)


class TestFixturePages:
    @pytest.mark.parametrize(("page", "dialect", "name"), FIXTURES)
    @pytest.mark.parametrize("how", ["named", "auto"])
    def test_matches_reference(self, page, dialect, name, how):
        data = (PAGES / page).read_bytes()
        ours = parse_page(data, dialect if how == "named" else Dialect.AUTO)
        ref = reference(data.decode(), name)
        assert ours.values == ref.values
        assert ours.created == ref.created
        assert ours.gauges == pytest.approx(ref.gauges)
        assert ours.dialect == name
        assert ours.duplicates == 0

    def test_llamacpp_numbers(self):
        snap = parse_page((PAGES / FIXTURES[1][0]).read_bytes(), Dialect.LLAMACPP)
        totals = snap.totals()
        # C++ prints the big counters with 6 significant digits: what we read is what it says.
        assert (totals.drafts, totals.draft_tokens, totals.accepted) == (412277, 2064630, 964833)
        assert list(totals.per_position) == [0, 1, 2, 3, 4]
        assert sum(totals.per_position.values()) == 964833
        assert snap.model_names == [""] and snap.engines == 1 and not snap.created

    def test_sglang_gauges_average_live_ranks_only(self):
        snap = parse_page((PAGES / FIXTURES[2][0]).read_bytes(), Dialect.SGLANG)
        assert not snap.values
        assert snap.gauges == pytest.approx(
            {"sglang:spec_accept_length": 3.0, "sglang:spec_accept_rate": 0.5}
        )
        assert snap.has_spec_decode

    def test_sglang_without_spec_decode(self):
        page = (PAGES / "sglang-collector-no-spec-rendered.txt").read_bytes()
        for dialect in (Dialect.SGLANG, Dialect.AUTO):
            snap = parse_page(page, dialect)
            assert not snap.has_spec_decode and snap.gauges == {}

    def test_trtllm_drafts_from_position_zero(self):
        snap = parse_page((PAGES / FIXTURES[3][0]).read_bytes(), Dialect.TRTLLM)
        totals = snap.totals()
        assert (totals.drafts, totals.draft_tokens, totals.accepted) == (3000, 9000, 5710)
        assert dict(totals.per_position) == {0: 2520, 1: 1980, 2: 1210}
        assert snap.model_names == ["nvidia/Llama-3.1-8B-Instruct-FP8"]
        assert snap.gauges == {"trtllm_spec_decode_acceptance_length": 2.875}

    def test_trtllm_without_per_request_metrics_has_no_drafts(self):
        page = b"".join(
            line + b"\n"
            for line in (PAGES / FIXTURES[3][0]).read_bytes().splitlines()
            if b"token_position" not in line
        )
        totals = parse_page(page, Dialect.TRTLLM).totals()
        assert (totals.drafts, totals.draft_tokens, totals.accepted) == (0, 9000, 5710)

    def test_v0_is_flagged_and_noted(self):
        snap = parse_page((PAGES / FIXTURES[0][0]).read_bytes())
        assert snap.dialect == "vllm-v0"
        assert "over-count" in dialect_note(snap.dialect)
        assert dialect_note("vllm") is None and dialect_note(None) is None
        assert "estimate" in dialect_note("sglang")


class TestDetection:
    @pytest.mark.parametrize(
        ("page", "want"),
        [
            ("vllm-0.8.5-rendered-k3.txt", Dialect.VLLM),
            ("vllm-0.33.0-rendered-k3.txt", Dialect.VLLM),
            *[(page, dialect) for page, dialect, _ in FIXTURES],
            ("sglang-collector-no-spec-rendered.txt", Dialect.SGLANG),
            ("sglang-0.4-docs-full-page.txt", None),
            ("vllm-v1-production-stack-issue318-fragments.txt", None),
        ],
    )
    def test_fixture_pages(self, page, want):
        found, line = detect_dialect((PAGES / page).read_bytes())
        assert found == want
        if want is None:
            assert not parse_page((PAGES / page).read_bytes(), Dialect.AUTO).has_spec_decode

    def test_auto_equals_named_on_fake_pages(self):
        for dialect in ("vllm", "vllm-v0", "llamacpp", "sglang", "trtllm"):
            server = FakeServer(dialect=dialect, k=3, engines=2, seed=1)
            server.simulate(200)
            page = server.render()
            named = "vllm" if dialect == "vllm-v0" else dialect
            assert parse_page(page, Dialect.AUTO) == parse_page(page, named)

    @pytest.mark.parametrize(
        ("page", "want"),
        [
            # The first family of the page is ours: detection at offset 0.
            (b'llamacpp:spec_decode_num_drafts_total 3\n', (Dialect.LLAMACPP, 0)),
            # `spec_` elsewhere (a label, another family) is not a dialect's name.
            (
                b'x{spec_decode="1"} 1\nmy_spec_total 2\n'
                b"trtllm_spec_decode_num_draft_tokens_total 4\n",
                (Dialect.TRTLLM, 37),
            ),
            (b"# HELP sglang:spec_accept_rate r\nsglang:spec_accept_rate 1\n", (Dialect.SGLANG, 0)),
            (b"xvllm:spec_decode_num_drafts_total 1\n", (None, -1)),
            (b"", (None, -1)),
        ],
    )
    def test_probe(self, page, want):
        assert detect_dialect(page) == want

    def test_auto_parses_from_the_detected_line(self):
        page = b"# HELP x\nx 1\n" * 1000 + b"trtllm_spec_decode_num_draft_tokens_total 7\n"
        snap = parse_page(page, Dialect.AUTO)
        assert snap.dialect == "trtllm" and snap.totals().draft_tokens == 7

    def test_default_dialect_is_auto_and_trtllm_path(self):
        config = validate_config({"targets": [
            {"host": "h", "port": 8000},
            {"host": "t", "port": 8000, "dialect": "trtllm"},
            {"host": "u", "port": 8000, "dialect": "trtllm", "path": "/metrics"},
            {"url": "http://v:8000/prometheus/metrics", "dialect": "trtllm"},
        ]})
        urls = [t.url for t in config.targets]
        assert config.targets[0].dialect is Dialect.AUTO
        assert urls == [
            "http://h:8000/metrics",
            "http://t:8000/prometheus/metrics",
            "http://u:8000/metrics",
            "http://v:8000/prometheus/metrics",
        ]
        assert config.targets[1].path == "/prometheus/metrics"


class TestGaugeAccounting:
    def test_time_weighted_mean(self):
        acc = Accumulator()
        gauges = [(100.0, 5.0), (110.0, 2.0), (140.0, 3.0), (150.0, None), (160.0, 1.0)]
        for at, value in gauges:
            snap_gauges = {} if value is None else {"g": value}
            acc.feed(Snapshot({}, {}, snap_gauges, "sglang"), at)
        # The baseline (5.0) weighs nothing; a value weighs the interval before its scrape.
        assert acc.gauge_means() == pytest.approx({"g": (2 * 10 + 3 * 30 + 1 * 10) / 50})
        assert acc.gauge_seconds == {"g": 50.0}
        assert acc.dialect == "sglang"

    def test_nan_and_repeated_time_skipped(self):
        acc = Accumulator()
        acc.feed(Snapshot({}, {}, {"g": 1.0}, "sglang"), 10.0)
        acc.feed(Snapshot({}, {}, {"g": math.nan}, "sglang"), 20.0)
        acc.feed(Snapshot({}, {}, {"g": 4.0}, "sglang"), 20.0)
        acc.feed(Snapshot({}, {}, {"g": 2.0}, "sglang"), 30.0)
        assert acc.gauge_means() == {"g": 2.0}

    def test_round_trip(self):
        import json

        acc = Accumulator()
        for at, value in ((1.0, 2.0), (3.0, 4.0), (7.0, 1.0)):
            acc.feed(Snapshot({}, {}, {"g": value}, "sglang"), at)
        again = Accumulator.from_dict(json.loads(acc.to_json()))
        assert again.gauge_means() == acc.gauge_means() == pytest.approx({"g": 2.0})


class TestWindowsPerDialect:
    async def test_llamacpp(self, fake_vllm, exporter):
        fake = await fake_vllm(dialect="llamacpp", k=3)
        fake.server.add(0, 50, 150, [40, 30, 20])
        exp = await exporter({"targets": [{"name": "l", "url": fake.url}]})
        await exp.start(id="wl")
        fake.server.add(0, 10, 30, [9, 6, 3])
        await exp.round()
        fake.server.add(0, 10, 28, [5, 2, 0])
        answer = await exp.stop("wl")
        result = answer["results"]["l"]
        assert result["status"] == "ok" and result["dialect"] == "llamacpp"
        assert result["data"]["num_drafts"] == 20 and result["data"]["draft_tokens"] == 58
        assert result["data"]["accepted_tokens"] == 25
        assert result["data"]["per_position_acceptance_rates"] == {"0": 0.7, "1": 0.4, "2": 0.15}

    @pytest.mark.parametrize("streamed", ["0", "1"])
    async def test_vllm_v0(self, fake_vllm, exporter, monkeypatch, streamed):
        # Fed the stop's scrapes as they come, the stop's child takes them in its own window;
        # forked after them, this window took them first.
        monkeypatch.setenv("SPECDEC_STOP_STREAMED", streamed)
        fake = await fake_vllm(dialect="vllm-v0", k=2)
        exp = await exporter({"targets": [{"name": "v0", "url": fake.url}]})
        await exp.start(id="w0")
        window = exp.service.book.get("w0")  # the stopped window keeps only its answer
        fake.server.add(0, 10, 20, [8, 4])
        if streamed == "1":
            await exp.round()  # this window's second scrape, the stop's being the child's
        answer = await exp.stop("w0")
        result = answer["results"]["v0"]
        assert result["dialect"] == "vllm-v0"
        assert result["data"]["draft_tokens"] == 20 and result["data"]["accepted_tokens"] == 12
        acc = window.accumulators["v0"]
        assert result["dialect_note"] == dialect_note(acc.dialect)
        assert result["dialect_note"].startswith("vLLM V0 counters over-count")
        assert set(acc.gauge_means()) == {
            "vllm:spec_decode_draft_acceptance_rate", "vllm:spec_decode_efficiency"
        }

    async def test_trtllm_by_host_and_port(self, fake_vllm, exporter):
        fake = await fake_vllm(dialect="trtllm", k=3)
        exp = await exporter({"targets": [
            {"name": "t", "host": fake.http.host, "port": fake.http.port, "dialect": "trtllm"}
        ]})
        await exp.start(id="wt")
        fake.server.add(0, 10, 30, [9, 6, 3])
        await exp.round()
        fake.server.add(0, 10, 25, [5, 2, 1])
        answer = await exp.stop("wt")
        result = answer["results"]["t"]
        assert result["url"].endswith("/prometheus/metrics")
        assert result["status"] == "ok" and result["dialect"] == "trtllm"
        assert result["data"]["num_drafts"] == 20 and result["data"]["draft_tokens"] == 55
        assert result["data"]["accepted_tokens"] == 26
        assert result["data"]["acceptance_length"] == round(1 + 26 / 20, 3)
        assert result["data"]["per_position_acceptance_rates"] == {"0": 0.7, "1": 0.4, "2": 0.2}

    async def test_trtllm_plain_metrics_is_not_prometheus(self, fake_vllm, exporter):
        fake = await fake_vllm(dialect="trtllm", k=3)
        exp = await exporter({"targets": [{"name": "t", "url": fake.url}]})  # .../metrics
        await exp.start(id="wj")
        answer = await exp.stop("wj")
        assert answer["results"]["t"]["status"] == "na"
        assert "not Prometheus text" in answer["results"]["t"]["error"]

    @pytest.mark.parametrize("streamed", ["0", "1"])
    async def test_sglang_time_weighted_gauges(self, fake_vllm, exporter, monkeypatch, streamed):
        monkeypatch.setenv("SPECDEC_STOP_STREAMED", streamed)
        now = [1000.0]
        fake = await fake_vllm(dialect="sglang", k=3, engines=2)
        exp = await exporter({"targets": [{"name": "s", "url": fake.url}]}, clock=lambda: now[0])
        await exp.start(id="ws")  # baseline at 1000: no rank has logged yet
        fake.server.add(0, 10, 30, [9, 6, 3])  # rank 0: length 2.8, rate 0.6
        now[0] = 1010.0
        await exp.round()
        fake.server.add(0, 10, 30, [5, 2, 1])  # rank 0: length 1.8, rate 8/30
        fake.server.add(1, 10, 20, [10, 10])  # rank 1: length 3.0, rate 1.0
        now[0] = 1040.0
        window = exp.service.book.get("ws")  # the stopped window keeps only its answer
        answer = await exp.stop("ws")
        result = answer["results"]["s"]
        assert result["dialect"] == "sglang" and result["scrapes"] == 3
        # 10 s at rank 0's first interval; 30 s at the mean of both ranks' latest (the stop's
        # scrape at 1040: the means are over 40 s).
        length = (2.8 * 10 + (1.8 + 3.0) / 2 * 30) / 40
        rate = (0.6 * 10 + (8 / 30 + 1.0) / 2 * 30) / 40
        means = {"sglang:spec_accept_length": length, "sglang:spec_accept_rate": rate}
        assert result["gauge_means"] == pytest.approx(means)
        if streamed == "0":  # this window took the stop's scrape (forked after it)
            acc = window.accumulators["s"]
            assert acc.dialect == "sglang" and acc.scrapes == 3
            assert acc.gauge_means() == pytest.approx(means)
            assert acc.gauge_seconds == {
                "sglang:spec_accept_length": 40.0, "sglang:spec_accept_rate": 40.0
            }
        assert result["status"] == "ok" and result["estimate"] is True
        assert result["data"]["acceptance_length"] == round(length, 3)
        assert result["data"]["acceptance_rate"] == round(100 * rate, 2)
        assert result["data"]["num_drafts"] is None
        assert "time-weighted means" in result["dialect_note"]
        assert answer["aggregate"]["status"] == "na"  # estimates are not summed with counts
        block = format_window(answer)
        assert f"Acceptance length                             {length:.2f}\n" in block
        assert "Drafts                                        N/A\n" in block


class TestDialectTable:
    """`exporter.core.dialects` is the one home: every reader agrees with it."""

    def test_every_parsed_dialect_reports_and_renders(self):
        from exporter.core.dialects import DIALECTS, REPORTING, SIMULATED_DIALECTS
        from exporter.fakevllm import RENDERERS

        assert set(DIALECTS) == set(Dialect) - {Dialect.AUTO}
        assert {d.value for d in DIALECTS} <= set(REPORTING)
        assert set(RENDERERS) == set(REPORTING) == set(SIMULATED_DIALECTS)

    @pytest.mark.parametrize("name", ["vllm", "vllm-v0", "llamacpp", "sglang", "trtllm"])
    def test_simulated_page_parses_as_its_dialect_at_its_path(self, name):
        from exporter.core.dialects import default_path, is_estimate

        server = FakeServer(dialect=name, k=3, seed=1)
        server.simulate(50)
        snapshot = parse_page(server.render(), Dialect.AUTO)
        assert snapshot.dialect == name
        assert server.metrics_path == default_path(name)
        assert is_estimate(name) is (name == "sglang")
        assert (dialect_note(name) is None) is (name in ("vllm", "llamacpp"))

    def test_config_names_the_same_dialects(self):
        with pytest.raises(Exception) as caught:
            validate_config({"targets": [{"url": "http://h:1/", "dialect": "tgi"}]})
        for dialect in Dialect:
            assert repr(dialect.value) in str(caught.value)
