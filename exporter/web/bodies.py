"""Request bodies: the JSON object of a POST, read once, and the window start's model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from aiohttp import web
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from exporter.core.errors import RequestError
from exporter.core.text import TextError, clean_tree
from exporter.core.window import check_window_id


class WindowRequest(BaseModel):
    """Body of `POST /api/v1/windows`; every field optional, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str | None = None
    name: str | None = None
    targets: list[str] | None = None
    labels: dict[str, str] = {}
    # "traffic": opened at the first measured request through the recording proxy, closed on
    # the scrape after the last response (server/edges.py); "command" (default): start to stop.
    edges: Literal["command", "traffic"] | None = None
    skip_requests: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _skip_needs_traffic(self) -> WindowRequest:
        if self.skip_requests is not None and self.edges != "traffic":
            raise ValueError('skip_requests needs "edges": "traffic"')
        return self

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        return None if value is None else check_window_id(value)


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object ({} for an empty body), or a 400 saying what is wrong."""
    raw = await request.read()  # client_max_size answers 413 past MAX_BODY
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError("body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError("body must be a JSON object")
    try:
        cleaned: dict[str, Any] = clean_tree(body)  # a dict in, the same shape out
        return cleaned
    except TextError as exc:
        raise RequestError(str(exc)) from None
    except RecursionError:
        raise RequestError("body is nested too deeply") from None


def window_request(body: Mapping[str, Any]) -> WindowRequest:
    """The body of a window start, validated (a 400 names each problem: `where: what`)."""
    try:
        return WindowRequest.model_validate(body)
    except ValidationError as exc:
        parts = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "body"
            message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
            parts.append(f"{where}: {message.removeprefix('Value error, ')}")
        raise RequestError("; ".join(parts)) from None

