"""HTML of the advice: the bars of P(X = j) and the advisor table."""

from __future__ import annotations

import re

import pytest

from exporter.advice_html import advice_section, distribution_bars, window_advice_html
from exporter.advise import advice
from exporter.distribution import distribution


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
        html = window_advice_html(answer)
        assert "speculation advisor" in html and "<h3>a</h3>" in html

    def test_open_window_has_none(self):
        assert window_advice_html({"id": "w", "stopped_at": None}) == ""
