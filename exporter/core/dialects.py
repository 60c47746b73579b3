"""Every server kind we read, in one place: names, default path, parse spec, policy, notes (a
new dialect: an entry in `DIALECTS` and `REPORTING`, a renderer in `exporter.fakevllm.pages`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from exporter.core.snapshot import Field, SeriesKey

Labels = tuple[tuple[str, str], ...]  # a gauge series' sorted label pairs
# What a line's text before its value resolves to: (name, kind, key, longest label value,
# position); the key a `SeriesKey` for counters, the sorted labels for gauges.
Head = tuple[str, "SampleKind", SeriesKey | Labels, int, int]


class SampleKind(StrEnum):
    """What one sample line of a spec-decode family is."""

    VALUE = "value"  # a counter's `_total`
    CREATED = "created"  # a counter's `_created`
    FIRST = "first"  # position 0 of a per-position counter read as another field (TRT-LLM)
    FIRST_CREATED = "first_created"  # its `_created`
    GAUGE = "gauge"  # an interval gauge (SGLang, vLLM V0)


class Dialect(StrEnum):
    """Metric naming schemes we understand, picked per target or detected from the page."""

    AUTO = "auto"  # the first spec-decode name on the page picks one of the others
    VLLM = "vllm"  # V1 names; V0 names on the same prefix are recognised too
    LLAMACPP = "llamacpp"  # llama.cpp server: vLLM V1's counter names under `llamacpp:`
    SGLANG = "sglang"  # interval gauges only: `sglang:spec_accept_length`, `..._rate`
    TRTLLM = "trtllm"  # TensorRT-LLM's `trtllm_spec_decode_*`, served at /prometheus/metrics


@dataclass(frozen=True)
class DialectSpec:
    """How one dialect names its series: a line prefix and metric name -> field tables."""

    prefix: bytes
    counters: dict[str, Field]  # counter name without `_total`/`_created`
    gauges: frozenset[str] = frozenset()
    v0_markers: frozenset[str] = frozenset()  # names only vLLM V0 exposes
    # Per-position counters of which only position 0 is read, as this field: TensorRT-LLM
    # counts no drafts, but every draft proposes a token at position 0.
    first_position: dict[str, Field] = field(default_factory=dict)
    position_label: str = "position"
    # A gauge whose value 0 means "nothing measured yet" (SGLang's): a series whose gate is
    # not above 0 contributes no gauge.
    gauge_gate: str | None = None
    path: str = "/metrics"  # where the server serves Prometheus text by default
    # Its running-requests gauge: asked for beside the spec-decode samples (a later reader).
    running: str = ""
    names: dict[bytes, tuple[Field | None, SampleKind]] = field(init=False, default_factory=dict)
    # Line text before the value -> what it resolves to, parsed once, not once per scrape.
    heads: dict[bytes, Head | None] = field(init=False, default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for base, fld in self.counters.items():
            self.names[(base + "_total").encode()] = (fld, SampleKind.VALUE)
            self.names[(base + "_created").encode()] = (fld, SampleKind.CREATED)
        for base, fld in self.first_position.items():
            self.names[(base + "_total").encode()] = (fld, SampleKind.FIRST)
            self.names[(base + "_created").encode()] = (fld, SampleKind.FIRST_CREATED)
        for name in self.gauges:
            self.names[name.encode()] = (None, SampleKind.GAUGE)


def _v1_counters(prefix: str) -> dict[str, Field]:
    return {
        f"{prefix}spec_decode_num_drafts": Field.DRAFTS,
        f"{prefix}spec_decode_num_draft_tokens": Field.DRAFT_TOKENS,
        f"{prefix}spec_decode_num_accepted_tokens": Field.ACCEPTED,
        f"{prefix}spec_decode_num_accepted_tokens_per_pos": Field.PER_POS,
    }


_V0_GAUGES = frozenset({"vllm:spec_decode_draft_acceptance_rate", "vllm:spec_decode_efficiency"})
SGLANG_LENGTH = "sglang:spec_accept_length"
SGLANG_RATE = "sglang:spec_accept_rate"

DIALECTS: dict[Dialect, DialectSpec] = {
    Dialect.VLLM: DialectSpec(
        prefix=b"vllm:spec_decode_",
        counters=_v1_counters("vllm:")
        | {"vllm:spec_decode_num_emitted_tokens": Field.EMITTED},
        gauges=_V0_GAUGES,
        v0_markers=_V0_GAUGES | {"vllm:spec_decode_num_emitted_tokens_total"},
        running="vllm:num_requests_running",
    ),
    # tools/server/server-task.cpp, server_task_result_metrics::to_metrics(): no labels but
    # `position`, no `_created`, values printed by a C++ stream (6 significant digits).
    Dialect.LLAMACPP: DialectSpec(
        prefix=b"llamacpp:spec_decode_", counters=_v1_counters("llamacpp:"),
        running="llamacpp:requests_processing",
    ),
    # python/sglang/srt/metrics/collector.py: gauges over the last decode_log_interval
    # batches, labels model_name, engine_type, tp_rank, pp_rank (and dp_rank).
    Dialect.SGLANG: DialectSpec(
        prefix=b"sglang:spec_accept_",
        counters={},
        gauges=frozenset({SGLANG_LENGTH, SGLANG_RATE}),
        gauge_gate=SGLANG_LENGTH,
        running="sglang:num_running_reqs",
    ),
    # tensorrt_llm/metrics/collector.py: iteration counters of draft and accepted tokens,
    # per-request counters per `token_position`; labels model_name, engine_type.
    Dialect.TRTLLM: DialectSpec(
        prefix=b"trtllm_spec_decode_",
        counters={
            "trtllm_spec_decode_num_draft_tokens": Field.DRAFT_TOKENS,
            "trtllm_spec_decode_num_accepted_tokens": Field.ACCEPTED,
            "trtllm_spec_decode_accepted_tokens": Field.PER_POS,
        },
        first_position={"trtllm_spec_decode_drafted_tokens": Field.DRAFTS},
        gauges=frozenset({"trtllm_spec_decode_acceptance_length"}),
        position_label="token_position",
        path="/prometheus/metrics",
        running="trtllm_num_requests_running",
    ),
}


# The caveat results built from each reported dialect carry as `dialect_note` (None: none), by
# the name results report (`Snapshot.dialect`): a `Dialect` value, or "vllm-v0" for vLLM V0
# names found on a `vllm` page.
REPORTING: dict[str, str | None] = {
    "vllm": None,
    "vllm-v0": (
        "vLLM V0 counters over-count: V0 re-adds a running total every logging interval, so "
        "draft and accepted token counts are inflated; the acceptance rate is indicative only"
    ),
    "llamacpp": None,
    "sglang": (
        "SGLang exposes no counters, only interval gauges (sglang:spec_accept_length, "
        "sglang:spec_accept_rate): the figures are their time-weighted means over the "
        "window's scrapes, an estimate, not exact counts"
    ),
    "trtllm": (
        "TensorRT-LLM counts drafts only per position (trtllm_spec_decode_drafted_tokens_total"
        ", needs return_perf_metrics); without it, acceptance length and per-position rates "
        "cannot be computed"
    ),
}
# Dialects whose figures are derived from gauges: kept out of the aggregate.
_ESTIMATED = frozenset({"sglang"})

# Every page the simulator (`specdec-exporter fake-vllm --dialect`) can serve.
SIMULATED_DIALECTS: tuple[str, ...] = tuple(REPORTING)


def dialect_note(name: str | None) -> str | None:
    """The caveat results must carry for numbers from dialect `name` (`Snapshot.dialect`)."""
    return REPORTING.get(name or "")


def is_estimate(name: str | None) -> bool:
    """Whether results from dialect `name` are estimated from gauges rather than counted."""
    return name in _ESTIMATED


def _spec(dialect: Dialect | str) -> DialectSpec | None:
    """The spec of a dialect or `Snapshot.dialect` name ("vllm-v0" reads as vLLM); None for auto."""
    return DIALECTS.get(Dialect(Dialect.VLLM if dialect == "vllm-v0" else dialect))


def sample_names(dialect: str) -> tuple[str, ...]:
    """Every sample name a page of `dialect` (a `Snapshot.dialect`) is read by, its `_created`
    and its running-requests gauge: what a `name[]` filter asks for (empty for `auto`)."""
    spec = _spec(dialect)
    if spec is None:
        return ()
    return tuple(sorted({name.decode() for name in spec.names} | {spec.running} - {""}))


def default_path(dialect: Dialect | str) -> str:
    """The path a dialect's server serves Prometheus text on (for host + port targets)."""
    spec = _spec(dialect)
    return spec.path if spec is not None else "/metrics"
