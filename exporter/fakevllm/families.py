"""Every family of a vLLM page but the spec-decode ones (process, vLLM's, HTTP), from traffic."""

from __future__ import annotations

import math
import random
from typing import Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from exporter.fakevllm.histograms import HISTOGRAMS, HTTP_HIGHR_BUCKETS, HistSpec, add_histogram
from exporter.fakevllm.model import ServerModel

# Mean generated tokens per request and per engine step, to derive request-level counts.
_TOKENS_PER_REQUEST = 256
_SEQUENCES_PER_STEP = 8


def _gc_families(work: int) -> list[Metric]:
    """Build the python_gc_* families, their counts grown with `work` (drafts so far)."""
    collected, uncollectable, collections = (
        CounterMetricFamily(name, help_text, labels=["generation"])
        for name, help_text in (
            ("python_gc_objects_collected", "Objects collected during gc"),
            ("python_gc_objects_uncollectable", "Uncollectable objects found during GC"),
            ("python_gc_collections", "Number of times this generation was collected"),
        )
    )
    for generation, (objects, times) in enumerate(
        ((18210 + work // 3, 3102 + work // 50), (4571 + work // 40, 281 + work // 600),
         (1302, 17))
    ):
        collected.add_metric([str(generation)], float(objects))
        uncollectable.add_metric([str(generation)], 0.0)
        collections.add_metric([str(generation)], float(times))
    return [collected, uncollectable, collections]


def process_families(server: ServerModel) -> list[Metric]:
    """Build the python_gc_*/process_* families that prometheus_client adds to every page."""
    work = sum(e.drafts for e in server.engine_counters)
    families = _gc_families(work)
    info = GaugeMetricFamily(
        "python_info",
        "Python platform information",
        labels=["implementation", "major", "minor", "patchlevel", "version"],
    )
    info.add_metric(["CPython", "3", "12", "9", "3.12.9"], 1.0)
    families.append(info)
    kind: type[GaugeMetricFamily | CounterMetricFamily]
    for kind, name, help_text, value in (
        (GaugeMetricFamily, "process_virtual_memory_bytes", "Virtual memory size in bytes.",
         3.4412224512e10),
        (GaugeMetricFamily, "process_resident_memory_bytes", "Resident memory size in bytes.",
         2.197557248e09),
        (GaugeMetricFamily, "process_start_time_seconds",
         "Start time of the process since unix epoch in seconds.", round(server.created - 42.0, 2)),
        (CounterMetricFamily, "process_cpu_seconds",
         "Total user and system CPU time spent in seconds.", 61.93 + work * 0.0004),
        (GaugeMetricFamily, "process_open_fds", "Number of open file descriptors.", 45.0),
        (GaugeMetricFamily, "process_max_fds", "Maximum number of open file descriptors.",
         1048576.0),
    ):
        families.append(kind(name, help_text, value=value))
    return families


def rest_families(server: ServerModel) -> list[Metric]:
    """Build vLLM's other families and the HTTP server's, derived from the traffic so far."""
    v1 = server.dialect == "vllm"
    # (engine label, steps, accepted tokens); V0 pages have one series per model, no engine.
    if v1:
        ranks = [(str(i), e.drafts, sum(e.accepted_per_pos))
                 for i, e in enumerate(server.engine_counters)]
        labels = ["model_name", "engine"]
    else:
        totals = server.totals()
        ranks = [("", totals["num_drafts"], totals["num_accepted_tokens"])]
        labels = ["model_name"]
    models = [server.model_name] + [f"{server.model_name}-lora-{i}"
                                    for i in range(1, server.lora_adapters + 1)]
    series = []
    for variant, model in enumerate(models):
        for rank, steps, accepted in ranks:
            # A string seed: a refresh renders the same bytes for the same seed and counters.
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
    # Each series' own rng draws the gauges' numbers, then the counters', then the histograms'.
    families = [*_load_gauges(labels, series, v1), *_token_counters(labels, series, v1, created),
                _cache_info(series, v1)]
    if server.histograms:
        for spec in HISTOGRAMS:
            if spec.v1_only and not v1:
                continue
            family = HistogramMetricFamily(spec.name, spec.help, labels=labels)
            for label_values, traffic, rng in series:
                add_histogram(family, labels, label_values, spec, traffic[spec.per], rng, created)
            families.append(family)
    families += http_families(server, series)
    return families


def _load_gauges(labels: list[str], series: list[Any], v1: bool) -> list[Metric]:
    """vLLM's load gauges but the running one (`running_family`); V0 has no
    kv_cache_usage_perc, but its series draw the same numbers."""
    waiting, gpu_cache, kv_cache = (
        GaugeMetricFamily(name, help_text, labels=labels)
        for name, help_text in (
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
            ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."
             + ("DEPRECATED: Use vllm:kv_cache_usage_perc instead." if v1 else "")),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
        )
    )
    for label_values, traffic, rng in series:
        busy = traffic["tokens"] > 0
        waiting.add_metric(label_values, float(rng.randint(0, 3) if busy else 0))
        usage = rng.uniform(0.02, 0.6) if busy else 0.0
        gpu_cache.add_metric(label_values, usage)
        kv_cache.add_metric(label_values, usage)
    return [waiting, gpu_cache, kv_cache] if v1 else [waiting, gpu_cache]


def running_family(server: ServerModel) -> Metric:
    """vllm:num_requests_running as vLLM 0.32 registers it (v1/metrics/loggers.py), from the
    requests decoding now: per engine on V1 pages, summed on V0's."""
    v1 = server.dialect == "vllm"
    running = GaugeMetricFamily("vllm:num_requests_running",
                                "Number of requests in model execution batches.",
                                labels=["model_name", "engine"] if v1 else ["model_name"])
    engines = range(server.engines)
    if v1:
        for engine in engines:
            running.add_metric([server.model_name, str(engine)], float(server.running(engine)))
    else:
        running.add_metric([server.model_name], float(sum(map(server.running, engines))))
    return running


def _token_counters(
    labels: list[str], series: list[Any], v1: bool, created: float | None
) -> list[Metric]:
    """Build vLLM's token and request counters per model and engine (fewer on V0 pages)."""
    counters = [
        CounterMetricFamily(name, help_text, labels=labels)
        for name, help_text in (
            ("vllm:prefix_cache_queries",
             "Prefix cache queries, in terms of number of queried tokens."),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
            ("vllm:prompt_tokens", "Number of prefill tokens processed."),
            ("vllm:generation_tokens", "Number of generation tokens processed."),
        )
    ]
    success = CounterMetricFamily("vllm:request_success",
                                  "Count of successfully processed requests.",
                                  labels=[*labels, "finished_reason"])
    for label_values, traffic, rng in series:
        requests, tokens = traffic["requests"], traffic["tokens"]
        prompt = requests * rng.randint(400, 900)
        hits = int(prompt * rng.uniform(0.1, 0.5))
        values = (prompt, hits, requests // 500, prompt, tokens)
        for family, value in zip(counters, values, strict=True):
            family.add_metric(label_values, float(value), created=created)
        length = requests // 7
        abort = requests // 100
        for reason, count in (("stop", requests - length - abort), ("length", length),
                              ("abort", abort)):
            success.add_metric([*label_values, reason], float(count), created=created)
    # V0 pages have no prefix-cache counters.
    return [*(counters if v1 else counters[2:]), success]


def _cache_info(series: list[Any], v1: bool) -> Metric:
    """Build vllm:cache_config_info: one series per engine on V1 pages, one on V0's."""
    cache_info = GaugeMetricFamily(
        "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
        labels=["block_size", "cache_dtype", "enable_prefix_caching", *(["engine"] if v1 else []),
                "gpu_memory_utilization", "num_cpu_blocks", "num_gpu_blocks"])
    for rank in sorted({values[1] for values, _, _ in series} if v1 else {""}):
        engine = [rank] if v1 else []
        cache_info.add_metric(["16", "auto", "True", *engine, "0.9", "0", "27495"], 1.0)
    return cache_info


def http_families(server: ServerModel, series: list[Any]) -> list[Metric]:
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
    total = CounterMetricFamily("http_requests",
                                "Total number of requests by method, status and handler.",
                                labels=["handler", "method", "status"])
    request_size, response_size = (
        SummaryMetricFamily(f"http_{kind}_size_bytes",
                            f"Content length of {what} by handler. Only value of header is "
                            "respected. Otherwise ignored. No percentile calculated. ",
                            labels=["handler"])
        for kind, what in (("request", "incoming requests"), ("response", "outgoing responses"))
    )
    duration = HistogramMetricFamily(
        "http_request_duration_seconds",
        "Latency with only few buckets by handler. Made to be only used if aggregation by "
        "handler is important. ", labels=["handler", "method"])
    for handler, method, count, seconds in handlers:
        total.add_metric([handler, method, "2xx"], float(count), created=created)
        request_size.add_metric([handler], count, float(count * 1800))
        response_size.add_metric([handler], count, float(count * 2600))
        spec = HistSpec(duration.name, "", [0.1, 0.5, 1.0], "requests", math.log(seconds), 0.6)
        add_histogram(duration, ["handler", "method"], [handler, method], spec, count, rng, created)
        if created is not None:
            for summary in (request_size, response_size):
                summary.add_sample(summary.name + "_created", {"handler": handler}, created)
    highr = HistogramMetricFamily(
        "http_request_duration_highr_seconds",
        "Latency with many buckets but no API specific labels. Made for more accurate "
        "percentile calculations. ", labels=[])
    calls = sum(count for _, _, count, _ in handlers)
    spec = HistSpec(highr.name, "", HTTP_HIGHR_BUCKETS, "requests", -1.0, 2.0)
    add_histogram(highr, [], [], spec, calls, rng, created)
    if not server.histograms:
        return [total]
    return [total, request_size, response_size, highr, duration]


