"""The exporter's own /metrics, written straight from the latest state as text format 0.0.4.

prometheus_client's generic path (Collector -> Metric families -> generate_latest) costs about
8 µs a sample: 200 ms for 1000 targets x 8 positions, all of it on the event loop. We write the
same text directly: each target's lines for the figures of its last scrape are built once per
scrape (the cache is keyed by the target's state object, which a scrape replaces), and only the
live gauges, which depend on the time, are computed per request. Process and GC metrics still
come from prometheus_client's collectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector

from exporter import __version__
from exporter.config import Config
from exporter.derive import acceptance_length, acceptance_ratio, position_ratios
from exporter.service import ExporterService, TargetState
from exporter.snapshot import Counts

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_INF = float("inf")

_LIVE_NOTE = (
    "Computed from the exporter's own background scrapes over live_window (not at the time "
    "Prometheus scrapes us): the increase of the server's counters across that span."
)


@dataclass(frozen=True, eq=False)  # identity hash: families are dict keys on the hot path
class Family:
    """Name, type and HELP of one of our metric families."""

    name: str
    kind: str
    help: str

    def header(self) -> str:
        doc = self.help.replace("\\", r"\\").replace("\n", r"\n")
        return f"# HELP {self.name} {doc}\n# TYPE {self.name} {self.kind}\n"


BUILD = Family("specdec_build_info", "gauge", "Version of specdec-exporter; always 1.")
UP = Family("specdec_target_up", "gauge", "1 if the last scrape of the target succeeded.")
DURATION = Family("specdec_scrape_duration_seconds", "gauge",
                  "How long the last scrape of the target took.")
LAST_SCRAPE = Family("specdec_target_last_scrape_timestamp_seconds", "gauge",
                     "Unix time of the target's last scrape, good or failed (a stuck scrape "
                     "loop shows here: alert when it falls several scrape intervals behind).")
INTERVAL = Family("specdec_scrape_interval_seconds", "gauge",
                  "The configured scrape_interval of the exporter's targets.")
ERRORS = Family("specdec_scrape_errors_total", "counter",
                "Failed scrapes of the target since we started.")
PRESENT = Family("specdec_target_spec_decode_present", "gauge",
                 "1 if the target's last page had spec-decode series, 0 if not.")
DRAFTS = Family("specdec_drafts_total", "counter",
                "Spec-decode drafts reported by the target, summed over engines.")
DRAFT_TOKENS = Family("specdec_draft_tokens_total", "counter",
                      "Draft tokens reported by the target, summed over engines.")
ACCEPTED = Family("specdec_accepted_tokens_total", "counter",
                  "Accepted draft tokens reported by the target, summed over engines.")
PER_POS = Family("specdec_accepted_tokens_per_position_total", "counter",
                 "Accepted draft tokens per draft position, summed over engines.")
RATIO = Family("specdec_acceptance_ratio", "gauge", "Accepted / draft tokens (0..1). " + _LIVE_NOTE)
LENGTH = Family("specdec_acceptance_length", "gauge",
                "1 + accepted tokens / drafts: tokens per forward pass. " + _LIVE_NOTE)
POS_RATIO = Family("specdec_position_acceptance_ratio", "gauge",
                   "Accepted at the position / drafts (0..1). " + _LIVE_NOTE)
LAST_RATIO = Family("specdec_last_window_acceptance_ratio", "gauge",
                    "Accepted / draft tokens (0..1) over the last stopped benchmark window.")
LAST_LENGTH = Family("specdec_last_window_acceptance_length", "gauge",
                     "1 + accepted / drafts over the last stopped benchmark window.")
LAST_POS_RATIO = Family("specdec_last_window_position_acceptance_ratio", "gauge",
                        "Accepted at the position / drafts over the last stopped benchmark window.")
LAST_INFO = Family("specdec_last_window_info", "gauge",
                   "The last stopped benchmark window; the value is its stop time (Unix seconds).")
WINDOWS_OPEN = Family("specdec_windows_open", "gauge", "Benchmark windows open now.")
RELOAD_OK = Family("specdec_config_last_reload_successful", "gauge",
                   "1 if the last config (re)load succeeded, 0 if it was refused.")
DISCOVERY_UP = Family("specdec_discovery_source_up", "gauge",
                      "1 if the discovery source (file_sd file or http_sd URL) was last read "
                      "fine, 0 if not (its last good target list is still used).")
RELOAD_AT = Family("specdec_config_last_reload_success_timestamp_seconds", "gauge",
                   "Unix time of the last successful config load.")

_TARGET_FAMILIES = (UP, DURATION, LAST_SCRAPE, ERRORS, PRESENT, DRAFTS, DRAFT_TOKENS, ACCEPTED,
                    PER_POS)


def escape(value: str) -> str:
    """A label value escaped for the text format."""
    if "\\" in value or "\n" in value or '"' in value:
        value = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def label_text(labels: dict[str, str]) -> str:
    """`a="1",b="2"` of a label set (no braces), names sorted as client libraries do."""
    return ",".join(f'{name}="{escape(labels[name])}"' for name in sorted(labels))


def number(value: float) -> str:
    """A sample value as the text format spells it (Python's shortest repr for finite ones)."""
    if value != value:
        return "NaN"
    if value in (_INF, -_INF):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _line(name: str, labels: str, value: float) -> str:
    if not labels:
        return f"{name} {number(value)}\n"
    return f"{name}{{{labels}}} {number(value)}\n"


def _ratio_lines(labels: str, counts: Counts, out: dict[Family, list[str]],
                 families: tuple[Family, Family, Family]) -> None:
    # A gauge with no drafts behind it is absent, not 0.
    ratio_family, length_family, pos_family = families
    if (value := acceptance_ratio(counts)) is not None:
        out[ratio_family].append(_line(ratio_family.name, labels, value))
    if (value := acceptance_length(counts)) is not None:
        out[length_family].append(_line(length_family.name, labels, value))
    for pos, value in position_ratios(counts).items():
        out[pos_family].append(_line(pos_family.name, f'{labels},position="{pos}"', value))


class _TargetLines:
    """One target's lines for every per-scrape family; valid while its state object lives."""

    __slots__ = ("state", "labels", "lines")

    def __init__(self, name: str, state: TargetState):
        self.state = state
        self.labels = label_text({"target": name} | state.config.labels)
        lines: dict[Family, str] = {}
        last, labels = state.last, self.labels
        lines[UP] = _line(UP.name, labels, 1.0 if state.up else 0.0)
        lines[DURATION] = _line(DURATION.name, labels, last.duration) if last else ""
        lines[LAST_SCRAPE] = _line(LAST_SCRAPE.name, labels, last.at) if last else ""
        lines[ERRORS] = _line(ERRORS.name, labels, float(state.errors_total))
        counters: dict[Family, list[str]] = {f: [] for f in (PRESENT, DRAFTS, DRAFT_TOKENS,
                                                              ACCEPTED, PER_POS)}
        if state.up and last is not None and last.snapshot is not None:
            snapshot = last.snapshot
            counters[PRESENT].append(
                _line(PRESENT.name, labels, 1.0 if snapshot.has_spec_decode else 0.0))
            for model, c in snapshot.by_model().items():
                with_model = f'{labels},model_name="{escape(model)}"'
                counters[DRAFTS].append(_line(DRAFTS.name, with_model, c.drafts))
                counters[DRAFT_TOKENS].append(_line(DRAFT_TOKENS.name, with_model, c.draft_tokens))
                counters[ACCEPTED].append(_line(ACCEPTED.name, with_model, c.accepted))
                for pos in sorted(c.per_position):
                    counters[PER_POS].append(_line(
                        PER_POS.name, f'{with_model},position="{pos}"', c.per_position[pos]))
        lines.update({family: "".join(items) for family, items in counters.items()})
        self.lines = lines


class MetricsWriter:
    """Renders /metrics from an `ExporterService`; reads state, never awaits or scrapes."""

    def __init__(self, service: ExporterService, *, process_metrics: bool = True):
        self.service = service
        self._cache: dict[str, _TargetLines] = {}
        self._last_key: tuple[dict[str, Any] | None, Config] | None = None
        self._last_lines: dict[Family, list[str]] = {}
        self._process = CollectorRegistry(auto_describe=False)
        if process_metrics:
            ProcessCollector(registry=self._process)
            GCCollector(registry=self._process)

    def _target_lines(self) -> list[_TargetLines]:
        cache: dict[str, _TargetLines] = {}
        for name, state in self.service.targets.items():
            entry = self._cache.get(name)
            cache[name] = entry if entry is not None and entry.state is state else (
                _TargetLines(name, state))
        self._cache = cache  # targets gone from the config leave the cache too
        return list(cache.values())

    def render(self) -> bytes:
        """The whole exposition."""
        service = self.service
        now = service.clock()
        out: list[str] = [BUILD.header(), _line(BUILD.name, f'version="{__version__}"', 1.0)]
        targets = self._target_lines()
        for family in _TARGET_FAMILIES:
            out.append(family.header())
            out.extend(entry.lines[family] for entry in targets)
        live: dict[Family, list[str]] = {RATIO: [], LENGTH: [], POS_RATIO: []}
        for entry in targets:
            span = service.live[entry.state.config.name].over_span(now)
            if span is not None:
                _ratio_lines(entry.labels, span, live, (RATIO, LENGTH, POS_RATIO))
        _extend(out, live)
        _extend(out, self._last_window())
        out += [
            WINDOWS_OPEN.header(), _line(WINDOWS_OPEN.name, "", float(len(service.open_windows()))),
            RELOAD_OK.header(), _line(RELOAD_OK.name, "", 1.0 if service.reload_ok else 0.0),
            RELOAD_AT.header(), _line(RELOAD_AT.name, "", service.reload_at),
            INTERVAL.header(), _line(INTERVAL.name, "", service.config.scrape_interval),
        ]
        if service.discovery.sources:
            out.append(DISCOVERY_UP.header())
            out.extend(
                _line(DISCOVERY_UP.name, label_text({"source": name}),
                      0.0 if source.error else 1.0)
                for name, source in service.discovery.sources.items()
            )
        return "".join(out).encode() + generate_latest(self._process)

    def _last_window(self) -> dict[Family, list[str]]:
        # Changes only when a window stops or the config (target labels) reloads.
        window = self.service.last_window
        key = (window.answer if window else None, self.service.config)
        if self._last_key is None or any(a is not b for a, b in zip(key, self._last_key,
                                                                      strict=True)):
            self._last_lines = self._last_window_lines()
            self._last_key = key
        return self._last_lines

    def _last_window_lines(self) -> dict[Family, list[str]]:
        out: dict[Family, list[str]] = {LAST_RATIO: [], LAST_LENGTH: [], LAST_POS_RATIO: [],
                                        LAST_INFO: []}
        window = self.service.last_window
        if window is None or window.answer is None:
            return out
        out[LAST_INFO].append(_line(
            LAST_INFO.name, label_text({"id": window.id, "name": window.name}),
            float(window.stopped_at or 0.0)))
        for name, result in window.answer["results"].items():
            if result["status"] != "ok" or not result.get("increase"):
                continue
            state = self.service.targets.get(name)
            labels = label_text({"target": name} | (state.config.labels if state else {}))
            _ratio_lines(labels, Counts.from_raw(result["increase"]),
                         out, (LAST_RATIO, LAST_LENGTH, LAST_POS_RATIO))
        return out


def _extend(out: list[str], families: dict[Family, list[str]]) -> None:
    for family, lines in families.items():
        out.append(family.header())
        out.extend(lines)

