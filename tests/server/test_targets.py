"""The targets' live tracks follow the config (span and thinning spacing, at load and reload);
a target's scrapes take turns;
only usable counter values reach its state."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from exporter.config.model import validate_config
from exporter.core.snapshot import Field, ScrapeResult, SeriesKey, Snapshot
from exporter.scrape.scraper import Scraper, make_session
from exporter.server.targets import Targets, TargetState, usable_only


def config(interval: str, live_window: str, names: list[str]):
    return validate_config({
        "scrape_interval": interval, "scrape_timeout": "1s", "live_window": live_window,
        "targets": [{"name": n, "url": f"http://127.0.0.1:9/{n}"} for n in names],
    })


def test_live_tracks_thin_at_half_the_scrape_interval_and_follow_a_reload():
    targets = Targets(config("5s", "20s", ["a", "b"]), clock=lambda: 0.0)
    assert [(t.span, t.spacing) for t in targets.live.values()] == [(20.0, 2.5)] * 2
    kept = targets.live["a"]
    targets.configure(config("2s", "60s", ["a", "c"]))
    assert targets.live["a"] is kept  # the track and its points survive a reload
    assert [(t.span, t.spacing) for t in targets.live.values()] == [(60.0, 1.0)] * 2


async def test_a_targets_scrapes_take_turns_and_leave_no_lock_behind(fake_vllm):
    fake = await fake_vllm(k=2)
    targets = Targets(validate_config({"targets": [{"name": "a", "url": fake.url}]}),
                      clock=time.time)
    seen: list[tuple[float, bool]] = []

    def then(result) -> None:
        assert result.ok
        seen.append((result.at, targets.busy("a")))

    async with make_session(4) as session:
        targets.scraper = Scraper(session, max_bytes=1 << 20, concurrency=4)
        try:
            await asyncio.gather(*(targets.scrape("a", then) for _ in range(3)))
            assert not targets.busy("a")  # idle: its lock went with the last scrape
            await targets.scrape("a", then)  # and a new one serves the next
        finally:
            await targets.scraper.close()
    assert [held for _, held in seen] == [True] * 4
    assert [at for at, _ in seen] == sorted(at for at, _ in seen)  # recorded in turn
    assert not targets.busy("a")


@pytest.mark.parametrize("value,kept", [
    (5.0, True), (0.0, True), (-0.0, True), (1e308, True),
    (math.nan, False), (math.inf, False), (-math.inf, False), (-1.0, False),
])
def test_only_usable_counter_values_reach_the_state(value, kept):
    good = {SeriesKey(Field.DRAFTS, "m", "0", -1): 1e308,  # with 1e308, a sum overflows
            SeriesKey(Field.ACCEPTED, "m", "0", -1): 3.0}
    odd = SeriesKey(Field.PER_POS, "m", "0", 0)
    result = ScrapeResult("a", 1.0, 0.1, Snapshot(values=good | {odd: value}, created={}))
    state = TargetState(config("5s", "20s", ["a"]).targets[0], errors_total=2).scraped(result)
    assert state.last.snapshot.values == good | ({odd: value} if kept else {})
    assert state.errors_total == 2 and state.up
    clean = ScrapeResult("a", 1.0, 0.1, Snapshot(values={odd: 2.0}, created={}))
    assert usable_only(clean) is clean  # nothing to drop: the same result
    empty = ScrapeResult("a", 1.0, 0.1, Snapshot(values={}, created={}))
    assert usable_only(empty) is empty
