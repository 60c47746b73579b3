"""exporter/scheduler.py: the scrape loop's rhythm and what it does around its rounds."""

from __future__ import annotations

import asyncio
import gc


class TestRun:
    async def test_what_exists_as_the_loop_starts_is_frozen_before_its_first_round(
        self, exporter, unused_tcp_port
    ):
        # A full collection walked everything made before the loop started, in its first
        # round: 85-180 ms pauses at 1000 targets (bench exposition, "scrape loop alone").
        exp = await exporter({"targets": [
            {"name": "down", "url": f"http://127.0.0.1:{unused_tcp_port}/metrics"}]})
        before = gc.get_freeze_count()
        made_before_the_loop = [[i] for i in range(1000)]  # noqa: F841 - lists are tracked
        loop = asyncio.create_task(exp.service.run())
        try:
            await asyncio.sleep(0)  # the loop's first turn: its first round has just begun
            assert not exp.service.scheduler.ready
            assert gc.get_freeze_count() >= before + 1000
        finally:
            loop.cancel()
            try:
                await loop
            except asyncio.CancelledError:
                pass
            gc.unfreeze()  # the rest of the suite's garbage stays collectable
