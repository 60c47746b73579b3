"""Each engine's per-request spec-decode figures in one answer object, pure, in vLLM's names:
vLLM's `metrics.speculative_decoding` as it is, SGLang's `sglext.spec_tokens_details` (asked for
with `return_spec_tokens_details`) and llama.cpp's `timings.draft_n` / `draft_n_accepted` mapped
onto it. A figure an engine does not report is None and named in `unknown`, never made up.
docs/api.md ("The recording proxy") has the mapping.
"""

from __future__ import annotations

from typing import Any

from exporter.core.unreadable import MAX_HISTOGRAM, Unreadable, as_count, is_rate

STEPS, DRAFTED, ACCEPTED, HISTOGRAM = (
    "num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens", "acceptance_histogram")
SUM_KEYS = (STEPS, DRAFTED, ACCEPTED)
# SGLang's names for ours: a verify forward pass is a step; the proposed drafts are its steps
# times (speculative_num_draft_tokens - 1); the correct drafts exclude the bonus token.
SGLANG_NAMES = {STEPS: "spec_verify_ct", DRAFTED: "spec_num_proposed_drafts",
                ACCEPTED: "spec_num_correct_drafts"}
SGLANG_HISTOGRAM = "spec_correct_drafts_histogram"


def engine_spec(obj: dict[str, Any]) -> dict[str, Any] | Unreadable | None:
    """One answer object's (body or stream chunk) figures, in whichever engine's shape it
    carries them; why not when they break that engine's own rules; None when it has none."""
    vllm = _spec_object(obj.get("metrics"))
    if vllm is not None:
        return vllm
    sglext = obj.get("sglext")
    if isinstance(sglext, dict) and sglext.get("spec_tokens_details") is not None:
        return sglang_spec(sglext["spec_tokens_details"])
    timings = obj.get("timings")
    if isinstance(timings, dict) and "draft_n" in timings:
        return llamacpp_spec(timings)
    return None


def _spec_object(metrics: object) -> dict[str, Any] | Unreadable | None:
    """The speculative_decoding object when its figures are sound, why not when not, None
    when the answer has none."""
    if not isinstance(metrics, dict) or metrics.get("speculative_decoding") is None:
        return None
    spec = metrics["speculative_decoding"]
    hist = spec.get("acceptance_histogram") if isinstance(spec, dict) else None
    if isinstance(hist, list) and len(hist) > MAX_HISTOGRAM:
        return Unreadable.HISTOGRAM_TOO_LONG  # before a look at each entry: bounded cost
    if not isinstance(spec, dict) or not isinstance(hist, list) or any(
            as_count(v) is None for v in (*(spec.get(k) for k in SUM_KEYS), *hist)):
        return Unreadable.BAD_COUNTS
    # vLLM's own invariants.
    if spec[ACCEPTED] > spec[DRAFTED]:
        return Unreadable.ACCEPTED_OVER_DRAFTED
    if sum(hist) != spec[STEPS]:
        return Unreadable.HISTOGRAM_NOT_STEPS
    rate = spec.get("draft_acceptance_rate")
    if rate is not None and not is_rate(rate):
        return Unreadable.RATE_OUT_OF_RANGE
    return spec


def sglang_spec(details: object) -> dict[str, Any] | Unreadable | None:
    """SGLang's `spec_tokens_details`: one object, or one per choice (n > 1), summed."""
    items = details if isinstance(details, list) else [details]
    if len(items) > MAX_HISTOGRAM:
        return Unreadable.HISTOGRAM_TOO_LONG  # more choices than a request asks for: bounded
    if not items:
        return None
    read = [_sglang_item(item) for item in items]
    for one in read:
        if isinstance(one, Unreadable):
            return one
    return _summed([one for one in read if not isinstance(one, Unreadable)])


def _sglang_item(item: object) -> dict[str, Any] | Unreadable:
    hist = item.get(SGLANG_HISTOGRAM, []) if isinstance(item, dict) else None
    if isinstance(hist, list) and len(hist) > MAX_HISTOGRAM:
        return Unreadable.HISTOGRAM_TOO_LONG  # before a look at each entry: bounded cost
    if not isinstance(item, dict) or not isinstance(hist, list) or any(
            as_count(v) is None for v in (*(item.get(k) for k in SGLANG_NAMES.values()), *hist)):
        return Unreadable.BAD_COUNTS
    spec: dict[str, Any] = {ours: item[theirs] for ours, theirs in SGLANG_NAMES.items()}
    if spec[ACCEPTED] > spec[DRAFTED]:
        return Unreadable.ACCEPTED_OVER_DRAFTED
    rate = item.get("spec_accept_rate")
    if rate is not None and not is_rate(rate):
        return Unreadable.RATE_OUT_OF_RANGE
    # SGLang sends an empty histogram where it kept none (a server older than the histogram):
    # then it is unknown, not a request of no steps.
    if not hist and spec[STEPS]:
        return {**spec, HISTOGRAM: None}
    if sum(hist) != spec[STEPS]:
        return Unreadable.HISTOGRAM_NOT_STEPS
    if sum(i * n for i, n in enumerate(hist)) != spec[ACCEPTED]:
        return Unreadable.HISTOGRAM_NOT_ACCEPTED
    return {**spec, HISTOGRAM: list(hist)}


def _summed(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The choices' figures as one request's; the histogram unknown if any choice's is."""
    spec: dict[str, Any] = {key: sum(item[key] for item in items) for key in SUM_KEYS}
    hists = [item[HISTOGRAM] for item in items]
    if any(h is None for h in hists):
        return {"engine": "sglang", **spec, HISTOGRAM: None, "unknown": [HISTOGRAM]}
    width = max(len(h) for h in hists)
    spec[HISTOGRAM] = [sum(h[i] for h in hists if i < len(h)) for i in range(width)]
    return {"engine": "sglang", **spec, "unknown": []}


def llamacpp_spec(timings: dict[str, Any]) -> dict[str, Any] | Unreadable:
    """llama.cpp's `timings` with `draft_n` (sent only when a draft was made): drafted and
    accepted tokens; its steps and histogram are not reported."""
    drafted, accepted = as_count(timings.get("draft_n")), as_count(timings.get("draft_n_accepted"))
    if drafted is None or accepted is None:
        return Unreadable.BAD_COUNTS
    if accepted > drafted:
        return Unreadable.ACCEPTED_OVER_DRAFTED
    return {"engine": "llama.cpp", STEPS: None, DRAFTED: drafted, ACCEPTED: accepted,
            HISTOGRAM: None, "unknown": [STEPS, HISTOGRAM]}


def is_partial(spec: dict[str, Any]) -> bool:
    """Whether a spec-decode object lacks its steps or histogram (an engine that does not
    report them): such a request adds its tokens to a window, not a length or a histogram."""
    return bool(spec.get("unknown"))
