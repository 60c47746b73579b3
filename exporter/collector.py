"""The exporter's own /metrics: a Collector that builds fresh families from the latest state."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.derive import acceptance_length, acceptance_ratio, position_ratios
from exporter.service import ExporterService
from exporter.snapshot import Counts

_LIVE_NOTE = (
    "Computed from the exporter's own background scrapes over live_window (not at the time "
    "Prometheus scrapes us): the increase of the server's counters across that span."
)


def _family(name: str, doc: str, kind: str) -> Metric:
    return Metric(name, doc, kind)


class SpecDecodeCollector(Collector):
    """Yields every `specdec_*` family on each collect(); reads state, never awaits or scrapes."""

    def __init__(self, service: ExporterService):
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        now = service.clock()
        build = _family("specdec_build_info", "Version of specdec-exporter; always 1.", "gauge")
        build.add_sample("specdec_build_info", {"version": __version__}, 1.0)
        yield build
        yield from self._targets(now)
        yield from self._last_window()
        opened = _family("specdec_windows_open", "Benchmark windows open now.", "gauge")
        opened.add_sample("specdec_windows_open", {}, float(len(service.open_windows())))
        yield opened
        reload_ok = _family(
            "specdec_config_last_reload_successful",
            "1 if the last config (re)load succeeded, 0 if it was refused.", "gauge",
        )
        reload_ok.add_sample(
            "specdec_config_last_reload_successful", {}, 1.0 if service.reload_ok else 0.0
        )
        yield reload_ok
        reload_at = _family(
            "specdec_config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful config load.", "gauge",
        )
        reload_at.add_sample(
            "specdec_config_last_reload_success_timestamp_seconds", {}, service.reload_at
        )
        yield reload_at

    def _targets(self, now: float) -> Iterator[Metric]:
        up = _family("specdec_target_up", "1 if the last scrape of the target succeeded.", "gauge")
        duration = _family(
            "specdec_scrape_duration_seconds", "How long the last scrape of the target took.",
            "gauge",
        )
        errors = _family(
            "specdec_scrape_errors", "Failed scrapes of the target since we started.", "counter"
        )
        present = _family(
            "specdec_target_spec_decode_present",
            "1 if the target's last page had spec-decode series, 0 if not.", "gauge",
        )
        counters = {
            "drafts": _family("specdec_drafts", "Spec-decode drafts reported by the target, "
                              "summed over engines.", "counter"),
            "draft_tokens": _family("specdec_draft_tokens", "Draft tokens reported by the "
                                    "target, summed over engines.", "counter"),
            "accepted": _family("specdec_accepted_tokens", "Accepted draft tokens reported by "
                                "the target, summed over engines.", "counter"),
        }
        per_pos = _family(
            "specdec_accepted_tokens_per_position",
            "Accepted draft tokens per draft position, summed over engines.", "counter",
        )
        ratio = _family(
            "specdec_acceptance_ratio", "Accepted / draft tokens (0..1). " + _LIVE_NOTE, "gauge"
        )
        length = _family(
            "specdec_acceptance_length",
            "1 + accepted tokens / drafts: tokens per forward pass. " + _LIVE_NOTE, "gauge",
        )
        pos_ratio = _family(
            "specdec_position_acceptance_ratio",
            "Accepted at the position / drafts (0..1). " + _LIVE_NOTE, "gauge",
        )
        for name, state in self.service.targets.items():
            labels = {"target": name} | state.config.labels
            last = state.last
            up.add_sample("specdec_target_up", labels, 1.0 if state.up else 0.0)
            if last is not None:
                duration.add_sample("specdec_scrape_duration_seconds", labels, last.duration)
            errors.add_sample("specdec_scrape_errors_total", labels, float(state.errors_total))
            if state.up and last.snapshot is not None:
                snapshot = last.snapshot
                present.add_sample(
                    "specdec_target_spec_decode_present", labels,
                    1.0 if snapshot.has_spec_decode else 0.0,
                )
                for model, counts in snapshot.by_model().items():
                    model_labels = labels | {"model_name": model}
                    _add_counts(counters, per_pos, model_labels, counts)
            live = self.service.live[name].over_span(now)
            if live is not None:
                _add_ratios(ratio, length, pos_ratio, "specdec_", labels, live)
        yield from (up, duration, errors, present, *counters.values(), per_pos)
        yield from (ratio, length, pos_ratio)

    def _last_window(self) -> Iterator[Metric]:
        ratio = _family(
            "specdec_last_window_acceptance_ratio",
            "Accepted / draft tokens (0..1) over the last stopped benchmark window.", "gauge",
        )
        length = _family(
            "specdec_last_window_acceptance_length",
            "1 + accepted / drafts over the last stopped benchmark window.", "gauge",
        )
        pos_ratio = _family(
            "specdec_last_window_position_acceptance_ratio",
            "Accepted at the position / drafts over the last stopped benchmark window.", "gauge",
        )
        info = _family(
            "specdec_last_window_info",
            "The last stopped benchmark window; the value is its stop time (Unix seconds).",
            "gauge",
        )
        window = self.service.last_window
        if window is not None and window.answer is not None:
            info.add_sample(
                "specdec_last_window_info", {"id": window.id, "name": window.name},
                float(window.stopped_at or 0.0),
            )
            for name, result in window.answer["results"].items():
                if result["status"] != "ok":
                    continue
                state = self.service.targets.get(name)
                labels = {"target": name} | (state.config.labels if state else {})
                counts = Counts.from_raw(result["increase"])
                _add_ratios(ratio, length, pos_ratio, "specdec_last_window_", labels, counts)
        yield from (ratio, length, pos_ratio, info)


def _add_counts(counters: dict[str, Metric], per_pos: Metric, labels: dict, c: Counts) -> None:
    counters["drafts"].add_sample("specdec_drafts_total", labels, c.drafts)
    counters["draft_tokens"].add_sample("specdec_draft_tokens_total", labels, c.draft_tokens)
    counters["accepted"].add_sample("specdec_accepted_tokens_total", labels, c.accepted)
    for pos in sorted(c.per_position):
        per_pos.add_sample(
            "specdec_accepted_tokens_per_position_total", labels | {"position": str(pos)},
            c.per_position[pos],
        )


def _add_ratios(
    ratio: Metric, length: Metric, pos_ratio: Metric, prefix: str, labels: dict, c: Counts
) -> None:
    # A gauge with no drafts behind it is absent, not 0.
    if (value := acceptance_ratio(c)) is not None:
        ratio.add_sample(f"{prefix}acceptance_ratio", labels, value)
    if (value := acceptance_length(c)) is not None:
        length.add_sample(f"{prefix}acceptance_length", labels, value)
    for pos, value in position_ratios(c).items():
        pos_ratio.add_sample(
            f"{prefix}position_acceptance_ratio", labels | {"position": str(pos)}, value
        )
