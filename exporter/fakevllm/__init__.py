"""A simulated vLLM server whose spec-decode counters grow the way real traffic makes them.
Test and demo tooling only (`serve` never imports it); each module imports only those before
it in: model, histograms, families, pages, server, exposition, openai, app."""

from exporter.fakevllm.app import FAKE_SERVER, make_fake_app, serve_fake_vllm
from exporter.fakevllm.exposition import NameFilter
from exporter.fakevllm.pages import RENDERERS
from exporter.fakevllm.server import FakeServer, page_for_bench

__all__ = ["FAKE_SERVER", "RENDERERS", "FakeServer", "NameFilter", "make_fake_app",
           "page_for_bench", "serve_fake_vllm"]
