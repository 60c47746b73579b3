"""exporter/web/handlers.py: HTTP answers (the window API is tested through the book and faults)."""

from __future__ import annotations

from aiohttp import web

from exporter.web import handlers as api


class TestSentResponse:
    async def _served(self, aiohttp_client, monkeypatch, size: int):
        trims, sent = [], []
        monkeypatch.setattr(api, "give_back_free_memory", lambda: trims.append(1) or True)

        async def answer(_request):
            sent.append(api.SentResponse(body=b"x" * size, content_type="application/json"))
            return sent[-1]

        app = web.Application()
        app.router.add_get("/", answer)
        client = await aiohttp_client(app)
        for _ in range(2):  # kept alive: the first answer is not held until the next request
            response = await client.get("/")
            assert len(await response.read()) == size
            assert sent[-1].body is None
        return trims

    async def test_a_big_answer_is_let_go_and_the_heap_trimmed(self, aiohttp_client, monkeypatch):
        assert await self._served(aiohttp_client, monkeypatch, api.BIG_BODY) == [1, 1]

    async def test_a_small_answer_trims_nothing(self, aiohttp_client, monkeypatch):
        assert await self._served(aiohttp_client, monkeypatch, api.BIG_BODY - 1) == []
