"""A simulated vLLM server whose spec-decode counters grow the way real traffic makes them.

- `model`: the counter model (engines, drafts, acceptance, decode steps);
- `histograms`: vLLM's histogram families as data, and their drawing from the traffic;
- `families`: the filler of a vLLM page (gauges, counters, process and HTTP families);
- `pages`: one /metrics renderer per dialect of `exporter.core.dialects`, reading the model;
- `server`: `FakeServer`, the model with its page (`render()`), and `page_for_bench`;
- `openai`: `/v1/completions` and `/v1/chat/completions`, streamed too;
- `app`: the aiohttp app serving all of it.

Each module imports only those listed above it.

Test and demo tooling only: `specdec-exporter serve` never imports this package.
"""

from exporter.core.dialects import SIMULATED_DIALECTS as DIALECTS
from exporter.fakevllm.app import FAKE_SERVER, make_fake_app, serve_fake_vllm
from exporter.fakevllm.pages import CONTENT_TYPE, RENDERERS, render_page
from exporter.fakevllm.server import FakeServer, page_for_bench

__all__ = [
    "CONTENT_TYPE", "DIALECTS", "FAKE_SERVER", "RENDERERS", "FakeServer", "make_fake_app",
    "page_for_bench", "render_page", "serve_fake_vllm",
]
