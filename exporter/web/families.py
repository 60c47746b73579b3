"""Our metric families (name, type, HELP) and the text format's spelling of samples and labels."""

from __future__ import annotations

from dataclasses import dataclass

INF = float("inf")

LIVE_NOTE = (
    "Computed from the exporter's own background scrapes over live_window (not at the time "
    "Prometheus scrapes us): the increase of the server's counters across that span."
)


@dataclass(frozen=True, eq=False)  # identity hash: families are dict keys on the hot path
class Family:
    """Name, type and HELP of one of our metric families."""

    name: str
    kind: str
    help: str

    def header(self, openmetrics: bool = False) -> str:
        """HELP and TYPE lines; OpenMetrics names a counter family without `_total`."""
        doc = self.help.replace("\\", r"\\").replace("\n", r"\n")
        name = self.name
        if openmetrics and self.kind == "counter" and name.endswith("_total"):
            name = name[:-len("_total")]
        return f"# HELP {name} {doc}\n# TYPE {name} {self.kind}\n"


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
READ_FILTERED = Family("specdec_target_read_filtered", "gauge",
                       "1 if the target's last page was asked for filtered to the samples the "
                       "exporter reads (?name[]=), 0 if whole.")
DRAFTS = Family("specdec_drafts_total", "counter",
                "Spec-decode drafts reported by the target, summed over engines.")
DRAFT_TOKENS = Family("specdec_draft_tokens_total", "counter",
                      "Draft tokens reported by the target, summed over engines.")
ACCEPTED = Family("specdec_accepted_tokens_total", "counter",
                  "Accepted draft tokens reported by the target, summed over engines.")
PER_POS = Family("specdec_accepted_tokens_per_position_total", "counter",
                 "Accepted draft tokens per draft position, summed over engines.")
RATIO = Family("specdec_acceptance_ratio", "gauge", "Accepted / draft tokens (0..1). " + LIVE_NOTE)
LENGTH = Family("specdec_acceptance_length", "gauge",
                "1 + accepted tokens / drafts: tokens per forward pass. " + LIVE_NOTE)
POS_RATIO = Family("specdec_position_acceptance_ratio", "gauge",
                   "Accepted at the position / drafts (0..1). " + LIVE_NOTE)
LOAD_RATIO = Family("specdec_acceptance_ratio_by_load", "gauge",
                    "Accepted / draft tokens (0..1) of the scrape intervals in the running-"
                    "requests band (band: 0, 1, 2-3, 4-7, ... by the mean of the server's "
                    "running-requests gauge at the interval's two scrapes). " + LIVE_NOTE)
LOAD_LENGTH = Family("specdec_acceptance_length_by_load", "gauge",
                     "1 + accepted tokens / drafts of the scrape intervals in the running-"
                     "requests band (as specdec_acceptance_ratio_by_load). " + LIVE_NOTE)
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
                      "1 if the discovery source (file_sd file, http_sd or prometheus_sd URL) "
                      "was last read fine, 0 if not (its last good target list is still used).")
RELOAD_AT = Family("specdec_config_last_reload_success_timestamp_seconds", "gauge",
                   "Unix time of the last successful config load.")
STATE_ERRORS = Family("specdec_state_write_errors_total", "counter",
                      "Window state writes that failed, and damage or loss of the state "
                      "database found (at open, or files deleted under us); see the log.")
RESULT_ERRORS = Family("specdec_result_write_errors_total", "counter",
                       "Window stops whose result files could not be written (the window "
                       "stays open; a later stop retries).")

ENGINE_TOKENS = Family("specdec_engine_draft_tokens_total", "counter",
                       "Draft tokens per engine (data-parallel rank), for servers with several.")
ENGINE_ACCEPTED = Family("specdec_engine_accepted_tokens_total", "counter",
                         "Accepted draft tokens per engine (data-parallel rank), for servers "
                         "with several.")

NO_LIVE = ("", "", "", "", "")
TARGET_FAMILIES = (UP, DURATION, LAST_SCRAPE, ERRORS, PRESENT, READ_FILTERED, DRAFTS,
                   DRAFT_TOKENS, ACCEPTED, PER_POS, ENGINE_TOKENS, ENGINE_ACCEPTED)
LIVE_FAMILIES = (RATIO, LENGTH, POS_RATIO, LOAD_RATIO, LOAD_LENGTH)


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
    if value in (INF, -INF):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def line(name: str, labels: str, value: float) -> str:
    if not labels:
        return f"{name} {number(value)}\n"
    return f"{name}{{{labels}}} {number(value)}\n"


def template(prefixes: list[str]) -> str:
    """The `%` format of `prefix value` lines (label `%` doubled): a run is one C-level format."""
    return "".join([f"{prefix.replace('%', '%%')}%r\n" for prefix in prefixes])


def run_template(template: str, values: tuple[float, ...]) -> str:
    """The lines of a `template` for `values`: most samples of the exposition pass here."""
    total = sum(values)
    if total - total == 0.0:  # every value finite (a NaN or infinity makes the sum one)
        # %r is repr: a float's shortest text, as `number` spells a finite one.
        return template % values
    # A value's `%r` is the only one before a line feed: a label value has none unescaped.
    return template.replace("%r\n", "%s\n") % tuple([number(value) for value in values])
