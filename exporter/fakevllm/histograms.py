"""vLLM's histograms as data (names, HELP, bounds), drawn as `count` lognormal observations."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

# The 1-2-5 bounds vLLM's build_1_2_5_buckets(max_model_len) makes of this typical length.
MAX_MODEL_LEN = 8192


def _bounds(text: str) -> list[float]:
    return [float(bound) for bound in text.split()]


_TOKEN_BUCKETS = _bounds("1 2 5 10 20 50 100 200 500 1000 2000 5000")
_LATENCY_BUCKETS = _bounds(
    "0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680"
)
_TTFT_BUCKETS = _bounds(
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10 20 40 80 160 640 2560"
)
_TPOT_BUCKETS = _bounds(
    "0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5 5 7.5 10 20 40 80"
)
HTTP_HIGHR_BUCKETS = _bounds(
    "0.01 0.025 0.05 0.075 0.1 0.25 0.5 0.75 1 1.5 2 2.5 3 3.5 4 4.5 5 7.5 10 30 60"
)


@dataclass(frozen=True)
class HistSpec:
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
HISTOGRAMS = (
    HistSpec("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
             _bounds("1 8 16 32 64 128 256 512 1024 2048 4096 8192 16384"), "steps", 3.0, 1.2,
             integer=True),
    HistSpec("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
             _TTFT_BUCKETS, "requests", -2.0, 1.0),
    HistSpec("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
             _TPOT_BUCKETS, "tokens", -4.0, 0.4),
    HistSpec("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
             _TPOT_BUCKETS, "tokens", -4.0, 0.4, v1_only=True),
    HistSpec("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
             _LATENCY_BUCKETS, "requests", 1.5, 0.8),
    HistSpec("vllm:request_queue_time_seconds",
             "Histogram of time spent in WAITING phase for request.", _LATENCY_BUCKETS, "requests",
             -3.0, 1.5, v1_only=True),
    HistSpec("vllm:request_inference_time_seconds",
             "Histogram of time spent in RUNNING phase for request.", _LATENCY_BUCKETS, "requests",
             1.4, 0.8),
    HistSpec("vllm:request_prefill_time_seconds",
             "Histogram of time spent in PREFILL phase for request.", _LATENCY_BUCKETS, "requests",
             -2.2, 1.0),
    HistSpec("vllm:request_decode_time_seconds",
             "Histogram of time spent in DECODE phase for request.", _LATENCY_BUCKETS, "requests",
             1.3, 0.8),
    HistSpec("vllm:time_per_prefill_token_request_seconds",
             "Time spent per token during prefill  phase in seconds",
             _bounds("0.001 0.002 0.005 0.01 0.02 0.05 0.1 0.2 0.5 1"), "requests", -8.0, 0.8,
             v1_only=True),
    HistSpec("vllm:request_prompt_tokens", "Number of prefill tokens processed.", _TOKEN_BUCKETS,
             "requests", 6.3, 1.0, integer=True),
    HistSpec("vllm:request_generation_tokens", "Number of generation tokens processed.",
             _TOKEN_BUCKETS, "requests", 5.3, 0.7, integer=True),
    HistSpec("vllm:request_max_num_generation_tokens",
             "Histogram of maximum number of requested generation tokens.", _TOKEN_BUCKETS,
             "requests", 6.9, 0.5, integer=True),
    HistSpec("vllm:request_params_n", "Histogram of the n request parameter.",
             [1.0, 2.0, 5.0, 10.0, 20.0], "requests", 0.0, 0.0, integer=True),
    HistSpec("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
             _TOKEN_BUCKETS, "requests", 6.9, 0.5, integer=True),
)

# Histograms are drawn from this many samples and scaled, so a refresh costs the same at any
# traffic volume while buckets stay cumulative and the count stays exact.
HIST_SAMPLES = 48


def add_histogram(
    family: HistogramMetricFamily,
    label_names: list[str],
    label_values: list[str],
    spec: HistSpec,
    count: int,
    rng: random.Random,
    created: float | None,
) -> None:
    """Add one series of `count` lognormal observations to a histogram family."""
    drawn = min(count, HIST_SAMPLES)
    values = [rng.lognormvariate(spec.mu, spec.sigma) for _ in range(drawn)]
    if spec.integer:
        values = [float(max(1, round(v))) for v in values]
    scale = count / drawn if drawn else 0.0
    buckets = [
        # floatToGoString: a bound as Go (and so vLLM's page) prints it.
        (floatToGoString(bound),  # type: ignore[no-untyped-call]
         float(round(sum(v <= bound for v in values) * scale)))
        for bound in spec.bounds
    ]
    buckets.append(("+Inf", float(count)))
    family.add_metric(label_values, buckets, sum(values) * scale)
    if created is not None:
        family.add_sample(
            family.name + "_created", dict(zip(label_names, label_values, strict=True)), created
        )

