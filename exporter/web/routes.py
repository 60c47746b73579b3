"""The one route table: every route of the HTTP API, and whether it covers every shard of a
fleet (`Scope.FLEET`, fanout.py) or this shard alone (`Scope.SHARD`, said in `X-Specdec-Scope`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from aiohttp import web
from aiohttp.typedefs import Handler

from exporter.web import handlers
from exporter.web.fanout import FANOUT, Fanout
from exporter.web.historyroute import history_window
from exporter.web.proxy import main_listener_proxy

SCOPE_HEADER = "X-Specdec-Scope"


class Scope(StrEnum):
    """What a route's answer covers when the exporter is one shard of several."""

    FLEET = "fleet"  # every shard's targets: the peers are asked and the answers merged
    SHARD = "shard"  # this shard alone (its own /metrics, health, config, targets)


FleetHandler = Callable[[Fanout, web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    """One route: its local handler, and for a fleet route the fan-out that merges."""

    method: str
    path: str
    handler: Handler
    scope: Scope
    fleet: FleetHandler | None = None

    def __post_init__(self) -> None:
        if (self.scope is Scope.FLEET) != (self.fleet is not None):
            raise ValueError(f"{self.method} {self.path}: a fleet route needs its fan-out")


ROUTES = (
    Route("GET", "/", handlers.landing, Scope.SHARD),
    Route("GET", "/windows/{id}", handlers.window_page, Scope.FLEET, Fanout.window_page),
    # Every shard exports its own targets; Prometheus scrapes each shard.
    Route("GET", "/metrics", handlers.metrics, Scope.SHARD),
    Route("GET", "/compare", handlers.compare_page, Scope.FLEET, Fanout.compare_page),
    Route("GET", "/-/healthy", handlers.healthy, Scope.SHARD),
    Route("GET", "/-/ready", handlers.ready, Scope.SHARD),
    Route("POST", "/-/reload", handlers.reload, Scope.SHARD),
    Route("POST", "/api/v1/windows", handlers.start_window, Scope.FLEET, Fanout.start),
    # Counted from the store, which holds every shard's targets: kept by the shard asked.
    Route("POST", "/api/v1/windows/history", history_window, Scope.SHARD),
    Route("GET", "/api/v1/windows", handlers.list_windows, Scope.FLEET, Fanout.list),
    Route("GET", "/api/v1/windows/{id}", handlers.get_window, Scope.FLEET, Fanout.get),
    Route("DELETE", "/api/v1/windows/{id}", handlers.delete_window, Scope.FLEET,
          Fanout.delete),
    Route("POST", "/api/v1/windows/{id}/stop", handlers.stop_window, Scope.FLEET, Fanout.stop),
    Route("GET", "/api/v1/windows/{id}/series", handlers.window_series, Scope.FLEET,
          Fanout.series_answer),
    Route("GET", "/api/v1/targets", handlers.list_targets, Scope.SHARD),
    # A target's proxy lives on the shard that scrapes it.
    Route("*", "/proxy/{target}/{tail:.*}", main_listener_proxy, Scope.SHARD),
)

_SCOPE: web.RequestKey[Scope] = web.RequestKey("scope", Scope)


def _dispatch(route: Route) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        fanout = request.app[FANOUT]
        request[_SCOPE] = route.scope
        if route.fleet is not None and fanout.active(request):
            return await route.fleet(fanout, request)
        return await route.handler(request)

    return handle


async def _say_scope(request: web.Request, response: web.StreamResponse) -> None:
    # on_response_prepare: also for a streamed answer, whose headers go before its body.
    fanout = request.app[FANOUT]
    if request.get(_SCOPE) is Scope.SHARD and fanout.sharded():
        config = fanout.config
        response.headers[SCOPE_HEADER] = (
            f"shard {config.shard_index} of {config.shards}: this shard's targets only")


def add_routes(app: web.Application) -> None:
    for route in ROUTES:
        if route.method == "GET":  # and HEAD, as aiohttp's add_get gives
            app.router.add_get(route.path, _dispatch(route))
        else:
            app.router.add_route(route.method, route.path, _dispatch(route))
    app.on_response_prepare.append(_say_scope)
