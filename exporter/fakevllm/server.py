"""The simulated server: the counter model of `model` and the page `pages` renders from it."""

from __future__ import annotations

import math

from exporter.fakevllm.model import ServerModel
from exporter.fakevllm.pages import RENDERERS


class FakeServer(ServerModel):
    """A simulated vLLM server: spec-decode counters per engine and the page that shows them."""

    def render(self) -> bytes:
        """The full /metrics page of this server's dialect, Prometheus text format 0.0.4."""
        return RENDERERS[self.dialect](self)


def page_for_bench(engines: int, target_bytes: int | None = None, seed: int = 0) -> bytes:
    """Return a realistic page; with target_bytes, add LoRA model variants until it is that big."""
    server = FakeServer(engines=engines, seed=seed)
    server.simulate(4000 * engines)
    page = server.render()
    if target_bytes is None or len(page) >= target_bytes:
        return page
    server.lora_adapters = 1
    per_variant = max(1, len(server.render()) - len(page))
    server.lora_adapters = max(1, math.ceil((target_bytes - len(page)) / per_variant))
    page = server.render()
    while len(page) < target_bytes:
        server.lora_adapters += 1
        page = server.render()
    return page
