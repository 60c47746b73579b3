"""The app keys every part of the web layer reads, in a module that imports none of those parts."""

from __future__ import annotations

from aiohttp import web

from exporter.server.service import ExporterService
from exporter.web.exposition import MetricsWriter

SERVICE = web.AppKey("service", ExporterService)
WRITER = web.AppKey("writer", MetricsWriter)
# key -> (service generation, monotonic time, rendered bytes)
METRICS_CACHE: web.AppKey[dict[str, tuple[int, float, bytes]]] = web.AppKey("metrics_cache", dict)
