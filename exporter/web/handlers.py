"""HTTP handlers and each fleet route's one answer: validate, call the service, answer."""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from exporter.config.model import Config, load_config
from exporter.core.errors import ConfigError, RequestError, StoreError
from exporter.core.isotime import with_iso_times
from exporter.core.shards import MAX_LIST
from exporter.core.stopanswer import window_series as series_view
from exporter.core.window import Window
from exporter.server.memory import give_back_free_memory
from exporter.server.service import ExporterService
from exporter.state.answertext import compact
from exporter.web.bodies import window_request
from exporter.web.csrf import SAFE_METHODS, check_browser_safe, default_hosts
from exporter.web.exposition import MetricsWriter
from exporter.web.fanout import Ask, Reply, shares
from exporter.web.formats import Format, accepts_gzip, gzipped, negotiate
from exporter.web.jsonviews import target_view
from exporter.web.pages.landing import render_landing
from exporter.web.relay import PROXY_TOKEN_HEADER

SERVICE = web.AppKey("service", ExporterService)
WRITER = web.AppKey("writer", MetricsWriter)
# key -> (service generation, monotonic time, rendered bytes)
METRICS_CACHE: web.AppKey[dict[str, tuple[int, float, bytes]]] = web.AppKey("metrics_cache", dict)
MAX_BODY = 64 * 1024
# /metrics and the JSON lists are rendered again when the state changed, or after this long:
# a cold render of every target must not run once per concurrent request.
METRICS_MAX_AGE = 1.0
# Targets whose /metrics lines are built per loop turn: a big fleet's cold render lets others in.
METRICS_CHUNK = 100

log = logging.getLogger(__name__)


def error_response(status: int, message: str, **extra: Any) -> web.Response:
    """The one shape of every error answer: {"error": "..."}."""
    return web.json_response({"error": message} | extra, status=status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn our errors and aiohttp's HTTP exceptions into JSON errors with the right status."""
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(exc.status, str(exc))
    except StoreError as exc:
        # The disk, not the client: 503 says "try again", and the window keeps its state.
        log.error("store failure error=%s", exc)
        response = error_response(503, str(exc))
        response.headers["Retry-After"] = "5"
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # aiohttp leaves `text` None only for bodiless statuses, all below 400.
        return error_response(exc.status, (exc.text or exc.reason).removeprefix(f"{exc.status}: "))


@web.middleware
async def body_limit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A declared body over MAX_BODY is 413 on every route, read by the handler or not; under
    /proxy/ the relay's own limit holds (a prompt is no API call)."""
    if (request.content_length or 0) > MAX_BODY and not request.path.startswith("/proxy/"):
        return error_response(413, f"body of {request.content_length} bytes is over {MAX_BODY}")
    return await handler(request)


@functools.lru_cache(maxsize=8)
def _allowed_hosts(listen: str, configured: tuple[str, ...]) -> frozenset[str]:
    return default_hosts(listen) | {h.lower().rstrip(".") for h in configured}


@web.middleware
async def browser_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """State-changing requests a web page could send (CSRF, DNS rebinding) are refused."""
    if request.method not in SAFE_METHODS:
        config = request.app[SERVICE].config
        allowed = _allowed_hosts(config.listen, tuple(config.allowed_hosts))
        has_body = bool(request.content_length) or request.headers.get(
            "Transfer-Encoding", "").lower() == "chunked"
        check_browser_safe(request.headers, has_body, allowed)
    return await handler(request)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every POST and DELETE, and every /proxy/ request, needs the token when its variable is set.

    Under /proxy/ the client's own Authorization belongs to the model server: the exporter's
    token comes in PROXY_TOKEN_HEADER there, and neither leaves the exporter (proxy.py)."""
    proxied = request.path.startswith("/proxy/")
    if proxied or request.method in ("POST", "DELETE"):
        token = os.environ.get(request.app[SERVICE].config.auth.token_env, "")
        if token and not _token_given(request, token, proxied):
            given = request.headers.get(PROXY_TOKEN_HEADER if proxied else "Authorization")
            reason = "token missing" if not given else "token wrong"
            how = (f"send {PROXY_TOKEN_HEADER}: <token> (Authorization goes to the model server)"
                   if proxied else "send Authorization: Bearer <token>")
            return error_response(401, f"{reason}: {how}")
    return await handler(request)


def _token_given(request: web.Request, token: str, proxied: bool) -> bool:
    """The exporter's token in Authorization (or, under /proxy/, in its own header too)."""
    given = [("Authorization", f"Bearer {token}")]
    if proxied:
        given.append((PROXY_TOKEN_HEADER, token))
    # Constant time, on bytes: header bytes that are not UTF-8 arrive as surrogates.
    return any(hmac.compare_digest(request.headers.get(name, "").encode("utf-8", "surrogateescape"),
                                   expected.encode("utf-8")) for name, expected in given)


async def metrics(request: web.Request) -> web.Response:
    """The exporter's exposition: text or OpenMetrics by `Accept`, gzip when accepted."""
    try:
        kind, content_type = negotiate(request.headers.get("Accept"), request.query.get("format"))
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    packed = accepts_gzip(request.headers.get("Accept-Encoding"))
    headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
    if packed:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=await _metrics_body(request, kind, packed), headers=headers)


async def _metrics_body(request: web.Request, kind: Format, packed: bool) -> bytes:
    """Cached while fresh; else built a chunk per loop turn, gzipped in a thread (off the GIL)."""
    key = f"metrics:{kind}:gzip" if packed else f"metrics:{kind}"
    if (hit := _fresh(request, key)) is not None:
        return hit[1]
    plain = _fresh(request, f"metrics:{kind}")
    if plain is None:
        writer = request.app[WRITER]
        for _ in writer.prepare(METRICS_CHUNK):
            await asyncio.sleep(0)
        body = writer.render(openmetrics=kind is Format.OPENMETRICS)
        plain = _keep(request, f"metrics:{kind}", body)
    generation, body = plain
    if packed:
        generation, body = _keep(request, key, await asyncio.to_thread(gzipped, body),
                                 generation)
    return body


def _cached(request: web.Request, key: str, render: Callable[[], bytes]) -> bytes:
    hit = _fresh(request, key)
    return hit[1] if hit is not None else _keep(request, key, render())[1]


def _fresh(request: web.Request, key: str) -> tuple[int, bytes] | None:
    entry = request.app[METRICS_CACHE].get(key)
    if (entry is None or entry[0] != request.app[SERVICE].version
            or time.monotonic() - entry[1] > METRICS_MAX_AGE):
        return None
    return entry[0], entry[2]


def _keep(request: web.Request, key: str, body: bytes,
          generation: int | None = None) -> tuple[int, bytes]:
    if generation is None:
        generation = request.app[SERVICE].version
    request.app[METRICS_CACHE][key] = (generation, time.monotonic(), body)
    return generation, body


async def landing(request: web.Request) -> web.Response:
    """The HTML landing page; `?refresh=0` turns its self-refresh off."""
    refresh = request.query.get("refresh", "1") not in ("0", "false", "no", "off")
    return web.Response(text=render_landing(request.app[SERVICE].view(), refresh=refresh),
                        content_type="text/html")


async def healthy(request: web.Request) -> web.Response:
    return web.Response(text="OK\n")


async def ready(request: web.Request) -> web.Response:
    if not request.app[SERVICE].view().ready:
        return web.Response(status=503, text="first scrape round not done\n")
    return web.Response(text="OK\n")


async def reload_config(service: ExporterService) -> Config:
    """`POST /-/reload` and SIGHUP: the file read and checked off the loop (a big one is slow)."""
    if service.config_path is None:
        return service.reload()  # says why there is nothing to reload
    try:
        config = await asyncio.to_thread(load_config, service.config_path, service.overrides)
    except ConfigError as exc:
        service.reload_refused(exc.problems)
        raise
    return service.reload(config)


async def reload(request: web.Request) -> web.Response:
    """Re-read the config file; an invalid one is refused and the old one keeps serving."""
    try:
        config = await reload_config(request.app[SERVICE])
    except ConfigError as exc:
        return error_response(400, str(exc), problems=exc.problems)
    return web.json_response({"status": "reloaded", "targets": len(config.targets)})


async def start_answer(request: web.Request, ask: Ask) -> Reply:
    """Open a window: 201 when new, 200 with the same window when the id exists."""
    service = request.app[SERVICE]
    body = window_request(ask.body or {})
    if body.edges == "traffic":  # opens at its first request through the proxy (server/edges.py)
        if ask.fleet:  # its proxy and its start live on one shard
            raise RequestError('"edges": "traffic" needs one exporter, not a fleet of shards')
        created, waiting = service.edges.expect(
            body.id, body.name, body.targets, body.labels, body.skip_requests or 0)
        return Reply(waiting, 201 if created else 200)
    mine = body.targets
    if mine is not None and len(service.config.peers) > 1:  # in a fleet: this shard's share
        mine = shares(service, mine, body.id)[service.config.shard_index]
    created, window = await service.start_window(body.id, body.name, mine, body.labels)
    # Which targets failed their start scrape and why: the CLI says so on stderr.
    answer = window.summary() | {"start_errors": dict(window.start_errors)}
    return Reply(with_iso_times(answer), 201 if created else 200)


async def stop_answer(request: web.Request, ask: Ask) -> Reply:
    """Close a window; stopping it again answers the same body."""
    service = request.app[SERVICE]
    edges = service.edges
    window = await (edges.stop(ask.window_id) if edges.knows(ask.window_id)
                    else service.stop_window(ask.window_id, answer=False))
    text = service.book.take_answer_text(window.id)
    # The text the stop encoded once (its ISO times in it): megabytes not encoded again.
    return Reply(None, text=text) if text is not None else _state(window)


# A response body this big (a stop's answer over a large fleet) is followed by a heap trim.
BIG_BODY = 1 << 20


class SentResponse(web.Response):
    """Lets go of its body once sent (aiohttp keeps a connection's last response), then after a
    big one gives freed heap pages back."""

    async def write_eof(self, data: bytes = b"") -> None:
        await super().write_eof(data)
        big = isinstance(self.body, bytes) and len(self.body) >= BIG_BODY
        self.body = None
        if big:
            give_back_free_memory()


def _state(window: Window) -> Reply:
    """A window's state: open, or its stop answer as the stop made it."""
    return Reply(with_iso_times(window.state()))


WINDOW_STATES = ("open", "stopped")
# A list item's aggregate figures; the counts beside the ratios: a fleet's list sums them.
SUMMARY_FIGURES = ("acceptance_rate", "acceptance_length", "num_drafts", "draft_tokens",
                   "accepted_tokens")


def window_summary(state: dict[str, Any]) -> dict[str, Any]:
    """A list item: what a script picks a window by; the full answer is at its `href`."""
    aggregate = state.get("aggregate") or {}
    data = aggregate.get("data") or {}
    return {
        "id": state["id"],
        "name": state.get("name"),
        "state": "open" if state.get("stopped_at") is None else "stopped",
        "targets": state.get("targets") or [],
        "labels": state.get("labels") or {},
        "started_at": state.get("started_at"),
        "stopped_at": state.get("stopped_at"),
        "aggregate": ({"status": aggregate.get("status")}
                      | {figure: data.get(figure) for figure in SUMMARY_FIGURES}
                      if aggregate else None),
        "href": f"/api/v1/windows/{state['id']}",
        "page": f"/windows/{state['id']}",
    }


def list_query(query: Mapping[str, str]) -> tuple[int, str | None]:
    """`limit` (1..MAX_LIST, default MAX_LIST) and `state` (open or stopped), or 400."""
    text = query.get("limit")
    limit = MAX_LIST
    if text is not None:
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_LIST:
            raise RequestError(f"limit must be an integer from 1 to {MAX_LIST}, not {text!r}")
        limit = int(text)
    state = query.get("state")
    if state is not None and state not in WINDOW_STATES:
        raise RequestError(f"state must be open or stopped, not {state!r}")
    return limit, state


async def list_answer(request: web.Request, ask: Ask) -> Reply:
    """Open and recent windows, newest first, as summaries; `?limit=N&state=open|stopped`."""
    service = request.app[SERVICE]
    limit, state = list_query(ask.query)

    def render() -> bytes:
        items = [window_summary(w.state()) for w in service.book.recent()]
        items = [i for i in items if state is None or i["state"] == state][:limit]
        return compact(with_iso_times({"windows": items}))

    return Reply(None, text=_cached(request, f"windows?limit={limit}&state={state}", render))


async def window_answer(request: web.Request, ask: Ask) -> Reply:
    """One window: its open state, or its stop answer."""
    service = request.app[SERVICE]
    if (waiting := service.edges.waiting(ask.window_id)) is not None:
        return Reply(waiting)  # not started yet: no request came through the proxy
    return _state(service.book.get(ask.window_id))


async def series_answer(request: web.Request, ask: Ask) -> Reply:
    """A window's per-scrape series."""
    return Reply(series_view(request.app[SERVICE].book.with_series(ask.window_id)))


async def delete_answer(request: web.Request, ask: Ask) -> Reply:
    """Forget a stopped window (its result files stay); 409 while it is open."""
    request.app[SERVICE].book.delete(ask.window_id)
    return Reply({"id": ask.window_id, "deleted": True})


def send(reply: Reply) -> web.Response:
    """An answer's response, encoded as a stop encodes it (`text` as it is)."""
    return SentResponse(body=reply.text if reply.text is not None else compact(reply.body),
                        status=reply.status, content_type="application/json", charset="utf-8")


async def list_targets(request: web.Request) -> web.Response:
    service = request.app[SERVICE]

    def render() -> bytes:
        view = service.view()
        views = [target_view(s, view.live[n], view.now) for n, s in view.targets.items()]
        return json.dumps(with_iso_times({"targets": views})).encode()

    return web.Response(body=_cached(request, "targets", render), content_type="application/json")
