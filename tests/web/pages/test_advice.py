"""HTML of the advice: the bars of P(X = j) and the advisor table."""

from __future__ import annotations

import re

import pytest

from exporter.analysis.advise import advice
from exporter.analysis.distribution import distribution
from exporter.web.pages.advice import advice_section, distribution_bars
from exporter.web.pages.window import advisor_section


class TestDistributionBars:
    def test_one_bar_per_value_tallest_is_full_height(self):
        svg = distribution_bars({"0": 0.2, "1": 0.3, "2": 0.3, "3": 0.2}, height=80)
        heights = [float(h) for h in re.findall(r'<rect [^>]*height="([\d.]+)"', svg)]
        # Rendered to 0.1 px.
        assert heights == pytest.approx([80 * 0.2 / 0.3, 80.0, 80.0, 80 * 0.2 / 0.3], abs=0.05)
        assert "P(X = 3) = 0.2000" in svg

    def test_empty(self):
        assert distribution_bars({}) == ""


class TestAdviceSection:
    def test_table_marks_estimates_and_best(self):
        html = advice_section("t<0>", advice(distribution([0.8, 0.5, 0.2]), [0.25]))
        assert "<h3>t&lt;0&gt;</h3>" in html
        assert html.count('<tr class="est">') == 3  # k' = 4..6
        assert "<td>2*</td>" not in html and "<td>4*</td>" in html
        # c = 0.25: S(2) = 2.3 / 1.5 is the best.
        assert "<td class=best>1.533</td>" in html
        assert "ratio 0.5000" in html

    def test_non_monotone_note(self):
        html = advice_section("t", advice(distribution([0.5, 0.7])))
        assert "isotonic" in html

    def test_nothing_to_advise(self):
        assert "nothing to advise" in advice_section("t", None)

    def test_window_without_advice_key_gets_it_computed(self):
        answer = {"results": {"a": {"status": "ok", "data": {
            "per_position_acceptance_rates": {"0": 0.8}}}}, "aggregate": None}
        html = advisor_section(answer, {})
        assert "speculation advisor" in html and "<h3>a</h3>" in html

    def test_open_window_has_none(self):
        assert advisor_section({"id": "w", "stopped_at": None}, {}) == ""


class TestWindowPage:
    async def test_stopped_window_page_shows_the_advisor(self, fake_vllm, exporter):
        fake = await fake_vllm(k=3)
        exp = await exporter({"targets": [{"name": "eagle", "url": fake.url}]})
        await exp.start(id="page")
        fake.server.add(0, 1000, 3000, [800, 500, 200])
        await exp.stop("page")
        response = await exp.client.get("/windows/page")
        assert response.status == 200
        html = await response.text()
        advisor = html[html.index("Which k: the speculation advisor"):]
        # X's distribution as bars: P(X = j) = 0.2, 0.3, 0.3, 0.2.
        assert [float(p) for p in re.findall(r"P\(X = \d\) = ([\d.]+)", advisor)] == [
            0.2, 0.3, 0.3, 0.2]
        # L(k') = 1.8, 2.3, 2.5, then the tail (ratio 0.5): 2.6, 2.65, 2.675.
        lengths = re.findall(r"<tr(?: class=\"est\")?><td>\d\*?</td><td>([\d.]+)</td>", advisor)
        assert lengths == ["1.800", "2.300", "2.500", "2.600", "2.650", "2.675"]
        assert "ratio 0.5000" in advisor

    async def test_open_window_page_has_no_advisor(self, fake_vllm, exporter):
        fake = await fake_vllm(k=3)
        exp = await exporter({"targets": [{"name": "eagle", "url": fake.url}]})
        await exp.start(id="open")
        html = await (await exp.client.get("/windows/open")).text()
        assert "speculation advisor" not in html
