"""JSON views of the state, shared by the API and the landing page."""

from __future__ import annotations

from typing import Any

from exporter.core.counting import LiveTrack
from exporter.core.derive import acceptance_length, acceptance_ratio, position_ratios
from exporter.server.targets import TargetState


def target_view(state: TargetState, live: LiveTrack, now: float) -> dict[str, Any]:
    """One target: health, last error, counters and live figures."""
    last = state.last
    snapshot = last.snapshot if last is not None else None
    # A down target's model and engines are the last ones seen, as its greyed figures are.
    known = state.last_ok.snapshot if state.last_ok is not None else None
    span = live.over_span(now)
    view = {
        "name": state.config.name,
        "url": state.config.display_url,
        "labels": state.config.labels,
        "up": state.up,
        "last_scrape_at": last.at if last else None,
        "last_scrape_duration_seconds": last.duration if last else None,
        "last_page_bytes": last.size if last else None,
        "errors_total": state.errors_total,
        "last_error": state.last_error,
        "last_error_at": state.last_error_at,
        # The last scrape that fed the live figures: what a page shows as "last seen" when the
        # target is down and its figures are stale.
        "last_seen_at": live.points[-1][0] if live.points else None,
        "spec_decode_present": snapshot.has_spec_decode if snapshot else None,
        "dialect": snapshot.dialect if snapshot and snapshot.has_spec_decode else None,
        "model_names": known.model_names if known else [],
        "engines": known.engines if known else 0,
        "counters": snapshot.totals().as_raw() if snapshot else None,
        "live": None,
    }
    if span is not None and span.drafts > 0:
        view["live"] = {
            "window_seconds": live.span,
            "drafts": span.drafts,
            "acceptance_ratio": acceptance_ratio(span),
            "acceptance_length": acceptance_length(span),
            "per_position": {str(p): r for p, r in position_ratios(span).items()},
        }
    return view
