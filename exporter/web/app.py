"""`make_app(config)`: routes, app keys and lifecycles; no logic of its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from exporter.config.model import Config
from exporter.scrape.scraper import Scraper, make_session
from exporter.server.service import ExporterService
from exporter.state.store import connect_state
from exporter.web.exposition import MetricsWriter
from exporter.web.fanout import FANOUT, Fanout
from exporter.web.handlers import (
    MAX_BODY,
    METRICS_CACHE,
    SERVICE,
    WRITER,
    auth_middleware,
    body_limit_middleware,
    browser_middleware,
    errors_middleware,
)
from exporter.web.proxy import PROXYING, Proxying
from exporter.web.routes import add_routes

log = logging.getLogger(__name__)


def make_app(
    config: Config,
    *,
    config_path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    clock: Callable[[], float] = time.time,
    scrape_loop: bool = True,
    state_connect: Callable[[Path], sqlite3.Connection] = connect_state,
) -> web.Application:
    """The exporter's aiohttp application; with `scrape_loop=False` tests drive the rounds."""
    app = web.Application(
        client_max_size=MAX_BODY,
        middlewares=[errors_middleware, body_limit_middleware, auth_middleware,
                     browser_middleware],
    )
    service = ExporterService(config, config_path=config_path, overrides=overrides, clock=clock,
                              state_connect=state_connect)
    app[SERVICE] = service
    app[FANOUT] = Fanout(service)
    app[WRITER] = MetricsWriter(service.view, extra=lambda om: app[PROXYING].lengths.lines(om))
    app[METRICS_CACHE] = {}
    add_routes(app)
    app.cleanup_ctx.append(_scraping(scrape_loop))
    app.cleanup_ctx.append(app[FANOUT].peers.serve)
    app[PROXYING] = Proxying(service.edges.record, lambda: service.config, service.edges)
    app.cleanup_ctx.append(app[PROXYING].serve)
    service.on_scraped(app[PROXYING].scraped)  # a reload's proxy ports open at its next scrape
    return app


def _scraping(loop: bool) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        service = app[SERVICE]
        session = make_session(service.config.scrape_concurrency)
        scraper = Scraper(
            session,
            max_bytes=service.config.max_response_bytes,
            concurrency=service.config.scrape_concurrency,
        )
        service.use_scraper(scraper)
        task = asyncio.create_task(service.scheduler.run()) if loop else None
        try:
            yield
        finally:
            log.info("shutting down: saving open windows count=%d",
                     len(service.book.open_windows()))
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await scraper.close()
            await session.close()
            service.book.close()

    return lifecycle

