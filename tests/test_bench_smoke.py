"""Smoke test of the bench suite: every case at tiny sizes, output structure only, no timings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# bench/ lives beside exporter/ but is not part of the installed distribution.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (  # noqa: E402
    answer,
    case_exposition,
    case_fleet,
    case_floor,
    case_markers,
    case_pages,
    case_parse,
    case_proxy,
    case_records,
    case_save,
    case_scale,
    case_servercost,
    run,
)
from bench.common import CaseResult, Row  # noqa: E402
from bench.fleet import MAX_ADAPTERS, NginxFleet, PageSet, find_nginx  # noqa: E402
from bench.procs import find_prometheus, find_victoria  # noqa: E402

needs_nginx = pytest.mark.skipif(find_nginx() is None, reason="nginx not installed")

ROW_KEYS = {"case", "figure", "value", "unit", "baseline", "baseline_name", "ratio", "target",
            "met"}


def check_rows(result: CaseResult, case: str) -> None:
    assert result.skipped is None
    assert result.rows
    for row in result.rows:
        assert isinstance(row, Row)
        assert row.case == case
        assert row.figure
    doc = json.loads(json.dumps(result.to_dict(), default=str))
    assert set(doc["rows"][0]) == ROW_KEYS


@pytest.fixture(scope="module")
def fleet():
    with NginxFleet(4, pages=2, page_bytes=20_000) as running:
        yield running


class TestParseCase:
    def test_rows_and_answers(self):
        result = case_parse.run(sizes=((1, None), (2, None)), repeats=1, ref_repeats=1)
        check_rows(result, "parse")
        assert len(result.rows) == 6
        for figures in result.data.values():
            assert figures["same_answers"] is True
            assert figures["spec_series"] > 0
            assert {"ours_mb_s", "reference_mb_s", "count_newlines_mb_s"} <= set(figures)


@needs_nginx
class TestAnswerBench:
    """`python -m bench.answer`: a built window's stop answer timed alone (no server needed)."""

    def test_figures_and_a_stable_digest(self, capsys):
        figures = answer.measure(120, repeats=2)
        assert figures["targets"] == 120 and figures["repeats"] == 2
        assert 0 < figures["min_s"] <= figures["median_s"]
        assert figures["json_loads_median_s"] > 0 and figures["texts_median_s"] > 0
        assert figures["stop_work_cpu_s"] > 0 and figures["stop_tail_cpu_s"] > 0
        assert figures["digest"] == answer.measure(120, repeats=1)["digest"]
        assert answer.main(["30", "--repeats", "1"]) == 0
        out = capsys.readouterr().out
        assert "stop answer over 30 targets" in out and "its two texts" in out
        assert "after the last" in out

    def test_window_takes_every_path(self):
        from exporter.core.stopanswer import AnswerParts

        results = AnswerParts(answer.build_window(120), answer.ADVICE).answer()["results"]
        assert results["t0"]["status"] == "ok" and results["t0"]["coverage"] == "full"
        assert results["t1"]["coverage"] == "partial"  # its start failed
        assert results["t2"]["coverage"] == "partial"  # its stop failed
        assert results["t3"]["status"] == "na"  # removed
        assert results["t4"]["resets"] > 0


class TestPageShapes:
    @pytest.mark.parametrize("kib", [60, 160, 400])
    def test_pages_are_shaped_like_a_real_fleets(self, kib):
        # A real vLLM page with a few adapters and histograms: ~1,300 series in 159 KiB, so
        # the mean page lands on the size with a real page's series per KiB, not long lines.
        pages = PageSet(4, target_bytes=kib * 1024)
        bodies = pages.render()
        mean = sum(map(len, bodies)) / len(bodies)
        assert abs(mean - kib * 1024) < 0.1 * kib * 1024
        for server, body in zip(pages.servers, bodies, strict=True):
            assert server.lora_adapters <= MAX_ADAPTERS and server.k == 8
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
            assert 6 <= series / (len(body) / 1024) <= 12


@pytest.mark.e2e
class TestFleetCases:
    def test_fleet_serves_pages(self, fleet):
        assert len(fleet.urls(4)) == 4
        assert fleet.page_bytes > 0

    @pytest.mark.prometheus
    def test_fleet_case(self, fleet):
        # This tree as the baseline commit's checkout: its exporter joins the rotation too.
        root = Path(__file__).resolve().parent.parent
        result = case_fleet.run(fleet, sizes=(2, 4), seconds=1.0, interval=1.0, rotations=2,
                                compare_at=(4,), baseline_tree=root)
        check_rows(result, "fleet")
        points = result.data["points"]
        assert set(points) == {"2", "4"}
        assert set(points["2"]) == {"exporter"}  # the scale-only size: the exporter alone
        assert result.data["page_series"] > 0
        assert any("vs the baseline commit" in row.figure for row in result.rows)
        expected = {"exporter", "exporter-baseline", "exporter-asyncio"} | (
            {"prometheus-spec", "prometheus-all"} if find_prometheus() else set()) | (
            {"victoria-spec"} if find_victoria() else set())
        assert set(points["4"]) == expected
        for point in points.values():
            for figures in point.values():
                assert figures["peak_rss_mb"] > 0
                assert len(figures["runs"]) == 2  # one per rotation; the figure is their median
        scale = case_scale.run(result.data, png=None)
        check_rows(scale, "scale")
        floor = case_floor.run(fleet, result.data)
        check_rows(floor, "floor")
        assert floor.data["floor_s"] > 0 and "zlib" in floor.data["inflate_s"]
        assert any(row.figure.startswith("N=4: exporter's CPU") for row in floor.rows)

    @pytest.mark.prometheus
    def test_fleet_plain_case(self, fleet):
        result = case_fleet.run(fleet, sizes=(3,), seconds=1.0, interval=1.0, rotations=1,
                                keep=("spec",), loops=False, plain=True)
        check_rows(result, "fleet-plain")
        assert result.data["encoding"] == "plain"
        assert {"exporter", "prometheus-spec"} <= set(result.data["points"]["3"])
        assert fleet.gzip  # the shared fleet serves gzip again for the other cases

    @pytest.mark.prometheus
    def test_servercost_case(self):
        result = case_servercost.run(seconds=1.0, rotations=1, rate=10.0, real=False)
        check_rows(result, "servercost")
        assert result.data["server"] == "fake-vllm"
        assert result.data["reads"] == ["filtered"]
        assert result.data["spans"]["prometheus"][0]["scrapes"] > 0

    def test_proxy_case(self):
        result = case_proxy.run(rounds=1, span=0.5)
        check_rows(result, "proxy")
        assert [row.figure for row in result.rows] == [
            f"added p99 {what}, {n} streams" for n in (64, 8)
            for what in ("time to first byte", "gap between chunks")]
        for n in (64, 8):
            figures = result.data[f"streams_{n}"]
            assert figures["proxied"]["requests"] > 0 and figures["nginx"]["requests"] > 0

    def test_pages_case(self):
        result = case_pages.run(n=3, rounds=2, sizes_kib=(60,), pages=2)
        check_rows(result, "pages")
        figures = result.data["60 KiB"]
        assert 0 < figures["spec_series"] < figures["page_series"]
        assert len(figures["rounds"]) == 2 and min(figures["rounds"]) > 0

    def test_markers_case(self, fleet):
        result = case_markers.run(fleet, sizes=(2,), repeats={2: 1}, interval=1.0)
        check_rows(result, "markers")
        figures = result.data["2"]
        assert figures["ok_results_per_stop"] == [2]
        assert len(figures["stop_s"]) == 1
        assert len(figures["rss_mb"]) == 2 and min(figures["rss_mb"]) > 0  # before, after

    def test_exposition_case(self, fleet):
        result = case_exposition.run(fleet, n=3, repeats=1, lag_seconds=0.5, interval=1.0)
        check_rows(result, "exposition")
        assert result.data["samples"] > 3 * 8
        assert result.data["lag_scrape_only"]["probes"] > 0

    def test_save_case(self, fleet):
        result = case_save.run(fleet, n=3, repeats=2)
        check_rows(result, "save")
        assert result.data["rows_per_save"] == [3, 3]  # one row per window x target
        assert len(result.data["save_cpu_s"]) == 2


class TestRecordsCase:
    def test_records_case(self):
        result = case_records.run(2_000)
        check_rows(result, "records")
        assert result.data["counted"] == 2_000 and result.data["row_kib"] > 0


class TestScaleCase:
    POINTS = {
        str(n): {
            "exporter": {"cpu_ms_per_target_scrape": 1.0, "cpu_s_per_round": n / 1000,
                         "core_pct": n / 50, "peak_rss_mb": 50 + n / 20},
            "prometheus-spec": {"cpu_ms_per_target_scrape": 3.0, "cpu_s_per_round": 3 * n / 1000,
                           "core_pct": 3 * n / 50, "peak_rss_mb": 60 + n / 2},
        }
        for n in (10, 20, 40)
    }

    def test_linear_fit_and_plot(self, tmp_path):
        png = tmp_path / "scale.png"
        result = case_scale.run({"points": self.POINTS}, png=png)
        check_rows(result, "scale")
        assert result.rows[0].met is True
        assert result.data["cpu_per_round_fit"]["r2"] == pytest.approx(1.0)
        pytest.importorskip("matplotlib")
        assert png.stat().st_size > 0

    def test_needs_two_sizes(self):
        result = case_scale.run({"points": {"10": self.POINTS["10"]}}, png=None)
        assert result.skipped


class TestRunner:
    def test_main_writes_json_and_table(self, tmp_path, capsys):
        out = tmp_path / "latest.json"
        assert run.main(["--quick", "--only", "parse", "--json", str(out), "--markdown"]) == 0
        doc = json.loads(out.read_text())
        assert set(doc) == {"meta", "cases", "table"}
        assert list(doc["cases"]) == ["parse"]
        assert doc["table"][0] == ["case", "figure", "value", "baseline", "ratio", "target",
                                   "met?"]
        printed = capsys.readouterr().out
        assert "| case | figure |" in printed
        assert "target(s) missed" in printed

    def test_skipped_case_in_table(self):
        lines = run.table([CaseResult("fleet", skipped="nginx not found")])
        assert "SKIPPED: nginx not found" in lines[1][1]
