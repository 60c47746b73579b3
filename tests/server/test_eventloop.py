"""The server's event loop: uvloop when installed, asyncio's on request; scrapes work on both."""

from __future__ import annotations

import asyncio
import gzip

import pytest

from exporter.config.model import validate_config
from exporter.scrape.scraper import Scraper, make_session
from exporter.server.eventloop import loop_kind, new_event_loop

PAGE = b'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'

try:
    import uvloop
except ImportError:  # pragma: no cover - the test extra installs it
    uvloop = None


class TestLoopKind:
    def test_opt_out(self, monkeypatch):
        monkeypatch.setenv("SPECDEC_EVENT_LOOP", "asyncio")
        assert loop_kind() == "asyncio"
        loop = new_event_loop()
        try:
            assert type(loop).__module__.startswith("asyncio")
        finally:
            loop.close()

    @pytest.mark.skipif(uvloop is None, reason="uvloop not installed (the fast extra)")
    def test_uvloop_when_installed(self, monkeypatch):
        monkeypatch.delenv("SPECDEC_EVENT_LOOP", raising=False)
        assert loop_kind() == "uvloop"
        loop = new_event_loop()
        try:
            assert isinstance(loop, uvloop.Loop)
        finally:
            loop.close()


async def _answers(reader, writer) -> None:
    # One connection: /ok, /gz and /cut answer by path, kept alive until the client closes.
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            path = head.split(b" ", 2)[1]
            if path == b"/gz":
                body = gzip.compress(PAGE)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)
            elif path == b"/cut":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 999\r\n\r\n" + PAGE)
                await writer.drain()
                break
            elif path == b"/hang":
                await asyncio.sleep(5)
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE) + PAGE)
            await writer.drain()
    finally:  # also when the loop's end cancels /hang's sleep
        writer.close()


async def _scrape_paths(lean: bool) -> dict[str, str | None]:
    server = await asyncio.start_server(_answers, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    targets = validate_config({"targets": [
        {"name": path, "url": f"http://127.0.0.1:{port}/{path}"}
        for path in ("ok", "gz", "cut", "hang")
    ] + [{"name": "refused", "url": "http://127.0.0.1:9/metrics"}]}).targets
    session = make_session(4)
    scraper = Scraper(session, max_bytes=1 << 20, concurrency=8, lean=lean)
    try:
        results = await asyncio.gather(*(scraper.scrape(t, 0.5) for t in targets))
        again = await scraper.scrape(targets[0], 0.5)  # over the kept-alive connection
    finally:
        await scraper.close()
        await session.close()
        server.close()
    answers = {r.target: r.error for r in results}
    answers["ok again"] = again.error
    return answers


@pytest.mark.skipif(uvloop is None, reason="uvloop not installed (the fast extra)")
@pytest.mark.parametrize("lean", [True, False], ids=["lean", "aiohttp"])
def test_scrapes_on_uvloop(lean):
    loop = uvloop.new_event_loop()
    try:
        answers = loop.run_until_complete(_scrape_paths(lean))
    finally:
        _close(loop)
    assert answers["ok"] is None and answers["gz"] is None and answers["ok again"] is None
    assert answers["cut"].startswith("body cut off or corrupt: ")
    assert answers["hang"] == "timeout after 0.5s"
    assert answers["refused"] == "connection failed: Connection refused"


def _close(loop: asyncio.AbstractEventLoop) -> None:
    """Close `loop` after its last tasks (the /hang handler still sleeps): a uvloop closed with
    a task pending reports its handles unraisably at exit, which fails the run."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
