"""The filtered scrape: through real fake-vllm servers, each way a server answers `name[]`."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from exporter.config.model import TargetConfig, validate_config
from exporter.core.dialects import sample_names
from exporter.core.parse import parse_page
from exporter.core.snapshot import FILTERED, FULL
from exporter.fakevllm import FakeServer, NameFilter, make_fake_app
from exporter.scrape.namefilter import (
    Reading,
    families,
    filtered_urls,
    honoured,
    present,
    restarted,
)
from exporter.scrape.scraper import Scraper, make_session

NAMES = sample_names("vllm")


def _target(url: str, **fields) -> TargetConfig:
    return validate_config({"targets": [{"name": "t", "url": url} | fields]}).targets[0]


class _Counted:
    """A fake vLLM on loopback that notes each request's path and whether it was filtered."""

    def __init__(self, server: FakeServer, name_filter: NameFilter):
        self.server = server
        self.seen: list[tuple[str, bool]] = []
        self.encodings: list[str | None] = []
        app = make_fake_app(server, name_filter=name_filter)

        @web.middleware
        async def note(request: web.Request, handler):
            self.seen.append((request.path, "name[]" in request.query))
            self.encodings.append(request.headers.get("Accept-Encoding"))
            return await handler(request)

        app.middlewares.append(note)
        self.app = app
        self.http: TestServer | None = None


@pytest.fixture(params=["lean", "aiohttp"])
async def scraper(request):
    """A scraper on each client path (plain HTTP through httptools, or through aiohttp)."""
    session = make_session(4)
    made = Scraper(session, max_bytes=16 * 1024 * 1024, concurrency=4,
                   lean=request.param == "lean")
    yield made
    await made.close()
    await session.close()


async def _serve(aiohttp_server, name_filter=NameFilter.HONOUR, **kwargs):
    server = FakeServer(**kwargs)
    server.simulate(200)
    counted = _Counted(server, name_filter)
    counted.http = await aiohttp_server(counted.app)
    return counted, str(counted.http.make_url("/metrics"))


class TestFilteredScrape:
    async def test_honoured_filter_is_proven_then_used(self, aiohttp_server, scraper):
        fake, url = await _serve(aiohttp_server, engines=2)
        target = _target(url)
        first = await scraper.scrape(target, 5)
        assert first.snapshot is not None and first.snapshot.read == FULL
        # First contact: the full page, then the filter proven on /metrics/.
        assert fake.seen == [("/metrics", False), ("/metrics/", True)]
        fake.server.simulate(50)
        second = await scraper.scrape(target, 5)
        assert second.snapshot is not None and second.snapshot.read == FILTERED
        assert fake.seen[2:] == [("/metrics/", True)]
        assert second.size < first.size / 10
        # A few KB: asked uncompressed, which spares the server a gzip at level 9.
        assert fake.encodings == ["gzip", "identity", "identity"]
        full = parse_page(fake.server.render(), "vllm")
        assert second.snapshot.values == full.values
        assert second.snapshot.created == full.created

    @pytest.mark.parametrize("mode", [NameFilter.EMPTY, NameFilter.IGNORE])
    async def test_falls_back_to_the_full_page(self, aiohttp_server, scraper, mode):
        fake, url = await _serve(aiohttp_server, mode)
        target = _target(url)
        for _ in range(3):
            result = await scraper.scrape(target, 5)
            assert result.snapshot is not None and result.snapshot.read == FULL
            assert result.snapshot.totals().drafts == fake.server.totals()["num_drafts"]
        # One proof (both candidate paths), then the full page only.
        assert fake.seen == [("/metrics", False), ("/metrics/", True), ("/metrics", True),
                             ("/metrics", False), ("/metrics", False)]

    async def test_proven_again_after_a_restart(self, aiohttp_server, scraper):
        fake, url = await _serve(aiohttp_server)
        target = _target(url)
        await scraper.scrape(target, 5)
        await scraper.scrape(target, 5)
        fake.server.restart()
        fake.server.simulate(10)
        seen = len(fake.seen)
        result = await scraper.scrape(target, 5)
        # The filtered answer shows the restart: the full page is read and the filter proven.
        assert fake.seen[seen:] == [("/metrics/", True), ("/metrics", False), ("/metrics/", True)]
        assert result.snapshot is not None and result.snapshot.read == FULL
        assert result.snapshot.totals().drafts == 10
        assert (await scraper.scrape(target, 5)).snapshot.read == FILTERED

    async def test_a_filter_answered_with_nothing_later_goes_back_to_full(
            self, aiohttp_server, scraper):
        # The server replaced, on the same port and with the same counters (no restart seen),
        # by one whose registry is multiprocess: its filtered answer is empty.
        fake, url = await _serve(aiohttp_server)
        target = _target(url)
        await scraper.scrape(target, 5)
        await scraper.scrape(target, 5)
        port = URL(url).port
        await fake.http.close()
        replaced = _Counted(fake.server, NameFilter.EMPTY)
        await aiohttp_server(replaced.app, port=port)
        result = await scraper.scrape(target, 5)
        assert result.snapshot is not None and result.snapshot.read == FULL
        assert result.snapshot.totals().drafts == fake.server.totals()["num_drafts"]
        assert replaced.seen == [("/metrics/", True), ("/metrics", False), ("/metrics/", True),
                                 ("/metrics", True)]
        assert (await scraper.scrape(target, 5)).snapshot.read == FULL

    async def test_switched_off_per_target(self, aiohttp_server, scraper):
        fake, url = await _serve(aiohttp_server)
        target = _target(url, name_filter=False)
        for _ in range(2):
            assert (await scraper.scrape(target, 5)).snapshot.read == FULL
        assert fake.seen == [("/metrics", False)] * 2

    async def test_sglang_honours_it_on_its_own_path(self, aiohttp_server, scraper):
        fake, url = await _serve(aiohttp_server, dialect="sglang")
        target = _target(url)
        await scraper.scrape(target, 5)
        result = await scraper.scrape(target, 5)
        assert result.snapshot is not None and result.snapshot.read == FILTERED
        assert fake.seen[-1] == ("/metrics", True)

    async def test_the_running_gauge_is_read_filtered_too(self, aiohttp_server, scraper):
        fake, url = await _serve(aiohttp_server, engines=2)
        target = _target(url)
        fake.server.background = 3  # sequences decoding: one engine 2, the other 1
        first = await scraper.scrape(target, 5)
        assert first.snapshot is not None and first.snapshot.running == 3
        fake.server.background = 5
        second = await scraper.scrape(target, 5)
        assert second.snapshot is not None and second.snapshot.read == FILTERED
        assert second.snapshot.running == 5


PAGE = (b'# TYPE vllm:spec_decode_num_drafts counter\n'
        b'vllm:spec_decode_num_drafts_total{engine="0"} 4.0\n'
        b'vllm:spec_decode_num_drafts_created{engine="0"} 100.0\n'
        b'vllm:num_requests_running{engine="0"} 1.0\n')


class TestPages:
    def test_filtered_urls_keep_the_query_and_try_the_slash_first(self):
        urls = list(filtered_urls(URL("http://h:1/metrics?x=1"), ["a:b_total"]))
        assert [u.path for u in urls] == ["/metrics/", "/metrics"]
        assert [u.query.getall("name[]") for u in urls] == [["a:b_total"]] * 2
        assert all(u.query["x"] == "1" for u in urls)

    def test_present(self):
        assert present(PAGE, NAMES) == {"vllm:spec_decode_num_drafts_total",
                                        "vllm:spec_decode_num_drafts_created",
                                        "vllm:num_requests_running"}

    @pytest.mark.parametrize("answer, ok", [
        (PAGE, True),
        (PAGE + b"process_cpu_seconds_total 1.0\n", False),  # ignored: a sample not asked for
        (PAGE.replace(b"vllm:num_requests_running", b"# x"), False),  # a family lacking
        (b"", False),  # a multiprocess registry's answer
    ])
    def test_honoured(self, answer, ok):
        assert honoured(answer, present(PAGE, NAMES), NAMES) is ok

    def test_a_filtered_page_that_lost_the_gauge_is_not_kept(self):
        full = parse_page(PAGE)
        reading = Reading(families=families(full), last=full)
        assert reading.keeps(parse_page(PAGE.replace(b"} 4.0", b"} 5.0")))
        assert not reading.keeps(parse_page(PAGE.replace(b"vllm:num_requests_running", b"# x")))

    @pytest.mark.parametrize("later, seen", [
        (PAGE.replace(b"} 4.0", b"} 5.0"), False),
        (PAGE.replace(b"} 4.0", b"} 1.0"), True),  # gone down
        (PAGE.replace(b"} 100.0", b"} 200.0"), True),  # a new _created
    ])
    def test_restarted(self, later, seen):
        assert restarted(parse_page(PAGE), parse_page(later)) is seen
        assert not restarted(None, parse_page(later))


class TestWindowOverAFilteredTarget:
    """A window's numbers are the same whichever way a target is read."""

    @pytest.mark.parametrize("mode, read", [(NameFilter.HONOUR, FILTERED),
                                            (NameFilter.EMPTY, FULL), (NameFilter.IGNORE, FULL)])
    async def test_same_numbers_as_the_full_page(self, fake_vllm, exporter, mode, read):
        fake = await fake_vllm(name_filter=mode, k=3, engines=2)
        exp = await exporter({"targets": [
            {"name": "asked", "url": fake.url},
            {"name": "whole", "url": fake.url, "name_filter": False}]})
        await exp.round()
        await exp.start(id="w")
        fake.server.add(0, 10, 30, [8, 5, 2])
        await exp.round()
        fake.server.restart()  # proven again after it, and counted across it the same
        fake.server.add(1, 4, 12, [3, 2, 1])
        await exp.round()
        fake.server.add(0, 6, 18, [5, 3, 1])
        await exp.round()
        answer = await exp.stop("w")
        asked, whole = answer["results"]["asked"], answer["results"]["whole"]
        assert (asked["read"], whole["read"]) == (read, FULL)
        assert asked["data"]["num_drafts"] == 20 and asked["resets"] == 1
        for key in ("status", "data", "raw", "increase", "resets", "coverage"):
            assert asked[key] == whole[key], key
        text = await (await exp.client.get("/metrics")).text()
        assert f'specdec_target_read_filtered{{target="asked"}} {float(read == FILTERED)}' in text
        assert 'specdec_target_read_filtered{target="whole"} 0.0' in text
