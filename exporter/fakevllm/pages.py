"""One page renderer per dialect: the simulator's /metrics, as each server prints it."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.fakevllm.families import process_families, rest_families, running_family
from exporter.fakevllm.histograms import MAX_MODEL_LEN
from exporter.fakevllm.model import EngineCounters, ServerModel

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds the non-spec-decode rest (most of a big page's cost) is kept, unless restarted or resized.
REST_REFRESH_SECONDS = 10.0

# V1 families of vllm/v1/spec_decode/metrics.py: (name without _total, HELP, engine's count).
_SPEC_V1: tuple[tuple[str, str, Callable[[EngineCounters], int]], ...] = (
    ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", lambda e: e.drafts),
    ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", lambda e: e.draft_tokens),
    ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
     lambda e: sum(e.accepted_per_pos)),
)


class _Families(list[Metric]):
    """Metric families as the collector generate_latest wants."""

    def collect(self) -> list[Metric]:
        return self


def spec_families(server: ServerModel) -> list[Metric]:
    if server.dialect == "vllm-v0":
        return spec_families_v0(server)
    created = server.created_or_none()
    labels = ["engine", "model_name"]
    families: list[Metric] = []
    for name, help_text, count in _SPEC_V1:
        family = CounterMetricFamily(name, help_text, labels=labels)
        for index, state in enumerate(server.engine_counters):
            family.add_metric([str(index), server.model_name], float(count(state)), created=created)
        families.append(family)
    per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                  "Accepted tokens per draft position.",
                                  labels=[*labels, "position"])
    # Position-major (every engine of position 0, then of 1), as on vLLM PR 24049's pages.
    for pos in range(server.k):
        for index, state in enumerate(server.engine_counters):
            per_pos.add_metric([str(index), server.model_name, str(pos)],
                               float(state.accepted_per_pos[pos]), created=created)
    families.append(per_pos)
    return families


def spec_families_v0(server: ServerModel) -> list[Metric]:
    """Build V0's spec-decode families: model_name only, engines summed, no drafts counter."""
    totals = server.totals()
    drafts, tokens = totals["num_drafts"], totals["num_draft_tokens"]
    accepted = totals["num_accepted_tokens"]
    # Every V0 verification step emits the accepted tokens plus one token of the target model.
    emitted = accepted + drafts
    labels = [server.model_name]
    rate = GaugeMetricFamily("vllm:spec_decode_draft_acceptance_rate",
                             "Speulative token acceptance rate.", labels=["model_name"])
    efficiency = GaugeMetricFamily("vllm:spec_decode_efficiency",
                                   "Speculative decoding system efficiency.", labels=["model_name"])
    if drafts:
        rate.add_metric(labels, accepted / tokens if tokens else 0.0)
        efficiency.add_metric(labels, emitted / (drafts * (server.k + 1)))
    families: list[Metric] = [rate, efficiency]
    for name, help_text, value in (
        ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", accepted),
        ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", tokens),
        ("vllm:spec_decode_num_emitted_tokens", "Number of emitted tokens.", emitted),
    ):
        family = CounterMetricFamily(name, help_text, labels=["model_name"])
        family.add_metric(labels, float(value), created=server.created_or_none())
        families.append(family)
    return families


def _render_vllm(server: ServerModel) -> bytes:
    """vLLM's page (V1 names, or V0's with dialect vllm-v0): process, spec-decode, the rest."""
    cache = server.page_cache
    key = (server.generation, server.lora_adapters)
    now = time.monotonic()
    if key != cache.get("key") or now - cache.get("at", 0.0) >= REST_REFRESH_SECONDS:
        cache["head"] = generate_latest(_Families(process_families(server)))
        cache["rest"] = generate_latest(_Families(rest_families(server)))
        cache["key"], cache["at"] = key, now
    spec = generate_latest(_Families(spec_families(server))) if server.spec_decode else b""
    # The running gauge is not kept with the rest: it moves with every request that starts or
    # ends. After the spec-decode families, as vLLM registers them.
    running = generate_latest(_Families([running_family(server)]))
    return b"".join((cache["head"], spec, running, cache["rest"]))


def _render_llamacpp(server: ServerModel) -> bytes:
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
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", generated * 0.01),
        ("n_decode_total", "Total number of llama_decode() calls, excluding speculative "
         "decoding and multimodal decoding", drafts),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)",
         min(generated, MAX_MODEL_LEN)),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", tokens),
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
            # :g is a double as a C++ stream prints it by default (6 significant digits).
            lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                      f"llamacpp:{name} {float(value):g}"]
    if server.spec_decode and drafts:
        # Sized to the draft length once a draft was verified; uint64 values print exactly.
        name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        lines += [f"# HELP {name} Accepted tokens per draft position", f"# TYPE {name} counter"]
        for pos, value in totals["accepted_per_pos"].items():
            lines.append(f'{name}{{position="{pos}"}} {value}')
    return ("\n".join(lines) + "\n").encode()


def _render_sglang(server: ServerModel) -> bytes:
    """SGLang's scheduler families (python/sglang/srt/metrics/collector.py), one rank each."""
    label_names = ["model_name", "engine_type", "tp_rank", "pp_rank"]
    if server.engines > 1:
        label_names.append("dp_rank")
    length, rate, running, throughput = (
        GaugeMetricFamily(name, help_text, labels=label_names)
        for name, help_text in (
            ("sglang:spec_accept_length", "The average acceptance length of speculative decoding."),
            ("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding "
             "(`accepted tokens / total draft tokens` in batch)."),
            ("sglang:num_running_reqs", "The number of running requests."),
            ("sglang:gen_throughput", "The generation throughput (token/s)."),
        )
    )
    prompt = CounterMetricFamily("sglang:prompt_tokens", "Number of prefill tokens processed.",
                                 labels=label_names)
    generation = CounterMetricFamily("sglang:generation_tokens",
                                     "Number of generation tokens processed.", labels=label_names)
    for index, state in enumerate(server.engine_counters):
        values = [server.model_name, "unified", "0", "0"] + (
            [str(index)] if server.engines > 1 else [])
        drafts, tokens, accepted = state.last
        if server.spec_decode and drafts:
            # Over the last logging interval: length counts the bonus token of each forward.
            length.add_metric(values, 1.0 + accepted / drafts)
            rate.add_metric(values, accepted / tokens if tokens else 0.0)
        else:
            # SGLang shows both at 0 before its first decode batch, and without spec decoding.
            length.add_metric(values, 0.0)
            rate.add_metric(values, 0.0)
        generated = sum(state.accepted_per_pos) + state.drafts
        running.add_metric(values, 4.0 if generated else 0.0)
        throughput.add_metric(values, 120.5 if drafts else 0.0)
        prompt.add_metric(values, float(generated * 3))
        generation.add_metric(values, float(generated))
    families = [running, throughput, length, rate, prompt, generation]
    return generate_latest(_Families(families))


def _trtllm_spec_families(
    server: ServerModel, labels: list[str], values: list[str]
) -> list[Metric]:
    """trtllm-serve's spec-decode families: totals, the last acceptance length, per position."""
    totals = server.totals()
    families: list[Metric] = []
    for name, help_text, value in (
        ("trtllm_spec_decode_num_draft_tokens",
         "Total number of draft tokens in speculative decoding", totals["num_draft_tokens"]),
        ("trtllm_spec_decode_num_accepted_tokens",
         "Total number of accepted tokens in speculative decoding", totals["num_accepted_tokens"]),
    ):
        family = CounterMetricFamily(name, help_text, labels=labels)
        family.add_metric(values, float(value))
        families.append(family)
    last = [e.last for e in server.engine_counters]
    last_drafts = sum(d for d, _, _ in last)
    length = GaugeMetricFamily("trtllm_spec_decode_acceptance_length",
                               "Acceptance length in speculative decoding", labels=labels)
    if last_drafts:
        length.add_metric(values, 1.0 + sum(a for _, _, a in last) / last_drafts)
    families.append(length)
    pos_labels = [*labels, "token_position"]
    drafted, accepted_pos = (
        CounterMetricFamily(f"trtllm_spec_decode_{kind}_tokens",
                            f"Total {kind} tokens per speculative decoding position.",
                            labels=pos_labels)
        for kind in ("drafted", "accepted")
    )
    for pos in range(server.k):
        n_drafted = sum(e.drafted_per_pos[pos] for e in server.engine_counters)
        n_accepted = totals["accepted_per_pos"][pos]
        # A position's series exists once something was drafted (accepted) there.
        if n_drafted:
            drafted.add_metric([*values, str(pos)], float(n_drafted))
        if n_accepted:
            accepted_pos.add_metric([*values, str(pos)], float(n_accepted))
    return [*families, drafted, accepted_pos]


def _render_trtllm(server: ServerModel) -> bytes:
    """trtllm-serve's /prometheus/metrics (tensorrt_llm/metrics/collector.py), multiprocess."""
    labels = ["model_name", "engine_type"]
    values = [server.model_name, "trtllm"]
    totals = server.totals()
    drafts, tokens = totals["num_drafts"], totals["num_draft_tokens"]
    accepted = totals["num_accepted_tokens"]
    running = GaugeMetricFamily("trtllm_num_requests_running", "Number of active requests",
                                labels=labels)
    running.add_metric(values, 4.0 if drafts else 0.0)
    generation = CounterMetricFamily("trtllm_generation_tokens",
                                     "Cumulative number of generation (output) tokens produced.",
                                     labels=labels)
    generation.add_metric(values, float(accepted + drafts))
    families: list[Metric] = [running, generation]
    if server.spec_decode and tokens:
        # Counters are created on the first inc() of a label set: absent until spec activity.
        families += _trtllm_spec_families(server, labels, values)
    return generate_latest(_Families(families))


# One entry per dialect the simulator speaks, keyed as `exporter.core.dialects.REPORTING` is.
RENDERERS: dict[str, Callable[[ServerModel], bytes]] = {
    "vllm": _render_vllm,
    "vllm-v0": _render_vllm,
    "llamacpp": _render_llamacpp,
    "sglang": _render_sglang,
    "trtllm": _render_trtllm,
}
