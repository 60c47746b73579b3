"""The targets' live tracks follow the config: span and thinning spacing, at load and reload."""

from __future__ import annotations

from exporter.config import validate_config
from exporter.targets import Targets


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
