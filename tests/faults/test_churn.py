"""Series whose label values change every scrape cost bounded work per scrape.

A server renaming its model every second (500 series without an `engine` label) made every
scrape compare each new series with every series ever seen: the accounting cost grew with the
history until the exporter stopped answering. Series that vanish are remembered (their last
value, in case they come back) up to `MAX_ABSENT_SERIES`; past it the oldest go, their increase
kept under one retired key, so nothing counted is lost.
"""

from __future__ import annotations

import statistics
import time

import pytest

from exporter.core.counting import MAX_ABSENT_SERIES, RETIRED_MODEL
from faults.checks import still_serving, value
from faults.servers import RawTarget

MODELS = 100  # x (3 counters + 2 positions) = 500 series per page, all renamed every scrape
NAMES = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
         "vllm:spec_decode_num_accepted_tokens")


def churn_page(generation: int) -> bytes:
    """Generation `generation`'s models, each with drafts 2, draft tokens 4, accepted 3 (2+1)."""
    models = [f"model-{generation}-{i}" for i in range(MODELS)]
    lines = []
    for name, count in zip(NAMES, (2, 4, 3), strict=True):
        lines.append(f"# TYPE {name} counter")
        lines += [f'{name}_total{{model_name="{m}"}} {count}.0' for m in models]
    per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines.append(f"# TYPE {per_pos} counter")
    for m in models:
        lines += [f'{per_pos}_total{{model_name="{m}",position="0"}} 2.0',
                  f'{per_pos}_total{{model_name="{m}",position="1"}} 1.0']
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
async def churning():
    server = await RawTarget().start()
    generations = iter(range(10**6))
    server.page = lambda: churn_page(next(generations))
    yield server
    await server.stop()


def _kept(acc) -> int:
    return len(acc.last) + len(acc.gone) + len(acc.increase)


class TestChurn:
    async def test_work_per_scrape_stays_flat_and_nothing_counted_is_lost(
        self, exporter, churning
    ):
        exp = await exporter({"targets": [{"name": "c", "url": churning.url}]})
        await exp.round()
        await exp.start(id="w1")  # baseline: generation 1
        # Enough scrapes to fill the absent-series memory twice over, then as many again.
        fill = 2 * MAX_ABSENT_SERIES // (5 * MODELS) + 2
        costs, sizes = [], []
        for _ in range(2 * fill):
            started = time.perf_counter()
            await exp.round()
            response = await exp.client.get("/metrics")
            assert response.status == 200
            await response.read()
            costs.append(time.perf_counter() - started)
            window = exp.service.book.get("w1")
            sizes.append(_kept(window.accumulators["c"]))
        # Counted, not timed: what each accumulator keeps is bounded by the page plus the
        # absent-series memory (x3: last value, when seen, increase), whatever the history.
        bound = 3 * (5 * MODELS + MAX_ABSENT_SERIES) + 5 * 3
        assert max(sizes) <= bound, (max(sizes), bound)
        assert sizes[-1] == sizes[fill]  # flat once full
        live = exp.service.view().live["c"].accumulator
        assert _kept(live) <= bound
        # Relative, in the same run: the last scrapes cost about what the first full ones did.
        early = statistics.median(costs[fill // 2 : fill])
        late = statistics.median(costs[-fill // 2 :])
        assert late < 3 * early, (early, late)

        answer = await exp.stop("w1")
        result = answer["results"]["c"]
        # Every generation after the baseline appeared whole inside the window: 2 drafts per
        # model per scrape, the retired series' share included.
        scrapes_after_baseline = 2 * fill + 1  # the rounds, plus the stop's scrape
        assert result["data"]["num_drafts"] == 2 * MODELS * scrapes_after_baseline
        assert result["data"]["draft_tokens"] == 4 * MODELS * scrapes_after_baseline
        assert result["data"]["accepted_tokens"] == 3 * MODELS * scrapes_after_baseline
        # Retired series are one entry of the per-model breakdown, which stays bounded too.
        assert result["per_model"][RETIRED_MODEL]["num_drafts"] > 0
        assert len(result["per_model"]) <= MODELS + MAX_ABSENT_SERIES // 5 + 1
        found = await still_serving(exp.client)
        assert value(found, "specdec_target_up", target="c") == 1
