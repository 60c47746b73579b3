"""`POST /api/v1/windows/history`: a stopped window counted from a store's raw samples as the
`history` command counts them, then kept like one stopped here (listed, paged, compared)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from exporter.config.model import HistoryConfig, StoreAuth
from exporter.core.errors import ExporterError, RequestError
from exporter.core.history import history_answer
from exporter.core.isotime import parse_time, with_iso_times
from exporter.core.redact import redact_url
from exporter.core.window import TargetRef, Window, check_window_id
from exporter.scrape.history import HistoryQuery, check_range, fetch_series
from exporter.state.answertext import compact
from exporter.web.bodies import json_body
from exporter.web.keys import SERVICE

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
    frm, to = _time(body, "from"), _time(body, "to")
    try:
        check_range(frm, to)
    except ExporterError as exc:
        raise RequestError(str(exc)) from None
    return HistoryQuery(url, frm, to, _strings(body, "match"), auth, timeout=history.timeout)


async def history_window(request: web.Request) -> web.Response:
    """Count the store's samples over the range and keep the result as a stopped window."""
    service = request.app[SERVICE]
    body = await json_body(request)
    query = _query(body, service.config.history)
    window_id = check_window_id(body["id"]) if isinstance(body.get("id"), str) else None
    name = body.get("name", "history")
    if not isinstance(name, str):
        raise RequestError('"name" must be a string')
    try:
        read = await asyncio.to_thread(fetch_series, query)
    except ExporterError as exc:
        # The store, not the request: down, refusing or over a limit.
        raise RequestError(f"the store at {query.url}: {exc}", status=502) from None
    answer = history_answer(read.series, query.frm, query.to, query_url=query.url,
                            by=_strings(body, "by"), name=name, window_id=window_id,
                            notes=read.notes)
    window = Window(id=answer["id"], name=name,
                    targets={t: TargetRef(t, t, t) for t in answer["results"]}, labels={},
                    started_at=query.frm, stopped_at=query.to, answer=answer)
    service.book.record_stopped(window)
    answer = answer | {"results_dir": str(service.book.results_dir(window.id).resolve())}
    return web.Response(body=compact(with_iso_times(answer)), status=201,
                        content_type="application/json")
