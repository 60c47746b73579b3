"""HTTP handlers: validate -> call the service -> json_response. No math, no parsing here."""

from __future__ import annotations

import hmac
import json
import logging
import os

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from exporter.errors import ConfigError, ExporterError, RequestError, StoreError
from exporter.landing import render_landing
from exporter.service import ExporterService
from exporter.views import target_view
from exporter.window import check_window_id

SERVICE = web.AppKey("service", ExporterService)
REGISTRY = web.AppKey("registry", CollectorRegistry)
MAX_BODY = 64 * 1024

log = logging.getLogger(__name__)


class WindowRequest(BaseModel):
    """Body of `POST /api/v1/windows`; every field optional, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str | None = None
    name: str | None = None
    targets: list[str] | None = None
    labels: dict[str, str] = {}

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        return None if value is None else check_window_id(value)


def error_response(status: int, message: str, **extra) -> web.Response:
    """The one shape of every error answer: {"error": "..."}."""
    return web.json_response({"error": message} | extra, status=status)


@web.middleware
async def errors_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Turn our errors and aiohttp's HTTP exceptions into JSON errors with the right status."""
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(exc.status, str(exc))
    except StoreError as exc:
        log.error("store failure error=%s", exc)
        return error_response(503, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason if exc.text is None else _text(exc))


def _text(exc: web.HTTPException) -> str:
    text = exc.text or exc.reason
    return text.removeprefix(f"{exc.status}: ")


@web.middleware
async def auth_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every POST needs the bearer token when the configured environment variable is set."""
    if request.method == "POST":
        token = os.environ.get(request.app[SERVICE].config.auth.token_env, "")
        if token:
            given = request.headers.get("Authorization", "")
            expected = f"Bearer {token}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                reason = "token missing" if not given else "token wrong"
                return error_response(401, f"{reason}: send Authorization: Bearer <token>")
    return await handler(request)


async def _json_body(request: web.Request) -> dict:
    raw = await request.read()  # client_max_size answers 413 past MAX_BODY
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("body must be a JSON object")
    return body


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "body"
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        parts.append(f"{where}: {message.removeprefix('Value error, ')}")
    return "; ".join(parts)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition of the exporter."""
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def landing(request: web.Request) -> web.Response:
    """The HTML landing page."""
    return web.Response(text=render_landing(request.app[SERVICE]), content_type="text/html")


async def healthy(request: web.Request) -> web.Response:
    """Alive."""
    return web.Response(text="OK\n")


async def ready(request: web.Request) -> web.Response:
    """Config loaded and the first scrape round done."""
    if not request.app[SERVICE].ready:
        return web.Response(status=503, text="first scrape round not done\n")
    return web.Response(text="OK\n")


async def reload(request: web.Request) -> web.Response:
    """Re-read the config file; an invalid one is refused and the old one keeps serving."""
    try:
        config = request.app[SERVICE].reload()
    except ConfigError as exc:
        return error_response(400, str(exc), problems=exc.problems)
    return web.json_response({"status": "reloaded", "targets": len(config.targets)})


async def start_window(request: web.Request) -> web.Response:
    """Open a window: 201 when new, 200 with the same window when the id exists."""
    try:
        body = WindowRequest.model_validate(await _json_body(request))
    except ValidationError as exc:
        raise RequestError(_validation_message(exc)) from None
    created, window = await request.app[SERVICE].start_window(
        body.id, body.name, body.targets, body.labels
    )
    return web.json_response(window.summary(), status=201 if created else 200)


async def stop_window(request: web.Request) -> web.Response:
    """Close a window; stopping it again answers the same body."""
    window_id = check_window_id(request.match_info["id"])
    window = await request.app[SERVICE].stop_window(window_id)
    return web.json_response(window.answer)


async def list_windows(request: web.Request) -> web.Response:
    """Open and recent windows."""
    windows = request.app[SERVICE].list_windows()
    return web.json_response({"windows": [w.state() for w in windows]})


async def get_window(request: web.Request) -> web.Response:
    """One window: its open state, or its stop answer."""
    window = request.app[SERVICE].get_window(check_window_id(request.match_info["id"]))
    return web.json_response(window.state())


async def list_targets(request: web.Request) -> web.Response:
    """Every target's state as JSON (what the landing page shows)."""
    service = request.app[SERVICE]
    now = service.clock()
    views = [target_view(s, service.live[n], now) for n, s in service.targets.items()]
    return web.json_response({"targets": views})


def add_routes(app: web.Application) -> None:
    """Every route of CONTRACT.md's HTTP API."""
    app.router.add_get("/", landing)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    app.router.add_post("/-/reload", reload)
    app.router.add_post("/api/v1/windows", start_window)
    app.router.add_get("/api/v1/windows", list_windows)
    app.router.add_get("/api/v1/windows/{id}", get_window)
    app.router.add_post("/api/v1/windows/{id}/stop", stop_window)
    app.router.add_get("/api/v1/targets", list_targets)


__all__ = ["ExporterError", "REGISTRY", "SERVICE", "add_routes", "errors_middleware"]
