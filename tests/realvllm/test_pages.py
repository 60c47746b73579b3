"""fake-vllm held beside the real servers, live: the same spec-decode families, labels and
samples on /metrics, and answers carrying figures where vLLM carries them."""

from __future__ import annotations

import pytest
from clitools import fake_vllm
from fakevllm.shapes import REQUESTS, answer_traits, page_shape, page_values, request_body

from exporter.fakevllm import FakeServer
from realvllm import servers
from realvllm.conftest import get, post


class TestPages:
    @pytest.mark.parametrize(("server", "k"), [("ngram", 3), ("draft", 5)])
    def test_a_fresh_server_shows_every_position_at_zero_with_created(self, fleet, server, k):
        page = fleet.first_pages[server]
        assert page_shape(page) == page_shape(FakeServer(k=k).render())
        values = page_values(page)
        assert sorted(p for (_, p) in values if p) == [str(p) for p in range(k)]
        assert set(values.values()) == {0.0}
        assert b"vllm:spec_decode_num_drafts_created{" in page

    def test_a_live_page_has_the_shape_of_fake_vllms(self, fleet):
        fake = FakeServer(k=3)
        fake.simulate(50)
        assert page_shape(get(fleet.ngram.metrics_url)) == page_shape(fake.render())


class TestAnswers:
    def test_fake_answers_carry_figures_where_the_real_ones_do(self, fleet):
        real, traits = fleet.ngram.base_url, {}
        with fake_vllm("--k", "3", "--per-request-spec-decode-metrics", "summary") as port:
            for name, (path, extra) in REQUESTS.items():
                stream = bool(extra.get("stream"))
                body = request_body(servers.MODEL_NAME, path, extra)
                traits[name] = (answer_traits(post(real + path, body), stream),
                                answer_traits(post(f"http://127.0.0.1:{port}{path}", body),
                                              stream))
        for name, (vllm, fake) in traits.items():
            assert fake == vllm, name
