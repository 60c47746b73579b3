"""Calls from one shard to its peers: one session, a bounded wait, the whole answer read and
decoded as our answers are encoded (orjson, else the stdlib's JSON)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from exporter.config.model import Config
from exporter.core.shards import ShardPart

log = logging.getLogger(__name__)

PEER_HEADER = "X-Specdec-Peer"  # set on calls between shards: act locally, do not fan out
# Below the CLI client's 60 s: a stop answers (that peer's targets N/A) before the client gives up.
PEER_TIMEOUT = 25.0
# A stop answer over thousands of targets is a few megabytes; past this it is no answer of ours.
MAX_PEER_ANSWER = 64 * 1024 * 1024


def decode_answer(raw: bytes) -> object:
    """orjson, else the stdlib (which wrote what orjson refuses: a NaN, a big int); else None."""
    with contextlib.suppress(orjson.JSONDecodeError):
        return orjson.loads(raw)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


async def read_whole(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """Every byte of the body, however it is chunked; None past `limit` bytes."""
    if (response.content_length or 0) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class Peers:
    """The peers of one shard, called over one session with the token and the peer marker."""

    def __init__(self, config: Callable[[], Config]):
        self.config = config
        self.timeout = PEER_TIMEOUT
        self.max_answer = MAX_PEER_ANSWER
        self.session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        headers = {PEER_HEADER: "1"}
        if token := os.environ.get(self.config().auth.token_env):
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def call(self, index: int, method: str, path: str,
                   body: dict[str, Any] | None) -> ShardPart:
        """Peer `index`'s answer as a part: its JSON object, or why none."""
        url = self.config().peers[index]
        part = ShardPart(index, url)
        assert self.session is not None, "the session starts with the app"
        try:
            async with self.session.request(
                method, url + path, json=body, headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as response:
                part.status = response.status
                raw = await read_whole(response, self.max_answer)
        except TimeoutError:
            part.status, part.error = None, f"no answer within {self.timeout:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            part.status, part.error = None, str(exc) or type(exc).__name__
        else:
            self._read(part, raw)
        if part.answer is None:
            log.warning("peer call failed shard=%d url=%s error=%s", index, url, part.error)
        return part

    def _read(self, part: ShardPart, raw: bytes | None) -> None:
        data = decode_answer(raw) if raw is not None else None
        if raw is None:
            part.error = f"its answer is over {self.max_answer} bytes"
        elif not isinstance(data, dict):
            part.error = "its answer is not a JSON object"
        elif part.status is not None and part.status >= 400:
            part.error = str(data.get("error") or f"HTTP {part.status}")[:1000]
        else:
            part.answer = data

    async def serve(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: the one session for calls to peers (no proxy: peers are our shards)."""
        self.session = aiohttp.ClientSession(trust_env=False)
        try:
            yield
        finally:
            await self.session.close()
