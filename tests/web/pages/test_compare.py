"""The compare page and the landing page's picker, over real HTTP against make_app."""

from __future__ import annotations

import re

import pytest


async def record(exp, fakes, window_id: str, per_pos: list[int], name: str | None = None):
    await exp.start(id=window_id, **({"name": name} if name else {}))
    for fake in fakes:
        fake.server.add(0, 1000, 1000 * len(per_pos), per_pos)
    await exp.stop(window_id)


@pytest.fixture
async def setup(fake_vllm, exporter):
    fakes = [await fake_vllm(k=3), await fake_vllm(k=3)]
    exp = await exporter({"targets": [{"name": f"t{i}", "url": f.url}
                                      for i, f in enumerate(fakes)]})
    await record(exp, fakes, "wa", [800, 500, 200], name="<b>eagle</b> k=3")
    await record(exp, fakes, "wb", [700, 400, 100])
    return exp, fakes


def section(html: str, title: str) -> str:
    """The part of the page from the <h3> `title` to the next <h3>."""
    start = html.index(f"<h3>{title}")
    end = html.find("<h3>", start + 4)
    return html[start:end if end != -1 else None]


class TestComparePage:
    async def test_side_by_side_with_intervals_and_verdicts(self, setup):
        exp, _ = setup
        response = await exp.client.get("/compare", params={"a": "wa", "b": "wb"})
        assert response.status == 200
        assert response.content_type == "text/html"
        html = await response.text()
        assert '<a href="/windows/wa">wa</a>' in html and '<a href="/windows/wb">wb</a>' in html
        assert "&lt;b&gt;eagle&lt;/b&gt; k=3" in html and "<b>eagle</b>" not in html
        for title in ("t0", "t1", "all targets"):
            part = section(html, title)
            length_row = part[part.index("acceptance length"):].split("</tr>")[0]
            # A 2.500, B 2.200, B - A -0.300, each with an interval; verdict worse.
            assert "2.500" in length_row and "2.200" in length_row and "-0.300" in length_row
            assert re.search(r"\[-0\.3\d\d, -0\.2\d\d\]", length_row)
            assert 'class="worse">worse<' in length_row
            assert "<svg" in length_row  # the two intervals drawn on one scale
        assert "treat drafts as independent" in html
        # Both windows' advice side by side, with the distribution of X as bars.
        assert html.count("A: which k") == 1 and html.count("B: which k") == 1
        assert "P(X = 3) = 0.2000" in html  # A: p2 = 0.2
        assert "P(X = 3) = 0.1000" in html  # B: p2 = 0.1

    async def test_reversed_says_better(self, setup):
        exp, _ = setup
        html = await (await exp.client.get("/compare?a=wb&b=wa")).text()
        assert 'class="better">better<' in html and 'class="worse"' not in html

    @pytest.mark.parametrize(
        ("query", "status", "message"),
        [("?a=wa", 400, "give both windows"), ("?a=wa&b=nope", 404, 'unknown window "nope"'),
         ("?a=wa&b=bad%20id!", 400, "")],
    )
    async def test_bad_queries_are_json_errors(self, setup, query, status, message):
        exp, _ = setup
        response = await exp.client.get("/compare" + query)
        assert response.status == status
        assert message in (await response.json())["error"]

    async def test_open_window_is_409(self, setup):
        exp, _ = setup
        await exp.start(id="still-open")
        response = await exp.client.get("/compare?a=wa&b=still-open")
        assert response.status == 409
        assert "still open" in (await response.json())["error"]

    async def test_picker_without_query(self, setup):
        exp, _ = setup
        html = await (await exp.client.get("/compare")).text()
        assert '<form action="/compare" method="get">' in html
        # Newest is B by default, the one before it A.
        assert '<option value="wa" selected>' in html.split('name="b"')[0]
        assert '<option value="wb" selected>' in html.split('name="b"')[1]


class TestLandingPicker:
    async def test_form_lists_stopped_windows_only(self, setup):
        exp, _ = setup
        await exp.start(id="open-one")
        html = await (await exp.client.get("/")).text()
        form = html[html.index('<form action="/compare"'):html.index("</form>")]
        assert 'value="wa"' in form and 'value="wb"' in form
        assert "open-one" not in form

    async def test_no_form_with_one_window(self, fake_vllm, exporter):
        fake = await fake_vllm(k=3)
        exp = await exporter({"targets": [{"name": "a", "url": fake.url}]})
        await record(exp, [fake], "only", [800, 500, 200])
        html = await (await exp.client.get("/")).text()
        assert '<form action="/compare"' not in html


async def _timed_windows(exporter, aiohttp_server):
    """Windows `a` (a server without spec decode) and `b` (with it), 12 requests each through
    the proxy of fake-vllm servers whose steps take 2 ms: the exporter under test."""
    import aiohttp
    from conftest import free_port

    from exporter.fakevllm import FakeServer, make_fake_app

    fakes = {"a": FakeServer(spec_decode=False, step_seconds=0.002),
             "b": FakeServer(k=3, acceptance=0.8, step_seconds=0.002,
                             per_request_metrics="summary")}
    ports = {name: free_port() for name in fakes}
    targets = []
    for name, fake in fakes.items():
        upstream = await aiohttp_server(make_fake_app(fake))
        targets.append({"name": name, "url": str(upstream.make_url("/metrics")),
                        "proxy": {"listen": f"127.0.0.1:{ports[name]}"}})
    exp = await exporter({"targets": targets})
    await exp.round()
    async with aiohttp.ClientSession() as session:
        for name in fakes:
            await exp.start(id=name, targets=[name])
            for i in range(12):
                async with session.post(f"http://127.0.0.1:{ports[name]}/v1/completions", json={
                        "prompt": "p", "max_tokens": 16, "stream": i % 2 == 0,
                        "stream_options": {"include_usage": True}}) as answer:
                    await answer.read()
            await exp.stop(name)
    return exp


class TestSpeedSection:
    async def test_the_paired_speedup_table_with_its_interval_chart(self, exporter,
                                                                    aiohttp_server):
        exp = await _timed_windows(exporter, aiohttp_server)
        html = await (await exp.client.get("/compare?a=a&b=b")).text()
        section = html[html.index('<section id="speedup">'):]
        assert "timed answers A: 12, B: 12" in section
        row = section[section.index("tokens_per_second mean"):].split("</tr>")[0]
        assert re.search(r"\d\.\d{3}<br><small>\[\d\.\d{3}, \d\.\d{3}\]</small>", row)
        assert '<svg class="ratio"' in row
        assert 'class="better">faster<' in row  # B's steps emit 1 + accepted tokens each
        for name in ("concurrency 1", "tag untagged"):  # one at a time, no tag header
            table = section[section.index(f"<h3>{name} "):].split("</table>")[0]
            assert "timed answers A: 12, B: 12" in table and "tokens_per_second mean" in table

    async def test_windows_without_timings_have_no_section(self, setup):
        exp, _ = setup
        html = await (await exp.client.get("/compare?a=wa&b=wb")).text()
        assert 'id="speedup"' not in html


@pytest.mark.e2e
@pytest.mark.parametrize("width", [1400, 400])
async def test_the_speedup_section_in_headless_chromium(exporter, aiohttp_server, tmp_path,
                                                        width):
    import json

    from browser import Browser

    exp = await _timed_windows(exporter, aiohttp_server)
    base = str(exp.client.make_url("/")).rstrip("/")
    facts_js = """JSON.stringify({
        overflow: document.documentElement.scrollWidth - window.innerWidth,
        charts: [...document.querySelectorAll('#speedup svg.ratio')].map(svg => {
            const box = svg.getBoundingClientRect();
            return {width: box.width, right: box.right,
                    whisker: svg.querySelectorAll('line').length};}),
        scrolls: [...document.querySelectorAll('#speedup table')].map(
            t => t.closest('.scroll') !== null),
        heads: [...document.querySelectorAll('#speedup h3')].map(h => h.firstChild.textContent)})"""
    async with Browser(tmp_path / "profile") as browser:
        await browser.open(f"{base}/compare?a=a&b=b", width)
        facts = json.loads(await browser.evaluate(facts_js))
        shot = await browser.screenshot(f"compare-speedup-{width}px")
    assert shot.stat().st_size > 5000
    assert facts["overflow"] <= 0 and all(facts["scrolls"]) and facts["scrolls"]
    assert facts["charts"] and all(c["width"] > 0 for c in facts["charts"])
    assert any(c["whisker"] == 2 for c in facts["charts"])  # the line at 1 and an interval
    assert [h.strip() for h in facts["heads"]] == ["all targets", "concurrency 1",
                                                   "tag untagged"]
    assert len(facts["scrolls"]) == len(facts["heads"])  # a table each, each in its scroller
