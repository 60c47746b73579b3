"""Simulated vLLM server whose spec-decode counters grow the way real traffic makes them."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.utils import floatToGoString

DIALECTS = ("vllm", "vllm-v0", "llamacpp", "sglang", "trtllm")
# Dialects whose whole page is their own (no vLLM families around the spec-decode ones).
_OTHER_ENGINES = ("llamacpp", "sglang", "trtllm")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The non-spec-decode part of the page costs most of the rendering time on big pages, so it is
# rendered again only after a restart, a change of variants, or this many seconds.
REST_REFRESH_SECONDS = 10.0

# vLLM builds its token-count buckets with build_1_2_5_buckets(max_model_len); 8192 is typical.
MAX_MODEL_LEN = 8192

# V1 families of vllm/v1/spec_decode/metrics.py: (name without _total, HELP, totals() key).
_SPEC_V1 = (
    ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", "num_drafts"),
    ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", "num_draft_tokens"),
    ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", "num_accepted_tokens"),
)
_SPEC_V1_PER_POS = (
    "vllm:spec_decode_num_accepted_tokens_per_pos",
    "Accepted tokens per draft position.",
)


def _buckets_1_2_5(max_value: int) -> list[float]:
    """Return vLLM's 1-2-5 bucket bounds up to max_value."""
    bounds: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return bounds
            bounds.append(float(value))
        exponent += 1


def _bounds(text: str) -> list[float]:
    """Return the bucket bounds written in text, separated by spaces."""
    return [float(bound) for bound in text.split()]


_TOKEN_BUCKETS = _buckets_1_2_5(MAX_MODEL_LEN)
_LATENCY_BUCKETS = _bounds(
    "0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680"
)
_TTFT_BUCKETS = _bounds(
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10 20 40 80 160 640 2560"
)
_TPOT_BUCKETS = _bounds(
    "0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5 5 7.5 10 20 40 80"
)
_HTTP_HIGHR_BUCKETS = _bounds(
    "0.01 0.025 0.05 0.075 0.1 0.25 0.5 0.75 1 1.5 2 2.5 3 3.5 4 4.5 5 7.5 10 30 60"
)


@dataclass(frozen=True)
class _HistSpec:
    """One vLLM histogram family: bounds, what it counts, and a lognormal shape of its values."""

    name: str
    help: str
    bounds: Sequence[float]
    per: str  # "requests", "tokens" or "steps": which traffic count is its observation count
    mu: float
    sigma: float
    integer: bool = False
    v1_only: bool = False


# Families and bounds as in vllm/v1/metrics/loggers.py (PrometheusStatLogger).
_HISTOGRAMS = (
    _HistSpec(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        _bounds("1 8 16 32 64 128 256 512 1024 2048 4096 8192 16384"),
        "steps",
        3.0,
        1.2,
        integer=True,
    ),
    _HistSpec(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        _TTFT_BUCKETS,
        "requests",
        -2.0,
        1.0,
    ),
    _HistSpec(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        _TPOT_BUCKETS,
        "tokens",
        -4.0,
        0.4,
    ),
    _HistSpec(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        _TPOT_BUCKETS,
        "tokens",
        -4.0,
        0.4,
        v1_only=True,
    ),
    _HistSpec(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        _LATENCY_BUCKETS,
        "requests",
        1.5,
        0.8,
    ),
    _HistSpec(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        _LATENCY_BUCKETS,
        "requests",
        -3.0,
        1.5,
        v1_only=True,
    ),
    _HistSpec(
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        _LATENCY_BUCKETS,
        "requests",
        1.4,
        0.8,
    ),
    _HistSpec(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        _LATENCY_BUCKETS,
        "requests",
        -2.2,
        1.0,
    ),
    _HistSpec(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        _LATENCY_BUCKETS,
        "requests",
        1.3,
        0.8,
    ),
    _HistSpec(
        "vllm:time_per_prefill_token_request_seconds",
        "Time spent per token during prefill  phase in seconds",
        _bounds("0.001 0.002 0.005 0.01 0.02 0.05 0.1 0.2 0.5 1"),
        "requests",
        -8.0,
        0.8,
        v1_only=True,
    ),
    _HistSpec(
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        _TOKEN_BUCKETS,
        "requests",
        6.3,
        1.0,
        integer=True,
    ),
    _HistSpec(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        _TOKEN_BUCKETS,
        "requests",
        5.3,
        0.7,
        integer=True,
    ),
    _HistSpec(
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        _TOKEN_BUCKETS,
        "requests",
        6.9,
        0.5,
        integer=True,
    ),
    _HistSpec(
        "vllm:request_params_n",
        "Histogram of the n request parameter.",
        [1.0, 2.0, 5.0, 10.0, 20.0],
        "requests",
        0.0,
        0.0,
        integer=True,
    ),
    _HistSpec(
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        _TOKEN_BUCKETS,
        "requests",
        6.9,
        0.5,
        integer=True,
    ),
)

# Histograms are drawn from this many samples and scaled, so a refresh costs the same at any
# traffic volume while buckets stay cumulative and the count stays exact.
_HIST_SAMPLES = 48

# Mean generated tokens per request and per engine step, to derive request-level counts.
_TOKENS_PER_REQUEST = 256
_SEQUENCES_PER_STEP = 8


@dataclass
class _Engine:
    """Counters of one data-parallel rank, as ints."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    # Draft tokens proposed at each position (TensorRT-LLM's per-position drafted counter).
    drafted_per_pos: list[int] = field(default_factory=list)
    # The last add(): SGLang's gauges describe only the recent logging interval.
    last: tuple[int, int, int] = (0, 0, 0)  # drafts, draft tokens, accepted tokens


def _engine_value(state: _Engine, key: str) -> int:
    """Return one engine's counter named by a totals() key."""
    if key == "num_drafts":
        return state.drafts
    if key == "num_draft_tokens":
        return state.draft_tokens
    return sum(state.accepted_per_pos)


class _Families:
    """Collector over a fixed list of metric families, for generate_latest."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> list[Metric]:
        """Return the families."""
        return self._families


def _check_count(name: str, value: object) -> None:
    """Raise ValueError naming the field unless value is a non-negative int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


@dataclass
class FakeServer:
    """A simulated vLLM server: spec-decode counters per engine and the page that shows them."""

    k: int = 3
    acceptance: float = 0.8
    engines: int = 1
    model_name: str = "fake/llama-3-8b"
    dialect: str = "vllm"
    spec_decode: bool = True
    ngram: bool = False
    histograms: bool = True
    seed: int = 0
    emit_created: bool = True
    # Extra model_name variants (LoRA adapters) of the non-spec-decode families, for big pages.
    lora_adapters: int = 0

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"acceptance must be within 0..1, got {self.acceptance}")
        if self.engines < 1:
            raise ValueError(f"engines must be >= 1, got {self.engines}")
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}, got {self.dialect!r}")
        self._rng = random.Random(self.seed)
        self._rest_key: tuple[int, int] | None = None
        self._rest_at = 0.0
        self._head = b""
        self._rest = b""
        self._generation = 0
        self._created = 0.0
        self.restart()

    def restart(self) -> None:
        """Restart the server: every counter back to 0, new _created timestamps."""
        self._engines = [
            _Engine(accepted_per_pos=[0] * self.k, drafted_per_pos=[0] * self.k)
            for _ in range(self.engines)
        ]
        # A scraper detects a restart by a changed _created, so never reuse the old value.
        self._created = max(time.time(), self._created + 1e-6)
        self._generation += 1

    def add(self, engine: int, drafts: int, draft_tokens: int, accepted_per_pos: list[int]) -> None:
        """Add exact increments to one engine; accepted tokens grow by sum(accepted_per_pos)."""
        if (
            isinstance(engine, bool)
            or not isinstance(engine, int)
            or not 0 <= engine < self.engines
        ):
            raise ValueError(f"engine must be within 0..{self.engines - 1}, got {engine!r}")
        _check_count("drafts", drafts)
        _check_count("draft_tokens", draft_tokens)
        if len(accepted_per_pos) > self.k:
            raise ValueError(f"accepted_per_pos has {len(accepted_per_pos)} positions, k={self.k}")
        for pos, count in enumerate(accepted_per_pos):
            _check_count(f"accepted_per_pos[{pos}]", count)
        state = self._engines[engine]
        state.drafts += drafts
        state.draft_tokens += draft_tokens
        for pos, count in enumerate(accepted_per_pos):
            state.accepted_per_pos[pos] += count
        # Every draft proposes position 0; the other draft tokens fill later positions in
        # order, at most one per draft each, so the per-position counts only ever grow.
        remaining = draft_tokens
        for pos in range(self.k):
            take = drafts if pos == 0 else min(drafts, max(remaining, 0))
            state.drafted_per_pos[pos] += take
            remaining -= take
        if drafts or draft_tokens:
            state.last = (drafts, draft_tokens, sum(accepted_per_pos))

    def simulate(self, drafts: int) -> None:
        """Run `drafts` random drafts spread over the engines, accepting a prefix of each."""
        _check_count("drafts", drafts)
        # Position i is tried only if i-1 was accepted, with conditional probability
        # acceptance**(i+1): later positions fall off as with real draft models.
        conditional = [self.acceptance ** (i + 1) for i in range(self.k)]
        rng = self._rng
        per_engine = [(0, 0, [0] * (self.k + 1)) for _ in range(self.engines)]
        for _ in range(drafts):
            engine = rng.randrange(self.engines)
            proposed = rng.randint(1, self.k) if self.ngram else self.k
            accepted = 0
            while accepted < proposed and rng.random() < conditional[accepted]:
                accepted += 1
            n, tokens, by_length = per_engine[engine]
            by_length[accepted] += 1
            per_engine[engine] = (n + 1, tokens + proposed, by_length)
        for engine, (n, tokens, by_length) in enumerate(per_engine):
            # A draft that accepted L tokens counts once at every position below L.
            per_pos = [sum(by_length[pos + 1 :]) for pos in range(self.k)]
            self.add(engine, n, tokens, per_pos)

    def totals(self) -> dict:
        """Return the counters summed over engines, per position keyed by int."""
        per_pos = {
            pos: sum(e.accepted_per_pos[pos] for e in self._engines) for pos in range(self.k)
        }
        return {
            "num_drafts": sum(e.drafts for e in self._engines),
            "num_draft_tokens": sum(e.draft_tokens for e in self._engines),
            "num_accepted_tokens": sum(per_pos.values()),
            "accepted_per_pos": per_pos,
        }

    @property
    def metrics_path(self) -> str:
        """Where this dialect's server serves Prometheus text."""
        return "/prometheus/metrics" if self.dialect == "trtllm" else "/metrics"

    def render(self) -> bytes:
        """Return the full /metrics page in Prometheus text format 0.0.4."""
        if self.dialect in _OTHER_ENGINES:
            return _render_other_engine(self)
        key = (self._generation, self.lora_adapters)
        now = time.monotonic()
        if key != self._rest_key or now - self._rest_at >= REST_REFRESH_SECONDS:
            self._head = generate_latest(_Families(self._process_families()))
            self._rest = generate_latest(_Families(self._rest_families()))
            self._rest_key, self._rest_at = key, now
        spec = generate_latest(_Families(self._spec_families())) if self.spec_decode else b""
        return self._head + spec + self._rest

    def _created_or_none(self) -> float | None:
        """Return the _created value, or None when the page must not carry _created series."""
        return self._created if self.emit_created else None

    def _spec_families(self) -> list[Metric]:
        """Build the spec-decode families of the current counters."""
        if self.dialect == "vllm-v0":
            return self._spec_families_v0()
        created = self._created_or_none()
        labels = ["engine", "model_name"]
        families: list[Metric] = []
        for name, help_text, key in _SPEC_V1:
            family = CounterMetricFamily(name, help_text, labels=labels)
            for index, state in enumerate(self._engines):
                value = _engine_value(state, key)
                family.add_metric([str(index), self.model_name], float(value), created=created)
            families.append(family)
        per_pos = CounterMetricFamily(*_SPEC_V1_PER_POS, labels=[*labels, "position"])
        # A real data-parallel page (vLLM PR 24049) lists these position-major: every engine
        # of position 0, then of position 1, and so on.
        for pos in range(self.k):
            for index, state in enumerate(self._engines):
                per_pos.add_metric(
                    [str(index), self.model_name, str(pos)],
                    float(state.accepted_per_pos[pos]),
                    created=created,
                )
        families.append(per_pos)
        return families

    def _spec_families_v0(self) -> list[Metric]:
        """Build V0's spec-decode families: model_name only, engines summed, no drafts counter."""
        totals = self.totals()
        drafts, tokens = totals["num_drafts"], totals["num_draft_tokens"]
        accepted = totals["num_accepted_tokens"]
        # Every V0 verification step emits the accepted tokens plus one token of the target model.
        emitted = accepted + drafts
        labels = [self.model_name]
        rate = GaugeMetricFamily(
            "vllm:spec_decode_draft_acceptance_rate",
            "Speulative token acceptance rate.",
            labels=["model_name"],
        )
        efficiency = GaugeMetricFamily(
            "vllm:spec_decode_efficiency",
            "Speculative decoding system efficiency.",
            labels=["model_name"],
        )
        if drafts:
            rate.add_metric(labels, accepted / tokens if tokens else 0.0)
            efficiency.add_metric(labels, emitted / (drafts * (self.k + 1)))
        families: list[Metric] = [rate, efficiency]
        for name, help_text, value in (
            ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", accepted),
            ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", tokens),
            ("vllm:spec_decode_num_emitted_tokens", "Number of emitted tokens.", emitted),
        ):
            family = CounterMetricFamily(name, help_text, labels=["model_name"])
            family.add_metric(labels, float(value), created=self._created_or_none())
            families.append(family)
        return families

    def _process_families(self) -> list[Metric]:
        """Build the python_gc_*/process_* families that prometheus_client adds to every page."""
        work = sum(e.drafts for e in self._engines)
        families: list[Metric] = []
        gc_collected = CounterMetricFamily(
            "python_gc_objects_collected", "Objects collected during gc", labels=["generation"]
        )
        gc_uncollectable = CounterMetricFamily(
            "python_gc_objects_uncollectable",
            "Uncollectable objects found during GC",
            labels=["generation"],
        )
        gc_collections = CounterMetricFamily(
            "python_gc_collections",
            "Number of times this generation was collected",
            labels=["generation"],
        )
        for generation, (collected, collections) in enumerate(
            (
                (18210 + work // 3, 3102 + work // 50),
                (4571 + work // 40, 281 + work // 600),
                (1302, 17),
            )
        ):
            gc_collected.add_metric([str(generation)], float(collected))
            gc_uncollectable.add_metric([str(generation)], 0.0)
            gc_collections.add_metric([str(generation)], float(collections))
        families += [gc_collected, gc_uncollectable, gc_collections]
        info = GaugeMetricFamily(
            "python_info",
            "Python platform information",
            labels=["implementation", "major", "minor", "patchlevel", "version"],
        )
        info.add_metric(["CPython", "3", "12", "9", "3.12.9"], 1.0)
        families.append(info)
        for name, help_text, value in (
            ("process_virtual_memory_bytes", "Virtual memory size in bytes.", 3.4412224512e10),
            ("process_resident_memory_bytes", "Resident memory size in bytes.", 2.197557248e09),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                round(self._created - 42.0, 2),
            ),
        ):
            families.append(GaugeMetricFamily(name, help_text, value=value))
        families.append(
            CounterMetricFamily(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                value=61.93 + work * 0.0004,
            )
        )
        families.append(
            GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", value=45.0)
        )
        families.append(
            GaugeMetricFamily(
                "process_max_fds", "Maximum number of open file descriptors.", value=1048576.0
            )
        )
        return families

    def _rest_families(self) -> list[Metric]:
        """Build vLLM's other families and the HTTP server's, derived from the traffic so far."""
        v1 = self.dialect == "vllm"
        # (engine label, steps, accepted tokens); V0 pages have one series per model, no engine.
        if v1:
            ranks = [
                (str(i), e.drafts, sum(e.accepted_per_pos)) for i, e in enumerate(self._engines)
            ]
            labels = ["model_name", "engine"]
        else:
            totals = self.totals()
            ranks = [("", totals["num_drafts"], totals["num_accepted_tokens"])]
            labels = ["model_name"]
        models = [self.model_name] + [
            f"{self.model_name}-lora-{i}" for i in range(1, self.lora_adapters + 1)
        ]
        series = []
        for variant, model in enumerate(models):
            for rank, steps, accepted in ranks:
                # A string seed keeps every series a pure function of seed and traffic, so a
                # refresh at any moment renders the same bytes for the same counters.
                rng = random.Random(f"{self.seed}:{model}:{rank}:{steps}")
                share = 1.0 if variant == 0 else rng.uniform(0.05, 0.6)
                tokens = int((steps + accepted) * share)
                traffic = {
                    "tokens": tokens,
                    "requests": tokens // _TOKENS_PER_REQUEST,
                    "steps": int(steps * share) // _SEQUENCES_PER_STEP,
                }
                label_values = [model, rank] if v1 else [model]
                series.append((label_values, traffic, rng))
        created = self._created_or_none()
        families = self._scalar_families(labels, series, v1)
        if self.histograms:
            for spec in _HISTOGRAMS:
                if spec.v1_only and not v1:
                    continue
                family = HistogramMetricFamily(spec.name, spec.help, labels=labels)
                for label_values, traffic, rng in series:
                    _add_histogram(
                        family, labels, label_values, spec, traffic[spec.per], rng, created
                    )
                families.append(family)
        families += self._http_families(series)
        return families

    def _scalar_families(self, labels: list[str], series: list, v1: bool) -> list[Metric]:
        """Build vLLM's gauges and counters per model and engine."""
        created = self._created_or_none()
        running = GaugeMetricFamily(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels=labels,
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels=labels,
        )
        gpu_cache = GaugeMetricFamily(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage."
            + ("DEPRECATED: Use vllm:kv_cache_usage_perc instead." if v1 else ""),
            labels=labels,
        )
        kv_cache = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            labels=labels,
        )
        counters = {
            name: CounterMetricFamily(name, help_text, labels=labels)
            for name, help_text in (
                (
                    "vllm:prefix_cache_queries",
                    "Prefix cache queries, in terms of number of queried tokens.",
                ),
                (
                    "vllm:prefix_cache_hits",
                    "Prefix cache hits, in terms of number of cached tokens.",
                ),
                ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
                ("vllm:prompt_tokens", "Number of prefill tokens processed."),
                ("vllm:generation_tokens", "Number of generation tokens processed."),
            )
        }
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*labels, "finished_reason"],
        )
        cache_info_labels = ["block_size", "cache_dtype", "enable_prefix_caching"]
        cache_info_labels += ["engine"] if v1 else []
        cache_info_labels += ["gpu_memory_utilization", "num_cpu_blocks", "num_gpu_blocks"]
        cache_info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=cache_info_labels,
        )
        for label_values, traffic, rng in series:
            requests, tokens = traffic["requests"], traffic["tokens"]
            busy = tokens > 0
            running.add_metric(label_values, float(rng.randint(1, 24) if busy else 0))
            waiting.add_metric(label_values, float(rng.randint(0, 3) if busy else 0))
            usage = rng.uniform(0.02, 0.6) if busy else 0.0
            gpu_cache.add_metric(label_values, usage)
            kv_cache.add_metric(label_values, usage)
            prompt = requests * rng.randint(400, 900)
            values = {
                "vllm:prefix_cache_queries": prompt,
                "vllm:prefix_cache_hits": int(prompt * rng.uniform(0.1, 0.5)),
                "vllm:num_preemptions": requests // 500,
                "vllm:prompt_tokens": prompt,
                "vllm:generation_tokens": tokens,
            }
            for name, value in values.items():
                counters[name].add_metric(label_values, float(value), created=created)
            length = requests // 7
            abort = requests // 100
            for reason, count in (
                ("stop", requests - length - abort),
                ("length", length),
                ("abort", abort),
            ):
                success.add_metric([*label_values, reason], float(count), created=created)
        families: list[Metric] = [running, waiting, gpu_cache]
        if v1:
            families.append(kv_cache)
            families += counters.values()
        else:
            families += [
                counters[name]
                for name in ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens")
            ]
        families.append(success)
        for rank in sorted({values[1] for values, _, _ in series} if v1 else {""}):
            engine = [rank] if v1 else []
            cache_info.add_metric(["16", "auto", "True", *engine, "0.9", "0", "27495"], 1.0)
        families.append(cache_info)
        return families

    def _http_families(self, series: list) -> list[Metric]:
        """Build the HTTP metrics of vLLM's API server (prometheus-fastapi-instrumentator)."""
        created = self._created_or_none()
        requests = sum(traffic["requests"] for _, traffic, _ in series)
        rng = random.Random(f"{self.seed}:http:{requests}")
        scrapes = 120 + requests // 10
        handlers = (
            ("/v1/chat/completions", "POST", requests * 3 // 4, 2.4),
            ("/v1/completions", "POST", requests - requests * 3 // 4, 2.1),
            ("/metrics", "GET", scrapes, 0.004),
            ("/health", "GET", scrapes // 2, 0.001),
            ("/v1/models", "GET", 3, 0.002),
        )
        total = CounterMetricFamily(
            "http_requests",
            "Total number of requests by method, status and handler.",
            labels=["handler", "method", "status"],
        )
        request_size = SummaryMetricFamily(
            "http_request_size_bytes",
            "Content length of incoming requests by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            labels=["handler"],
        )
        response_size = SummaryMetricFamily(
            "http_response_size_bytes",
            "Content length of outgoing responses by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            labels=["handler"],
        )
        duration = HistogramMetricFamily(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by "
            "handler is important. ",
            labels=["handler", "method"],
        )
        for handler, method, count, seconds in handlers:
            total.add_metric([handler, method, "2xx"], float(count), created=created)
            request_size.add_metric([handler], float(count), float(count * 1800))
            response_size.add_metric([handler], float(count), float(count * 2600))
            spec = _HistSpec(duration.name, "", [0.1, 0.5, 1.0], "requests", math.log(seconds), 0.6)
            _add_histogram(
                duration, ["handler", "method"], [handler, method], spec, count, rng, created
            )
            if created is not None:
                for summary in (request_size, response_size):
                    summary.add_sample(summary.name + "_created", {"handler": handler}, created)
        highr = HistogramMetricFamily(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate "
            "percentile calculations. ",
            labels=[],
        )
        calls = sum(count for _, _, count, _ in handlers)
        spec = _HistSpec(highr.name, "", _HTTP_HIGHR_BUCKETS, "requests", -1.0, 2.0)
        _add_histogram(highr, [], [], spec, calls, rng, created)
        if not self.histograms:
            return [total]
        return [total, request_size, response_size, highr, duration]


def _add_histogram(
    family: HistogramMetricFamily,
    label_names: list[str],
    label_values: list[str],
    spec: _HistSpec,
    count: int,
    rng: random.Random,
    created: float | None,
) -> None:
    """Add one series of `count` lognormal observations to a histogram family."""
    drawn = min(count, _HIST_SAMPLES)
    values = [rng.lognormvariate(spec.mu, spec.sigma) for _ in range(drawn)]
    if spec.integer:
        values = [float(max(1, round(v))) for v in values]
    scale = count / drawn if drawn else 0.0
    buckets = [
        (floatToGoString(bound), float(round(sum(v <= bound for v in values) * scale)))
        for bound in spec.bounds
    ]
    buckets.append(("+Inf", float(count)))
    family.add_metric(label_values, buckets, sum(values) * scale)
    if created is not None:
        family.add_sample(
            family.name + "_created", dict(zip(label_names, label_values, strict=True)), created
        )


def _cxx(value: float) -> str:
    """A double as a C++ stream prints it by default (6 significant digits), as llama.cpp does."""
    return f"{value:g}"


def _render_llamacpp(server: FakeServer) -> bytes:
    """llama.cpp's /metrics: server_task_result_metrics::to_metrics() in server-task.cpp."""
    totals = server.totals()
    drafts, tokens = totals["num_drafts"], totals["num_draft_tokens"]
    accepted = totals["num_accepted_tokens"]
    generated = accepted + drafts
    counters = (
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
         generated * 3),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", 0),
        ("prompt_seconds_total", "Total time spent processing prompts", generated * 0.0002),
        ("tokens_predicted_total", "Number of generation tokens processed", generated),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens",
         generated * 0.01),
        ("n_decode_total", "Total number of llama_decode() calls, excluding speculative "
         "decoding and multimodal decoding", drafts),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)",
         min(generated, MAX_MODEL_LEN)),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated",
         tokens),
        ("spec_decode_num_accepted_tokens_total",
         "Speculative: Total draft tokens accepted by the target model", accepted),
        ("spec_decode_num_drafts_total",
         "Speculative: Total speculative decoding verification steps", drafts),
    )
    gauges = (
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", 5000.0 if drafts else 0),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
         100.0 if drafts else 0),
        ("requests_processing", "Number of requests processing", 0),
        ("requests_deferred", "Number of requests deferred", 0),
        ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
         1.0 if drafts else 0),
    )
    lines = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, help_text, value in items:
            lines += [
                f"# HELP llamacpp:{name} {help_text}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {_cxx(float(value))}",
            ]
    if server.spec_decode and drafts:
        # Sized to the draft length once a draft was verified; uint64 values print exactly.
        name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        lines += [f"# HELP {name} Accepted tokens per draft position", f"# TYPE {name} counter"]
        for pos, value in totals["accepted_per_pos"].items():
            lines.append(f'{name}{{position="{pos}"}} {value}')
    return ("\n".join(lines) + "\n").encode()


def _render_sglang(server: FakeServer) -> bytes:
    """SGLang's scheduler families (python/sglang/srt/metrics/collector.py), one rank each."""
    label_names = ["model_name", "engine_type", "tp_rank", "pp_rank"]
    if server.engines > 1:
        label_names.append("dp_rank")
    length = GaugeMetricFamily(
        "sglang:spec_accept_length",
        "The average acceptance length of speculative decoding.",
        labels=label_names,
    )
    rate = GaugeMetricFamily(
        "sglang:spec_accept_rate",
        "The average acceptance rate of speculative decoding (`accepted tokens / total draft "
        "tokens` in batch).",
        labels=label_names,
    )
    running = GaugeMetricFamily(
        "sglang:num_running_reqs", "The number of running requests.", labels=label_names
    )
    throughput = GaugeMetricFamily(
        "sglang:gen_throughput", "The generation throughput (token/s).", labels=label_names
    )
    prompt = CounterMetricFamily(
        "sglang:prompt_tokens", "Number of prefill tokens processed.", labels=label_names
    )
    generation = CounterMetricFamily(
        "sglang:generation_tokens", "Number of generation tokens processed.", labels=label_names
    )
    for index, state in enumerate(server._engines):
        values = [server.model_name, "unified", "0", "0"] + (
            [str(index)] if server.engines > 1 else []
        )
        drafts, tokens, accepted = state.last
        if server.spec_decode and drafts:
            # Over the last logging interval: length counts the bonus token of each forward.
            length.add_metric(values, 1.0 + accepted / drafts)
            rate.add_metric(values, accepted / tokens if tokens else 0.0)
        else:
            # Before any decode batch is logged, and always without spec decoding, SGLang
            # shows both gauges at 0.
            length.add_metric(values, 0.0)
            rate.add_metric(values, 0.0)
        generated = sum(state.accepted_per_pos) + state.drafts
        running.add_metric(values, 4.0 if generated else 0.0)
        throughput.add_metric(values, 120.5 if drafts else 0.0)
        prompt.add_metric(values, float(generated * 3))
        generation.add_metric(values, float(generated))
    families = [running, throughput, length, rate, prompt, generation]
    return generate_latest(_Families(families))


def _render_trtllm(server: FakeServer) -> bytes:
    """trtllm-serve's /prometheus/metrics (tensorrt_llm/metrics/collector.py), multiprocess."""
    labels = ["model_name", "engine_type"]
    values = [server.model_name, "trtllm"]
    totals = server.totals()
    drafts, tokens = totals["num_drafts"], totals["num_draft_tokens"]
    accepted = totals["num_accepted_tokens"]
    families: list[Metric] = []
    running = GaugeMetricFamily(
        "trtllm_num_requests_running", "Number of active requests", labels=labels
    )
    running.add_metric(values, 4.0 if drafts else 0.0)
    families.append(running)
    generation = CounterMetricFamily(
        "trtllm_generation_tokens",
        "Cumulative number of generation (output) tokens produced.",
        labels=labels,
    )
    generation.add_metric(values, float(accepted + drafts))
    families.append(generation)
    if server.spec_decode and tokens:
        # Counters are created on the first inc() of a label set: absent until spec activity.
        for name, help_text, value in (
            ("trtllm_spec_decode_num_draft_tokens",
             "Total number of draft tokens in speculative decoding", tokens),
            ("trtllm_spec_decode_num_accepted_tokens",
             "Total number of accepted tokens in speculative decoding", accepted),
        ):
            family = CounterMetricFamily(name, help_text, labels=labels)
            family.add_metric(values, float(value))
            families.append(family)
        last = [e.last for e in server._engines]
        last_drafts = sum(d for d, _, _ in last)
        length = GaugeMetricFamily(
            "trtllm_spec_decode_acceptance_length",
            "Acceptance length in speculative decoding",
            labels=labels,
        )
        if last_drafts:
            length.add_metric(values, 1.0 + sum(a for _, _, a in last) / last_drafts)
        families.append(length)
        pos_labels = [*labels, "token_position"]
        drafted = CounterMetricFamily(
            "trtllm_spec_decode_drafted_tokens",
            "Total drafted tokens per speculative decoding position.",
            labels=pos_labels,
        )
        accepted_pos = CounterMetricFamily(
            "trtllm_spec_decode_accepted_tokens",
            "Total accepted tokens per speculative decoding position.",
            labels=pos_labels,
        )
        for pos in range(server.k):
            n_drafted = sum(e.drafted_per_pos[pos] for e in server._engines)
            n_accepted = totals["accepted_per_pos"][pos]
            # A position's series exists once something was drafted (accepted) there.
            if n_drafted:
                drafted.add_metric([*values, str(pos)], float(n_drafted))
            if n_accepted:
                accepted_pos.add_metric([*values, str(pos)], float(n_accepted))
        families += [drafted, accepted_pos]
    return generate_latest(_Families(families))


def _render_other_engine(server: FakeServer) -> bytes:
    """The page of a non-vLLM engine speaking `server.dialect`."""
    if server.dialect == "llamacpp":
        return _render_llamacpp(server)
    if server.dialect == "sglang":
        return _render_sglang(server)
    return _render_trtllm(server)


FAKE_SERVER = web.AppKey("fake_server", FakeServer)
_TRAFFIC_ON = web.AppKey("fake_traffic_on", asyncio.Event)


def _accepts_gzip(header: str) -> bool:
    """Return whether an Accept-Encoding header allows gzip (q=0 refuses it)."""
    for part in header.split(","):
        coding, _, params = part.partition(";")
        if coding.strip().lower() not in ("gzip", "*"):
            continue
        quality = params.strip().removeprefix("q=").strip()
        try:
            return not quality or float(quality) > 0
        except ValueError:
            return True
    return False


async def _metrics(request: web.Request) -> web.Response:
    """Serve the page, gzip-compressed when the client accepts it."""
    body = request.app[FAKE_SERVER].render()
    headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
    if _accepts_gzip(request.headers.get("Accept-Encoding", "")):
        body = gzip.compress(body, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


def _totals_json(server: FakeServer) -> dict:
    """Return totals() with JSON-safe (string) position keys."""
    totals = server.totals()
    totals["accepted_per_pos"] = {str(p): v for p, v in totals["accepted_per_pos"].items()}
    return totals


async def _iteration_stats(request: web.Request) -> web.Response:
    """Answer what trtllm-serve's /metrics answers: a JSON list of iteration stats."""
    return web.json_response([])


async def _totals(request: web.Request) -> web.Response:
    """Answer the summed counters."""
    return web.json_response(_totals_json(request.app[FAKE_SERVER]))


async def _restart(request: web.Request) -> web.Response:
    """Restart the simulated server."""
    server = request.app[FAKE_SERVER]
    server.restart()
    return web.json_response(_totals_json(server))


async def _add(request: web.Request) -> web.Response:
    """Add exact increments from a JSON body."""
    server = request.app[FAKE_SERVER]
    try:
        body = await request.json()
        server.add(
            body["engine"], body["drafts"], body["draft_tokens"], list(body["accepted_per_pos"])
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        return web.json_response({"error": what}, status=400)
    return web.json_response(_totals_json(server))


def _set_traffic(on: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Return a handler that pauses or resumes the simulated traffic."""

    async def handler(request: web.Request) -> web.Response:
        event = request.app[_TRAFFIC_ON]
        if on:
            event.set()
        else:
            event.clear()
        return web.json_response({"paused": not on})

    return handler


def make_fake_app(
    server: FakeServer, *, drafts_per_second: float = 0.0, tick: float = 0.25
) -> web.Application:
    """Build the aiohttp app serving the fake /metrics, control endpoints and optional traffic."""
    app = web.Application()
    app[FAKE_SERVER] = server
    app[_TRAFFIC_ON] = asyncio.Event()
    app[_TRAFFIC_ON].set()
    app.router.add_get(server.metrics_path, _metrics)
    if server.metrics_path != "/metrics":
        # trtllm-serve answers /metrics with JSON iteration stats, not Prometheus text.
        app.router.add_get("/metrics", _iteration_stats)
    app.router.add_get("/control/totals", _totals)
    app.router.add_post("/control/restart", _restart)
    app.router.add_post("/control/add", _add)
    app.router.add_post("/control/pause", _set_traffic(False))
    app.router.add_post("/control/resume", _set_traffic(True))

    async def traffic(app: web.Application):
        async def run() -> None:
            owed = 0.0
            while True:
                await asyncio.sleep(tick)
                await app[_TRAFFIC_ON].wait()
                # Carry the fraction so low rates still produce drafts on average.
                owed += drafts_per_second * tick
                drafts = int(owed)
                owed -= drafts
                if drafts:
                    server.simulate(drafts)

        task = asyncio.create_task(run())
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    if drafts_per_second > 0:
        app.cleanup_ctx.append(traffic)
    return app


async def serve_fake_vllm(
    host: str, port: int, server: FakeServer, drafts_per_second: float
) -> None:
    """Serve a fake vLLM on host:port until cancelled."""
    runner = web.AppRunner(make_fake_app(server, drafts_per_second=drafts_per_second))
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def page_for_bench(engines: int, target_bytes: int | None = None, seed: int = 0) -> bytes:
    """Return a realistic page; with target_bytes, add LoRA model variants until it is that big."""
    server = FakeServer(engines=engines, seed=seed)
    server.simulate(4000 * engines)
    page = server.render()
    if target_bytes is None or len(page) >= target_bytes:
        return page
    server.lora_adapters = 1
    per_variant = max(1, len(server.render()) - len(page))
    server.lora_adapters = max(1, math.ceil((target_bytes - len(page)) / per_variant))
    page = server.render()
    while len(page) < target_bytes:
        server.lora_adapters += 1
        page = server.render()
    return page
