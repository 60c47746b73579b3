"""The filler of a vLLM page, as data: every family but the spec-decode ones.

A real vLLM /metrics page is mostly histograms; the parser must skip them fast and correctly, so
the simulator draws them as vLLM does (names, HELP, bucket bounds), from the traffic so far.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from exporter.fakevllm.model import FakeServer

# vLLM builds its token-count buckets with build_1_2_5_buckets(max_model_len); 8192 is typical.
MAX_MODEL_LEN = 8192


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


def process_families(server: FakeServer) -> list[Metric]:
    """Build the python_gc_*/process_* families that prometheus_client adds to every page."""
    work = sum(e.drafts for e in server.engine_counters)
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
            round(server.created - 42.0, 2),
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


def rest_families(server: FakeServer) -> list[Metric]:
    """Build vLLM's other families and the HTTP server's, derived from the traffic so far."""
    v1 = server.dialect == "vllm"
    # (engine label, steps, accepted tokens); V0 pages have one series per model, no engine.
    if v1:
        ranks = [
            (str(i), e.drafts, sum(e.accepted_per_pos))
            for i, e in enumerate(server.engine_counters)
        ]
        labels = ["model_name", "engine"]
    else:
        totals = server.totals()
        ranks = [("", totals["num_drafts"], totals["num_accepted_tokens"])]
        labels = ["model_name"]
    models = [server.model_name] + [
        f"{server.model_name}-lora-{i}" for i in range(1, server.lora_adapters + 1)
    ]
    series = []
    for variant, model in enumerate(models):
        for rank, steps, accepted in ranks:
            # A string seed keeps every series a pure function of seed and traffic, so a
            # refresh at any moment renders the same bytes for the same counters.
            rng = random.Random(f"{server.seed}:{model}:{rank}:{steps}")
            share = 1.0 if variant == 0 else rng.uniform(0.05, 0.6)
            tokens = int((steps + accepted) * share)
            traffic = {
                "tokens": tokens,
                "requests": tokens // _TOKENS_PER_REQUEST,
                "steps": int(steps * share) // _SEQUENCES_PER_STEP,
            }
            label_values = [model, rank] if v1 else [model]
            series.append((label_values, traffic, rng))
    created = server.created_or_none()
    families = scalar_families(server, labels, series, v1)
    if server.histograms:
        for spec in _HISTOGRAMS:
            if spec.v1_only and not v1:
                continue
            family = HistogramMetricFamily(spec.name, spec.help, labels=labels)
            for label_values, traffic, rng in series:
                _add_histogram(
                    family, labels, label_values, spec, traffic[spec.per], rng, created
                )
            families.append(family)
    families += http_families(server, series)
    return families


def scalar_families(
    server: FakeServer, labels: list[str], series: list[Any], v1: bool
) -> list[Metric]:
    """Build vLLM's gauges and counters per model and engine."""
    created = server.created_or_none()
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


def http_families(server: FakeServer, series: list[Any]) -> list[Metric]:
    """Build the HTTP metrics of vLLM's API server (prometheus-fastapi-instrumentator)."""
    created = server.created_or_none()
    requests = sum(traffic["requests"] for _, traffic, _ in series)
    rng = random.Random(f"{server.seed}:http:{requests}")
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
        request_size.add_metric([handler], count, float(count * 1800))
        response_size.add_metric([handler], count, float(count * 2600))
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
    if not server.histograms:
        return [total]
    return [total, request_size, response_size, highr, duration]


def _go_float(value: float) -> str:
    """A float as Go (and so vLLM's page) prints a bucket bound."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


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
        (_go_float(bound), float(round(sum(v <= bound for v in values) * scale)))
        for bound in spec.bounds
    ]
    buckets.append(("+Inf", float(count)))
    family.add_metric(label_values, buckets, sum(values) * scale)
    if created is not None:
        family.add_sample(
            family.name + "_created", dict(zip(label_names, label_values, strict=True)), created
        )

