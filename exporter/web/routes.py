"""The one route table: every route of the HTTP API, and whether it covers every shard of a
fleet (`Scope.FLEET`: one answer per route, merged by the route's merge) or this shard alone
(`Scope.SHARD`, said in `X-Specdec-Scope`); and the pages made of fleet answers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Literal, cast

from aiohttp import web
from aiohttp.typedefs import Handler

from exporter.core import shards
from exporter.core.errors import RequestError
from exporter.core.window import check_window_id
from exporter.web import handlers
from exporter.web.fanout import FANOUT, Answer, Ask, Fleet, Reply
from exporter.web.historyroute import history_window
from exporter.web.pages.compare import render_compare, render_picker
from exporter.web.pages.window import render_window_page
from exporter.web.proxy import main_listener_proxy

SCOPE_HEADER = "X-Specdec-Scope"


class Scope(StrEnum):
    """What a route's answer covers when the exporter is one shard of several."""

    FLEET = "fleet"  # every shard's targets: the peers are asked and the answers merged
    SHARD = "shard"  # this shard alone (its own /metrics, health, config, targets)


# A page's fleet: the fleet answers it shows, each merged by its own route.
PAGE: Final = "page"


@dataclass(frozen=True)
class Route:
    """One route: its handler, or for a fleet route its answer and how the answers merge."""

    method: str
    path: str
    handler: Handler | Answer
    fleet: Fleet | Literal["page"] | None = None  # None: this shard alone

    @property
    def scope(self) -> Scope:
        """What the route's answer covers: the fleet when it has a fan-out."""
        return Scope.SHARD if self.fleet is None else Scope.FLEET


WINDOW = Route("GET", "/api/v1/windows/{id}", handlers.window_answer, Fleet(shards.merged_window))
SERIES = Route("GET", "/api/v1/windows/{id}/series", handlers.series_answer,
               Fleet(shards.merged_series))
WINDOWS = Route("GET", "/api/v1/windows", handlers.list_answer, Fleet(shards.merged_list))


async def _reply(route: Route, request: web.Request, ask: Ask | None = None) -> Reply:
    """A fleet route's answer to `request` (or to `ask`): this shard's, or the fleet's merged."""
    assert isinstance(route.fleet, Fleet)
    fanout = request.app[FANOUT]
    ask = ask or await fanout.ask(request, route.fleet)
    return await fanout.answer(request, cast(Answer, route.handler), route.fleet, ask)


async def _shown(route: Route, request: web.Request, window_id: str = "") -> Any:
    """What a page shows of a fleet route's answer: asked as `request` is (of the fleet or not)."""
    path = route.path.format(id=window_id)
    ask = Ask("GET", path, window_id, fleet=request.app[FANOUT].active(request))
    return (await _reply(route, request, ask)).json()


async def window_page(request: web.Request) -> web.Response:
    """A window's page: its answer and series."""
    window_id = check_window_id(request.match_info["id"])
    state, series = await asyncio.gather(_shown(WINDOW, request, window_id),
                                         _shown(SERIES, request, window_id))
    text = render_window_page(state, series | {"now": request.app[handlers.SERVICE].clock()})
    return web.Response(text=text, content_type="text/html")


async def compare_page(request: web.Request) -> web.Response:
    """Two stopped windows side by side, or the form to pick them."""
    windows = (await _shown(WINDOWS, request))["windows"]
    a_id, b_id = request.query.get("a"), request.query.get("b")
    if not a_id and not b_id:
        return web.Response(text=render_picker(windows), content_type="text/html")
    if not a_id or not b_id:
        raise RequestError("give both windows: /compare?a=ID&b=ID")
    answers = []
    for window_id in (a_id, b_id):
        found = await _shown(WINDOW, request, check_window_id(window_id))
        if "results" not in found:
            raise RequestError(f'window "{window_id}" is still open; stop it first', status=409)
        answers.append(found)
    text = render_compare(answers[0], answers[1], windows)
    return web.Response(text=text, content_type="text/html")


ROUTES = (
    Route("GET", "/", handlers.landing),
    Route("GET", "/windows/{id}", window_page, PAGE),
    # Every shard exports its own targets; Prometheus scrapes each shard.
    Route("GET", "/metrics", handlers.metrics),
    Route("GET", "/compare", compare_page, PAGE),
    Route("GET", "/-/healthy", handlers.healthy),
    Route("GET", "/-/ready", handlers.ready),
    Route("POST", "/-/reload", handlers.reload),
    Route("POST", "/api/v1/windows", handlers.start_answer,
          Fleet(shards.merged_start, opens=True)),
    # Counted from the store, which holds every shard's targets: kept by the shard asked.
    Route("POST", "/api/v1/windows/history", history_window),
    WINDOWS,
    WINDOW,
    Route("DELETE", "/api/v1/windows/{id}", handlers.delete_answer,
          Fleet(shards.merged_delete, refuses=(RequestError,))),
    Route("POST", "/api/v1/windows/{id}/stop", handlers.stop_answer, Fleet(shards.merged_stop)),
    SERIES,
    Route("GET", "/api/v1/targets", handlers.list_targets),
    # A target's proxy lives on the shard that scrapes it.
    Route("*", "/proxy/{target}/{tail:.*}", main_listener_proxy),
)

_SCOPE: web.RequestKey[Scope] = web.RequestKey("scope", Scope)


def _dispatch(route: Route) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        request[_SCOPE] = route.scope
        if isinstance(route.fleet, Fleet):
            return handlers.send(await _reply(route, request))
        return await cast(Handler, route.handler)(request)

    return handle


async def _say_scope(request: web.Request, response: web.StreamResponse) -> None:
    # on_response_prepare: also for a streamed answer, whose headers go before its body.
    if request.get(_SCOPE) is Scope.SHARD and request.app[FANOUT].sharded():
        config = request.app[handlers.SERVICE].config
        response.headers[SCOPE_HEADER] = (
            f"shard {config.shard_index} of {config.shards}: this shard's targets only")


def add_routes(app: web.Application) -> None:
    for route in ROUTES:
        if route.method == "GET":  # and HEAD, as aiohttp's add_get gives
            app.router.add_get(route.path, _dispatch(route))
        else:
            app.router.add_route(route.method, route.path, _dispatch(route))
    app.on_response_prepare.append(_say_scope)
