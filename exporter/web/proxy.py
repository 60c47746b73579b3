"""The recording proxy: relays a benchmark's OpenAI traffic to a target, unchanged, and records
each answer's per-request spec-decode figures.

Pass-through comes first: the client sees the upstream's status, headers and bytes as they
arrive (server-sent events chunk by chunk), and recording never fails a request. What we parse
is bounded (`parse_limit`); an answer we cannot read is relayed all the same and counted
unreadable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from exporter.core.perrequest import RequestStats, from_json, from_sse

PARSE_LIMIT = 4 * 1024 * 1024  # an answer larger than this is relayed, not parsed
# Headers of one hop (RFC 9110 7.6.1), and Host, which names the proxy, not the upstream.
_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
    "Transfer-Encoding", "Upgrade", "Host", "Content-Length"))

RecordFn = Callable[[str, RequestStats | None], None]


@dataclass(frozen=True)
class Upstream:
    """Where one target's API lives and what to call with each recorded answer."""

    target: str
    origin: str  # scheme://host:port
    record: RecordFn


def _forwarded(headers: CIMultiDict[str] | object) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in getattr(headers, "items")():
        if key.lower() not in _HOP:
            out.add(key, value)
    return out


def _recorded(request: web.Request) -> bool:
    """Only (chat) completion answers carry per-request figures."""
    return request.method == "POST" and request.path.rstrip("/").endswith("completions")


async def relay(request: web.Request, session: aiohttp.ClientSession, upstream: Upstream,
                path: str, parse_limit: int = PARSE_LIMIT) -> web.StreamResponse:
    """Forward one request to the upstream and relay its answer as it arrives."""
    url = upstream.origin + path + (f"?{request.query_string}" if request.query_string else "")
    body = request.content if request.body_exists else None
    try:
        answer = await session.request(request.method, url, headers=_forwarded(request.headers),
                                       data=body, allow_redirects=False)
    except (aiohttp.ClientError, OSError) as exc:
        return web.json_response({"error": f"upstream {upstream.origin} failed: {exc}"},
                                 status=502)
    async with answer:
        response = web.StreamResponse(status=answer.status, reason=answer.reason,
                                      headers=_forwarded(answer.headers))
        if answer.content_length is not None:
            response.content_length = answer.content_length
        await response.prepare(request)
        kept: list[bytes] | None = [] if _recorded(request) else None
        size = 0
        # A client that goes away makes write() raise, which leaves this block and closes
        # the upstream connection: the upstream request is cancelled with it.
        async for chunk in answer.content.iter_any():
            await response.write(chunk)
            if kept is not None:
                size += len(chunk)
                if size > parse_limit:
                    kept = None
                    upstream.record(upstream.target, None)
                    continue
                kept.append(chunk)
        await response.write_eof()
    if kept is not None:
        upstream.record(upstream.target, _read(answer.headers.get("Content-Type", ""),
                                               b"".join(kept)))
    return response


def _read(content_type: str, body: bytes) -> RequestStats | None:
    if "text/event-stream" in content_type:
        return from_sse(body)
    return from_json(body)


def proxy_app(upstream: Upstream, session: aiohttp.ClientSession,
              parse_limit: int = PARSE_LIMIT) -> web.Application:
    """An app that forwards every path and method to one target (a per-target listen port)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        return await relay(request, session, upstream, request.raw_path.split("?")[0],
                           parse_limit)

    app = web.Application(client_max_size=0)
    app.router.add_route("*", "/{tail:.*}", handler)
    return app
