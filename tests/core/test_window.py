"""exporter/core/window.py: a window's per-scrape series (thinned, kept through the store format),
and the series as the API endpoint and the landing page's line chart show it."""

from __future__ import annotations

import pytest
from conftest import Clock

from exporter.core.snapshot import Field, SeriesKey, Snapshot
from exporter.core.window import MAX_SERIES_POINTS, TargetRef, Window
from exporter.scrape.scraper import ScrapeResult


class TestSeriesEndpoint:
    async def test_cumulative_and_interval_figures(self, fake_vllm, exporter):
        clock = Clock(1000.0)
        fake = await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]}, clock=clock)
        await exp.client.post("/api/v1/windows", json={"id": "s1"})
        fake.server.add(0, 10, 20, [4, 0])  # warm-up: ratio 0.2
        clock.now += 5
        await exp.round()
        fake.server.add(0, 10, 20, [10, 8])  # steady: ratio 0.9
        clock.now += 5
        await exp.round()
        series = await (await exp.client.get("/api/v1/windows/s1/series")).json()
        points = series["targets"]["a"]
        assert [p["at"] for p in points] == [1000.0, 1005.0, 1010.0]
        assert points[0]["acceptance_ratio"] is None  # the baseline has no drafts behind it
        assert points[1]["interval_acceptance_ratio"] == pytest.approx(0.2)
        assert points[2]["interval_acceptance_ratio"] == pytest.approx(0.9)
        assert points[2]["interval_acceptance_length"] == pytest.approx(1 + 18 / 10)
        assert points[2]["acceptance_ratio"] == pytest.approx(22 / 40)
        assert points[2]["drafts"] == 20

        page = await (await exp.client.get("/")).text()
        assert "Acceptance through window <a href=\"/windows/s1\">s1</a>" in page
        assert page.count("<polyline") == 1

        clock.now += 5
        stopped = await (await exp.client.post("/api/v1/windows/s1/stop")).json()
        assert stopped["results"]["a"]["data"]["num_drafts"] == 20
        after = await (await exp.client.get("/api/v1/windows/s1/series")).json()
        assert [p["at"] for p in after["targets"]["a"]] == [1000.0, 1005.0, 1010.0, 1015.0]

    async def test_unknown_window_series_is_404(self, exporter):
        exp = await exporter({"targets": []})
        response = await exp.client.get("/api/v1/windows/nope/series")
        assert response.status == 404


class TestSeriesBound:
    def test_points_are_thinned_not_unbounded(self):
        window = Window(id="w", name="w", targets={"a": TargetRef("a", "http://a:1/m", "a:1")},
                        labels={}, started_at=0.0)
        key = SeriesKey(Field.DRAFTS, "m", "0", -1)
        for i in range(5 * MAX_SERIES_POINTS):
            snapshot = Snapshot({key: float(i)}, {})
            window.feed(ScrapeResult("a", float(i), 0.0, snapshot))
        points = window.series["a"]
        assert len(points) <= MAX_SERIES_POINTS
        assert points[0][0] == 0.0 and points[-1][0] == 5 * MAX_SERIES_POINTS - 1
        assert [p[0] for p in points] == sorted(p[0] for p in points)

    def test_closed_window_keeps_its_series_through_the_store_format(self):
        window = Window(id="w", name="w", targets={"a": TargetRef("a", "http://a:1/m", "a:1")},
                        labels={}, started_at=0.0)
        key = SeriesKey(Field.DRAFTS, "m", "0", -1)
        for i in range(3):
            window.feed(ScrapeResult("a", float(i), 0.0, Snapshot({key: float(i)}, {})))
        assert Window.from_dict(window.to_dict()).series == {}  # open: rebuilt, not saved
        window.stopped_at = 3.0
        assert Window.from_dict(window.to_dict()).series == window.series


