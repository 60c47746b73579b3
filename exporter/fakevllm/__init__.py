"""A simulated vLLM server whose spec-decode counters grow the way real traffic makes them.

Its modules `model`, `histograms`, `families`, `pages`, `server`, `openai`, `app` (docs/design.md
says what each holds) each import only those before them. Test and demo tooling only:
`specdec-exporter serve` never imports this package.
"""

from exporter.core.dialects import SIMULATED_DIALECTS as DIALECTS
from exporter.fakevllm.app import FAKE_SERVER, make_fake_app, serve_fake_vllm
from exporter.fakevllm.pages import CONTENT_TYPE, RENDERERS, render_page
from exporter.fakevllm.server import FakeServer, page_for_bench

__all__ = [
    "CONTENT_TYPE", "DIALECTS", "FAKE_SERVER", "RENDERERS", "FakeServer", "make_fake_app",
    "page_for_bench", "render_page", "serve_fake_vllm",
]
