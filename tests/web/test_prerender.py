"""Prerender: stale /metrics lines built a chunk per loop turn, and ahead of renders that keep
a rhythm."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Clock

from exporter.web.exposition import MetricsWriter
from exporter.web.prerender import Prerender


@pytest.fixture
async def exp(exporter, unused_tcp_port):
    """Five targets nothing answers for: each scrape gives a new state all the same."""
    return await exporter({"targets": [
        {"name": f"t{i}", "url": f"http://127.0.0.1:{unused_tcp_port}/metrics?{i}"}
        for i in range(5)]})


async def wait_for(condition, what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class TestPrepare:
    async def test_chunks_with_the_loop_let_in_between(self, exp):
        writer = MetricsWriter(exp.service.view, process_metrics=False)
        turns = 0

        async def other_work() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        before = turns
        await Prerender(writer, chunk=2).prepare()  # 5 targets: a yield after 2, after 4
        during = turns - before
        other.cancel()
        assert during >= 2
        assert list(writer.prepare(1)) == []  # nothing left to build
        await exp.service.scrape_target("t1")
        await exp.service.scrape_target("t3")
        assert list(writer.prepare(1)) == [1, 2]

    async def test_render_after_prepare_equals_a_fresh_render(self, exp):
        writer = MetricsWriter(exp.service.view, process_metrics=False)
        writer.render()
        await exp.round()
        await Prerender(writer, chunk=2).prepare()
        assert writer.render() == MetricsWriter(exp.service.view, process_metrics=False).render()


class TestScraped:
    async def test_blocks_built_a_chunk_per_loop_turn_after_the_scrapes(self, exp):
        writer = MetricsWriter(exp.service.view, process_metrics=False)
        writer.render()  # read: scrapes build
        prerender = Prerender(writer, build_chunk=2)
        await exp.round()  # five new states, not built (this writer hears of no scrape)
        view = exp.service.view()
        for name, state in view.targets.items():
            prerender.scraped(name, state, view.live[name], view.now)
        assert prerender.pending == 5  # none in the turn that handled the scrapes
        left = []
        for _ in range(3):
            await asyncio.sleep(0)  # one turn: one chunk
            left.append(prerender.pending)
        assert left == [3, 1, 0]
        assert list(writer.prepare(1)) == []  # all five built
        assert writer.render() == MetricsWriter(exp.service.view, process_metrics=False).render()

    async def test_nothing_queued_while_unread(self, exp):
        prerender = Prerender(MetricsWriter(exp.service.view, process_metrics=False))
        view = exp.service.view()
        prerender.scraped("t0", view.targets["t0"], view.live["t0"], view.now)
        assert prerender.pending == 0

    async def test_a_failure_is_logged_and_the_rest_built_later(self, exp, caplog):
        class Breaks(MetricsWriter):
            def scraped(self, name, state, track, now) -> None:
                if name == "t0":
                    raise RuntimeError("broken block")
                super().scraped(name, state, track, now)

        writer = Breaks(exp.service.view, process_metrics=False)
        writer.render()
        prerender = Prerender(writer, build_chunk=10)
        await exp.round()  # five new states
        view = exp.service.view()
        for name in ("t0", "t1"):
            prerender.scraped(name, view.targets[name], view.live[name], view.now)
        await wait_for(lambda: "building /metrics lines of scraped targets failed" in caplog.text,
                       "the log")
        assert "broken block" in caplog.text
        await wait_for(lambda: prerender.pending == 0, "the rest built, in a turn of its own")
        assert list(writer.prepare(10)) == [4]  # t1 built; t0 and the three not queued not
        await prerender.close()

    async def test_close_drops_what_is_queued(self, exp):
        writer = MetricsWriter(exp.service.view, process_metrics=False)
        writer.render()
        prerender = Prerender(writer)
        view = exp.service.view()
        prerender.scraped("t0", view.targets["t0"], view.live["t0"], view.now)
        await prerender.close()
        assert prerender.pending == 0
        await asyncio.sleep(0)  # the cancelled turn builds nothing, raises nothing


class TestRhythm:
    async def test_builds_ahead_of_the_next_expected_render(self, exp):
        clock = Clock(100.0)
        writer = MetricsWriter(exp.service.view, process_metrics=False)
        prerender = Prerender(writer, clock=clock, lead=0.05)
        loop = asyncio.get_running_loop()
        writer.render()
        prerender.rendered()
        assert prerender.planned is None  # one render: no rhythm yet
        clock.now += 0.2
        writer.render()
        prerender.rendered()
        planned = prerender.planned
        assert planned is not None
        assert planned - loop.time() == pytest.approx(0.15, abs=0.05)  # period - lead
        await exp.service.scrape_target("t2")
        await wait_for(lambda: prerender.ahead == 1, "the preparation")
        await wait_for(lambda: list(writer.prepare(1)) == [], "t2's lines built")
        assert prerender.planned is None  # the next is planned by the next render
        await prerender.close()

    async def test_an_ha_pair_alternates_gaps(self, exp):
        # Two scrapers 0.2 s apart, each every 0.5 s: gaps 0.2, 0.3, 0.2, 0.3, ...
        clock = Clock(100.0)
        prerender = Prerender(MetricsWriter(exp.service.view, process_metrics=False),
                              clock=clock, lead=0.05)
        _assert_plans(prerender, clock, ((0.0, None), (0.2, 0.15), (0.3, 0.15), (0.2, 0.25),
                                         (0.3, 0.15)), tolerance=0.04)
        await prerender.close()

    @pytest.mark.parametrize("period", [0.05, 0.1, 601.0])
    async def test_no_plan_for_renders_too_close_or_too_far_apart(self, exp, period):
        clock = Clock(100.0)
        prerender = Prerender(MetricsWriter(exp.service.view, process_metrics=False), clock=clock,
                              lead=0.05)
        prerender.rendered()
        clock.now += period
        prerender.rendered()
        assert prerender.planned is None

    async def test_a_render_replans(self, exp):
        clock = Clock(100.0)
        prerender = Prerender(MetricsWriter(exp.service.view, process_metrics=False), clock=clock)
        _assert_plans(prerender, clock, ((0.0, None), (30.0, 29.5), (10.0, 29.5), (20.0, 9.5)),
                      tolerance=0.4)
        await prerender.close()
        assert prerender.planned is None

    async def test_a_failure_ahead_is_logged(self, caplog):
        class Broken:
            def prepare(self, chunk: int):
                raise RuntimeError("broken lines")

        clock = Clock(100.0)
        prerender = Prerender(Broken(), clock=clock, lead=0.05)  # type: ignore[arg-type]
        prerender.rendered()
        clock.now += 0.2
        prerender.rendered()
        await wait_for(lambda: "building /metrics lines ahead failed" in caplog.text, "the log")
        assert "broken lines" in caplog.text
        await prerender.close()


def _assert_plans(prerender: Prerender, clock: Clock, steps, *, tolerance: float) -> None:
    """After each (gap, want): a render `gap` seconds after the last one plans the next build
    `want` seconds from now (None: no plan)."""
    loop = asyncio.get_running_loop()
    for gap, want in steps:
        clock.now += gap
        prerender.rendered()
        planned = prerender.planned
        if want is None:
            assert planned is None, gap
        else:
            assert planned is not None, gap
            assert planned - loop.time() == pytest.approx(want, abs=tolerance), gap
