"""The simulator's HTTP app: /metrics, the OpenAI API, control endpoints, background traffic."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from exporter.fakevllm.exposition import NameFilter, answer
from exporter.fakevllm.openai import completions, models
from exporter.fakevllm.pages import CONTENT_TYPE
from exporter.fakevllm.server import FakeServer

FAKE_SERVER = web.AppKey("fake_server", FakeServer)
_TRAFFIC_ON = web.AppKey("fake_traffic_on", asyncio.Event)
_NAME_FILTER = web.AppKey("fake_name_filter", NameFilter)
# vLLM serves `/metrics` by its instrumentator (whole, never compressed) and `/metrics/` by
# prometheus_client's own app; llama.cpp and TensorRT-LLM ignore `name[]`.
_INSTRUMENTATOR_DIALECTS = frozenset({"vllm", "vllm-v0"})
_IGNORING_DIALECTS = frozenset({"llamacpp", "trtllm"})


def _accepts_gzip(header: str) -> bool:
    """Return whether an Accept-Encoding header allows gzip (q=0 refuses it)."""
    for part in header.split(","):
        coding, _, params = part.partition(";")
        if coding.strip().lower() not in ("gzip", "*"):
            continue
        quality = params.strip().removeprefix("q=").strip()
        try:
            return not quality or float(quality) > 0
        except ValueError:
            return True
    return False


async def _instrumentator(request: web.Request) -> web.Response:
    """vLLM's `/metrics`: the whole page, plain, whatever the query or Accept-Encoding says."""
    body = request.app[FAKE_SERVER].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _client_app(request: web.Request) -> web.Response:
    """prometheus_client's app: the samples `name[]` names (as its mode has it), maybe gzip'd."""
    server = request.app[FAKE_SERVER]
    mode = request.app[_NAME_FILTER]
    if server.dialect in _IGNORING_DIALECTS:
        mode = NameFilter.IGNORE
    body = answer(server.render(), request.query.getall("name[]", []), mode)
    headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
    if _accepts_gzip(request.headers.get("Accept-Encoding", "")):
        body = gzip.compress(body, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


async def _completions(request: web.Request) -> web.StreamResponse:
    """OpenAI `POST /v1/completions` and `POST /v1/chat/completions`."""
    chat = request.path == "/v1/chat/completions"
    return await completions(request, request.app[FAKE_SERVER], chat)


async def _models(request: web.Request) -> web.Response:
    return web.json_response(models(request.app[FAKE_SERVER]))


async def _health(request: web.Request) -> web.Response:
    """vLLM's liveness probe: 200, empty."""
    return web.Response()


async def _iteration_stats(request: web.Request) -> web.Response:
    """Answer what trtllm-serve's /metrics answers: a JSON list of iteration stats."""
    return web.json_response([])


async def _totals(request: web.Request) -> web.Response:
    return web.json_response(request.app[FAKE_SERVER].totals())  # JSON spells int keys as text


async def _restart(request: web.Request) -> web.Response:
    server = request.app[FAKE_SERVER]
    server.restart()
    return web.json_response(server.totals())


async def _add(request: web.Request) -> web.Response:
    server = request.app[FAKE_SERVER]
    try:
        body = await request.json()
        server.add(
            body["engine"], body["drafts"], body["draft_tokens"], list(body["accepted_per_pos"])
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        return web.json_response({"error": what}, status=400)
    return web.json_response(server.totals())


async def _acceptance(request: web.Request) -> web.Response:
    """Change the acceptance of every later draft, as a server whose drafts collapse would."""
    server = request.app[FAKE_SERVER]
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError('the body must be {"acceptance": number}')
        value = body["acceptance"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"acceptance must be a number, got {value!r}")
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"acceptance must be within 0..1, got {value}")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        return web.json_response({"error": what}, status=400)
    server.acceptance = float(value)
    return web.json_response({"acceptance": server.acceptance})


async def _pause_or_resume(request: web.Request) -> web.Response:
    event = request.app[_TRAFFIC_ON]
    if request.path == "/control/resume":
        event.set()
    else:
        event.clear()
    return web.json_response({"paused": not event.is_set()})


def make_fake_app(
    server: FakeServer, *, drafts_per_second: float = 0.0, tick: float = 0.25,
    name_filter: NameFilter = NameFilter.HONOUR,
) -> web.Application:
    """Build the aiohttp app serving the fake /metrics, control endpoints and optional traffic."""
    app = web.Application()
    app[FAKE_SERVER] = server
    app[_TRAFFIC_ON] = asyncio.Event()
    app[_TRAFFIC_ON].set()
    app[_NAME_FILTER] = name_filter
    if server.dialect in _INSTRUMENTATOR_DIALECTS:
        app.router.add_get(server.metrics_path, _instrumentator)
        app.router.add_get(server.metrics_path.rstrip("/") + "/", _client_app)
    else:
        app.router.add_get(server.metrics_path, _client_app)
    if server.metrics_path != "/metrics":
        # trtllm-serve answers /metrics with JSON iteration stats, not Prometheus text.
        app.router.add_get("/metrics", _iteration_stats)
    app.router.add_get("/control/totals", _totals)
    app.router.add_post("/control/restart", _restart)
    app.router.add_post("/control/add", _add)
    app.router.add_post("/control/acceptance", _acceptance)
    app.router.add_post("/control/pause", _pause_or_resume)
    app.router.add_post("/control/resume", _pause_or_resume)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)

    async def traffic(app: web.Application) -> AsyncIterator[None]:
        async def run() -> None:
            owed = 0.0
            # Its sequences as running requests, each decoding at a nominal 50 steps a second.
            busy = math.ceil(drafts_per_second / 50)
            while True:
                await asyncio.sleep(tick)
                if not app[_TRAFFIC_ON].is_set():
                    server.background = 0
                    await app[_TRAFFIC_ON].wait()
                server.background = busy
                # Carry the fraction so low rates still produce drafts on average.
                owed += drafts_per_second * tick
                drafts = int(owed)
                owed -= drafts
                if drafts:
                    server.simulate(drafts)

        task = asyncio.create_task(run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    if drafts_per_second > 0:
        app.cleanup_ctx.append(traffic)
    return app


async def serve_fake_vllm(
    host: str,
    port: int,
    server: FakeServer,
    drafts_per_second: float,
    on_started: Callable[[], Awaitable[None]],
    name_filter: NameFilter = NameFilter.HONOUR,
) -> None:
    """Serve a fake vLLM on host:port until cancelled; OSError when it cannot listen there."""
    runner = web.AppRunner(make_fake_app(server, drafts_per_second=drafts_per_second,
                                         name_filter=name_filter))
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        await on_started()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
