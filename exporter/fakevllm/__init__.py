"""A simulated vLLM server whose spec-decode counters grow the way real traffic makes them.

- `model`: the counter model (engines, drafts, acceptance, decode steps);
- `families`: the filler of a vLLM page (histograms, process and HTTP families) as data;
- `pages`: one /metrics renderer per dialect of `exporter.core.dialects`;
- `openai`: `/v1/completions` and `/v1/chat/completions`, streamed too;
- `app`: the aiohttp app serving all of it.

Test and demo tooling only: `specdec-exporter serve` never imports this package.
"""

from exporter.core.dialects import SIMULATED_DIALECTS as DIALECTS
from exporter.fakevllm.app import FAKE_SERVER, make_fake_app, serve_fake_vllm
from exporter.fakevllm.model import FakeServer
from exporter.fakevllm.pages import CONTENT_TYPE, RENDERERS, page_for_bench, render_page

__all__ = [
    "CONTENT_TYPE", "DIALECTS", "FAKE_SERVER", "RENDERERS", "FakeServer", "make_fake_app",
    "page_for_bench", "render_page", "serve_fake_vllm",
]
