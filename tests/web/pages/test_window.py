"""The window page (`GET /windows/{id}`) and the landing page: HTML, and headless Chromium."""

from __future__ import annotations

import re

import pytest
from browser import Browser
from conftest import Clock

from exporter.core.isotime import iso_utc
from exporter.web.pages.window import acceptance_lines, unobserved_section

START = 1_800_000_000.0


class TestAcceptanceLines:
    def test_cumulative_per_target_and_summed_counts_for_the_aggregate(self):
        series = {"targets": {
            "a": [{"at": 0.0, "draft_tokens": 0, "accepted": 0},
                  {"at": 5.0, "draft_tokens": 10, "accepted": 5},
                  {"at": 10.0, "draft_tokens": 30, "accepted": 25}],
            "b": [{"at": 5.0, "draft_tokens": 90, "accepted": 9}],
        }}
        lines, aggregate = acceptance_lines(series)
        assert lines == {"a": [(5.0, 50.0), (10.0, 100 * 25 / 30)], "b": [(5.0, 10.0)]}
        # Only where every target has a sample: b's one, 5 s. (5 + 9) / (10 + 90): counts
        # summed, never an average of the two ratios; b has nothing later to count at 10 s.
        assert aggregate == [(5.0, 14.0)]

    def test_empty_series(self):
        assert acceptance_lines({"targets": {}}) == ({}, [])
        assert acceptance_lines({"targets": {"a": [], "b": []}}) == ({"a": [], "b": []}, [])

    def test_scrapes_out_of_phase_draw_no_sawtooth(self):
        # a: 10 tokens/s, half accepted; b: 10 tokens/s, a fifth accepted, scraped 2.5 s after
        # a each round. The fleet accepts 35% all along; summing each target's latest sample
        # swung between 50 and 20 weighted by which had just been scraped.
        series = {"targets": {
            "a": [{"at": t, "draft_tokens": 10 * t, "accepted": 5 * t}
                  for t in (0.0, 5.0, 10.0, 15.0, 20.0)],
            "b": [{"at": t, "draft_tokens": 10 * t, "accepted": 2 * t}
                  for t in (2.5, 7.5, 12.5, 17.5)],
        }}
        _, aggregate = acceptance_lines(series)
        assert [at for at, _ in aggregate] == [2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 17.5]
        assert [rate for _, rate in aggregate] == pytest.approx([35.0] * 7)

    def test_between_samples_each_target_is_interpolated(self):
        series = {"targets": {
            "a": [{"at": 0.0, "draft_tokens": 0, "accepted": 0},
                  {"at": 10.0, "draft_tokens": 100, "accepted": 100}],
            "b": [{"at": 4.0, "draft_tokens": 40, "accepted": 0},
                  {"at": 6.0, "draft_tokens": 60, "accepted": 0}],
        }}
        # a at 4 s: 40 of 40; at 6 s: 60 of 60; b accepts none: 50% at both.
        assert acceptance_lines(series)[1] == [(4.0, pytest.approx(50.0)),
                                               (6.0, pytest.approx(50.0))]


async def _scenario(exporter, fake_vllm, clock: Clock):
    """Two servers (k=3 and k=5 on two engines) through a window, one going down after it;
    a restart inside the window so that the table has a note to show."""
    eagle = await fake_vllm(k=3, seed=1)
    mtp = await fake_vllm(k=5, engines=2, seed=2, model_name="Qwen/Qwen3-8B")
    exp = await exporter({"targets": [{"name": "llama-eagle", "url": eagle.url},
                                      {"name": "qwen-mtp", "url": mtp.url}]}, clock=clock)
    await exp.round()
    await exp.start(id="w-page", name="eagle vs mtp <k>", targets=["llama-eagle", "qwen-mtp"])
    for step in range(8):
        eagle.server.simulate(40)
        mtp.server.simulate(60)
        if step == 4:
            eagle.server.restart()
            eagle.server.simulate(10)
        clock.now += 5
        await exp.round()
    clock.now += 5
    answer = await exp.stop("w-page")
    # After the window, qwen-mtp goes away: the landing page shows its figures as stale.
    await mtp.stop()
    clock.now += 5
    await exp.round()
    return exp, answer


class TestWindowPage:
    async def test_everything_the_page_shows(self, exporter, fake_vllm):
        clock = Clock(START)
        exp, answer = await _scenario(exporter, fake_vllm, clock)
        response = await exp.client.get("/windows/w-page")
        assert response.status == 200 and response.content_type == "text/html"
        page = await response.text()
        assert '<meta name="viewport"' in page
        assert "eagle vs mtp &lt;k&gt;" in page and "<k>" not in page
        assert iso_utc(answer["started_at"]) in page and iso_utc(answer["stopped_at"]) in page
        assert "0m 45s" in page  # 9 rounds of 5 s
        eagle = answer["results"]["llama-eagle"]
        # The console blocks as printed, and the per-target table with the same decimals.
        assert "Speculative Decoding Metrics  [all]" in page
        assert f"{eagle['data']['acceptance_rate']:.2f}" in page
        assert f"{answer['aggregate']['data']['acceptance_length']:.2f}" in page
        assert "Target: llama-eagle" in page
        assert "restart" in eagle["reset_note"] and eagle["reset_note"] in page
        # The restart's span no scrape saw: named per target, in its own table.
        (span,) = eagle["unobserved"]
        assert eagle["coverage"] == "partial" and "Unobserved at server restarts" in page
        unobserved = page.split("Unobserved at server restarts")[1].split("</table>")[0]
        assert "llama-eagle" in unobserved and "qwen-mtp" not in unobserved
        assert span["from_iso"] in unobserved and span["to_iso"] in unobserved
        assert "between the scrapes at" in unobserved and f"{span['seconds']:.3f}" in unobserved
        # Bars for both targets (3 and 5 positions) and the aggregate (5).
        assert len(re.findall(r"<title>position \d+: ", page)) == 3 + 5 + 5
        # The chart: labelled axes, a line per target, the aggregate line, a legend.
        assert "time since window start (s)" in page and "acceptance rate (%)" in page
        assert page.count("<polyline") == 3
        assert "all targets (aggregate)" in page
        assert "<script" not in page

    async def test_open_window_page_and_unknown_window(self, exporter, fake_vllm):
        fake = await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        await exp.start(id="still-open")
        page = await (await exp.client.get("/windows/still-open")).text()
        assert "still open" in page and "Results appear here when the window is stopped" in page
        assert (await exp.client.get("/windows/nope")).status == 404
        assert (await exp.client.get("/windows/..%2Fx")).status in (400, 404)

    async def test_landing_links_the_page_refreshes_and_greys_stale_targets(
            self, exporter, fake_vllm):
        clock = Clock(START)
        exp, _ = await _scenario(exporter, fake_vllm, clock)
        page = await (await exp.client.get("/")).text()
        assert 'href="/windows/w-page"' in page
        # Gently: a reading eye's pace, not the scrape interval's (5 s here, 1 s in the demo).
        assert '<meta http-equiv="refresh" content="30">' in page
        stale = re.search(r'<tr class="stale"><td class="name">qwen-mtp.*?</tr>', page, re.S)
        assert stale and "last seen " in stale.group(0) and "down" in stale.group(0)
        assert "Qwen/Qwen3-8B" in stale.group(0)  # a down target's model is kept
        assert "engines: 2" in stale.group(0)
        assert '<tr class="stale"><td class="name">llama-eagle' not in page
        assert "<b>1 of 2 up</b>" in page
        # The down target first, above the fold.
        assert page.index(">qwen-mtp<br>") < page.index(">llama-eagle<br>")
        quiet = await (await exp.client.get("/?refresh=0")).text()
        assert 'http-equiv="refresh"' not in quiet


@pytest.mark.e2e
@pytest.mark.parametrize("width", [1400, 400])
async def test_pages_in_headless_chromium(exporter, fake_vllm, tmp_path, width):
    clock = Clock(START)
    exp, _ = await _scenario(exporter, fake_vllm, clock)
    base = str(exp.client.make_url("/")).rstrip("/")
    measure = """JSON.stringify({
        overflow: document.documentElement.scrollWidth - window.innerWidth,
        body: document.body.scrollWidth - window.innerWidth,
        charts: [...document.querySelectorAll('svg.chart')].map(svg => ({
            width: svg.getBoundingClientRect().width,
            labels: [...svg.querySelectorAll('text.axis-label')].map(t => t.textContent),
            lines: svg.querySelectorAll('polyline').length})),
        tables: [...document.querySelectorAll('table')].map(t => t.closest('.scroll') !== null),
        headings: [...document.querySelectorAll('h2, details > summary')].map(
            h => h.textContent.split(' ')[0]),
        results_top: (document.querySelector('h2') || {getBoundingClientRect: () => ({})})
            .getBoundingClientRect().top,
        screen: window.innerHeight,
        console_open: [...document.querySelectorAll('details.console')].map(d => d.open),
        console_last: document.querySelector('details.console') ===
            [...document.body.children].filter(e => e.tagName !== 'P').pop(),
        rate_right: [...document.querySelectorAll('table')[0].querySelectorAll('th')].filter(
            th => th.textContent.startsWith('acceptance rate')).map(
            th => th.getBoundingClientRect().right),
        summary: (document.querySelector('p.summary') || {}).textContent || null,
        width: window.innerWidth,
        title: document.title})"""
    async with Browser(tmp_path / "profile") as browser:
        seen = {}
        for name, path in (("landing", "/?refresh=0"), ("window", "/windows/w-page")):
            await browser.open(base + path, width)
            seen[name] = __import__("json").loads(await browser.evaluate(measure))
            shot = await browser.screenshot(f"{name}-{width}px")
            assert shot.stat().st_size > 5000  # a rendered page, not a blank one
    for name, facts in seen.items():
        assert facts["overflow"] <= 0 and facts["body"] <= 0, (name, facts)
        assert all(facts["tables"]), name  # every table scrolls inside its own box
    window = seen["window"]
    # The answer first: results, per position, per request; the console text last, folded.
    assert window["headings"] == ["Results", "Per-position", "Unobserved", "Acceptance",
                                  "Which", "Console"], window["headings"]
    assert window["results_top"] < window["screen"] / 2  # on the first screen, at 400 px too
    assert window["console_open"] == [False] and window["console_last"]
    landing = seen["landing"]
    assert landing["summary"].startswith("1 of 2 up")
    # The acceptance columns, the point of the page, fit the screen without scrolling.
    assert landing["rate_right"] and all(r <= landing["width"] for r in landing["rate_right"])
    assert window["title"].startswith("window eagle vs mtp <k>")
    assert len(window["charts"]) == 1
    chart = window["charts"][0]
    assert chart["labels"] == ["time since window start (s)", "acceptance rate (%)"]
    assert chart["lines"] == 3 and 0 < chart["width"] <= width
    assert seen["landing"]["charts"][0]["labels"] == chart["labels"]


class TestUnobservedSection:
    def test_odd_entries_are_skipped_not_a_failure(self):
        state = {"results": {"a": {"unobserved": ["x", 3, {"from_iso": "<b>", "seconds": "?"}]},
                             "b": {"unobserved": 5}, "c": {}}}
        html = unobserved_section(state, {})
        assert html.count("<tr><td>") == 1 and "&lt;b&gt;" in html and "<b>" not in html

    def test_nothing_without_restarts(self):
        assert unobserved_section({"results": {"a": {"coverage": "full"}}}, {}) == ""


class TestLineChartLegend:
    @pytest.mark.parametrize("count", [8, 20, 100])
    def test_every_line_has_a_colour_of_its_own(self, count):
        from exporter.web.pages.html import line_chart

        lines = {f"t{i:03d}": [(0.0, 50.0), (1.0, 60.0)] for i in range(count)}
        html = line_chart(lines, start=0.0, end=1.0, aggregate=[(0.0, 55.0)])
        legend = re.findall(r'<i style="background:([^"]+)"></i>', html)
        strokes = re.findall(r'<polyline fill="none" stroke="([^"]+)"', html)
        assert len(legend) == count + 1 and len(set(legend)) == count + 1
        assert strokes == legend  # each legend entry is its line's colour
