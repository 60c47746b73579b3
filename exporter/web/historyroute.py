"""`POST /api/v1/windows/history`: a stopped window counted from a store's raw samples as the
`history` command counts them, then kept like one stopped here (listed, paged, compared)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any, TypeVar

from aiohttp import web
from pydantic import ValidationError

from exporter.config.model import HistoryConfig, StoreAuth
from exporter.core.errors import ExporterError, RequestError
from exporter.core.isotime import parse_time
from exporter.core.redact import redact_url
from exporter.core.window import MAX_NAME, Window, check_window_id, new_window_id
from exporter.scrape.storequery import HistoryQuery, check_range, selectors
from exporter.server.isolate import ChildError
from exporter.server.storewindow import STORE_FAULTS, history_work, read_budget
from exporter.state.answertext import compact
from exporter.web.bodies import json_body
from exporter.web.handlers import SERVICE

log = logging.getLogger(__name__)

_T = TypeVar("_T")
# How often a long read looks whether its client is still there (aiohttp does not cancel a
# handler whose client left).
_CLIENT_CHECK_SECONDS = 0.25
_KEYS = {"prometheus", "from", "to", "match", "by", "id", "name"}


def _strings(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key, [])
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RequestError(f'"{key}" must be a string or a list of strings')
    return value


def _time(body: dict[str, Any], key: str) -> float:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RequestError(f'"{key}" is required: ISO 8601, Unix seconds, "-30m" or "now"')
    try:
        return parse_time(str(value))
    except ValueError as exc:
        raise RequestError(f'"{key}": {exc}') from None


def _store(body: dict[str, Any], history: HistoryConfig) -> tuple[str, StoreAuth]:
    """The store a request names and the credentials configured for it: a store the config
    does not name is refused, as our credentials and our network position are not for anyone's
    URL."""
    url = body.get("prometheus", history.prometheus)
    if not isinstance(url, str) or not url:
        raise RequestError('"prometheus": no store URL given, and no history.prometheus in '
                           "the config")
    try:
        url = HistoryConfig(prometheus=url).prometheus or url  # the config's own URL rule
    except ValidationError as exc:
        why = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise RequestError(f'"prometheus": {why}') from None
    auth = history.store_auth(url)
    if auth is None:
        known = [s for s in (history.prometheus, *(a.url for a in history.allowed_stores)) if s]
        raise RequestError(f'"prometheus": {redact_url(url)} is not a configured store; allowed: '
                           f"{', '.join(map(redact_url, known)) or 'none'} (history.prometheus "
                           "and history.allowed_stores in the config)")
    return url, auth


def _query(body: dict[str, Any], history: HistoryConfig) -> HistoryQuery:
    """The store read a request asks for, or a 400 saying what is wrong with it."""
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise RequestError(f"unknown keys: {', '.join(unknown)}; "
                           f"allowed: {', '.join(sorted(_KEYS))}")
    url, auth = _store(body, history)
    frm, to, match = _time(body, "from"), _time(body, "to"), _strings(body, "match")
    try:
        check_range(frm, to)
        selectors(match)
    except ExporterError as exc:
        raise RequestError(str(exc)) from None
    return HistoryQuery(url, frm, to, match, auth, timeout=history.timeout)


async def _while_connected(request: web.Request, work: Awaitable[_T],
                           cancel: threading.Event) -> _T:
    """`work`'s outcome; if the client leaves first, `cancel` is set, `work` cancelled and
    this request ends: no further store query is sent for it."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_CLIENT_CHECK_SECONDS)
            if done:
                return task.result()
            transport = request.transport
            if transport is None or transport.is_closing():
                log.info("history window abandoned: the client left; store queries stopped")
                raise asyncio.CancelledError
    finally:
        if not task.done():
            cancel.set()
            task.cancel()


def _named(body: dict[str, Any]) -> tuple[str | None, str]:
    """The window's id (as given, or None for a new one) and name, or a 400 saying why, as a
    start's are checked."""
    given = body.get("id")
    window_id = check_window_id(given) if given is not None else None
    name = body.get("name", "history")
    if not isinstance(name, str):
        raise RequestError('"name" must be a string')
    if len(name) > MAX_NAME:
        raise RequestError(f"name must be at most {MAX_NAME} characters")
    return window_id, name


async def history_window(request: web.Request) -> web.Response:
    """Count the store's samples over the range off the loop, as a stop's answer is made, and
    keep the result as a stopped window."""
    service = request.app[SERVICE]
    body = await json_body(request)
    query = _query(body, service.config.history)
    window_id, name = _named(body)
    window = Window(id=window_id or new_window_id(query.frm), name=name, targets={},
                    labels={}, started_at=query.frm, stopped_at=query.to)
    cancel = threading.Event()
    query = replace(query, cancel=cancel)
    directory = service.book.results_dir(window.id)
    work = history_work(query, window, _strings(body, "by"), directory)
    try:
        await _while_connected(
            request, service.book.made(window, work, timeout=read_budget(query)), cancel)
    except ChildError as exc:
        if exc.kind not in STORE_FAULTS:
            raise
        # The store, not the request: down, refusing, over a limit or not making sense.
        raise RequestError(f"the store at {redact_url(query.url)}: {exc}", status=502) from None
    text = service.book.take_answer_text(window.id)
    if text is None:  # taken by a GET meanwhile: the stored answer is the same
        text = compact(service.book.get(window.id).state())
    return web.Response(body=text, status=201, content_type="application/json")
