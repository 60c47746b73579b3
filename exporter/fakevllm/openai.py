"""An OpenAI-compatible face for the simulator: completions and chat completions, streamed too.

Enough for real benchmark clients (AISBench, `vllm bench serve`, `openai`); each request decodes
`max_tokens` tokens through the counter model, so the counters match the served tokens. Its
per-request spec-decode figures take the shape of the server's dialect (vLLM's, SGLang's or
llama.cpp's; docs/api.md, "The recording proxy").
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from exporter.fakevllm.model import DRAFT_COST, ServerModel

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_CAP = 32768  # bounds the work one request can ask of the simulator
_WORDS = ("speculative", " decoding", " drafts", " tokens", " and", " the", " target", " model",
          " accepts", " a", " prefix", " of", " them", ",", " then", " emits", " one", " more",
          ".")


class BadRequest(ValueError):
    """A request body the OpenAI API would refuse with 400."""


def _bounded(name: str, value: Any, most: int) -> int:
    """`value` if it is an integer within 1..`most`, else `BadRequest` naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise BadRequest(f"{name} must be an integer within 1..{most}, got {value!r}")
    return value


def max_tokens(body: dict[str, Any]) -> int:
    """The request's output length: `max_tokens` (or chat's `max_completion_tokens`)."""
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return DEFAULT_MAX_TOKENS if value is None else _bounded("max_tokens", value, MAX_TOKENS_CAP)


def prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """Whitespace words of the prompt or the messages, at least 1: a stand-in tokenizer."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise BadRequest("each message needs a string content")
            parts.append(content)
        text = " ".join(parts)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string or a list of strings")
        text = prompt
    return max(1, len(text.split()))


def step_texts(steps: list[tuple[int, int]]) -> Iterator[str]:
    """The text of each decode step: 1 + accepted words."""
    at = 0
    for _, accepted in steps:
        emitted = 1 + accepted
        yield "".join(_WORDS[(at + i) % len(_WORDS)] for i in range(emitted))
        at += emitted


# vLLM's PerRequestMetrics' timing fields (null without --enable-per-request-metrics).
_TIMING = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
           "tokens_per_second")


@dataclass
class _Times:
    """When the request arrived (queued and scheduled at once) and its first and last tokens
    went: vLLM's RequestStateStats, on the monotonic clock."""

    arrived: float = field(default_factory=time.monotonic)
    first: float = 0.0
    last: float = 0.0

    def token(self) -> None:
        now = time.monotonic()
        self.first = self.first or now
        self.last = now

    def fields(self, tokens: int) -> dict[str, float]:
        """vLLM's build_per_request_timing_metrics, its rules for each field kept."""
        out = {"time_to_first_token_ms": (self.first - self.arrived) * 1000,
               "generation_time_ms": (self.last - self.first) * 1000, "queue_time_ms": 0.0}
        if tokens > 1:
            out["mean_itl_ms"] = (self.last - self.first) / (tokens - 1) * 1000
        if self.last > self.arrived:
            out["tokens_per_second"] = tokens / (self.last - self.arrived)
        return out


MAX_N = 16  # bounds the sequences one request can ask of the simulator


def spec_decode_object(steps: list[tuple[int, int]], k: int, detailed: bool) -> dict[str, Any]:
    """vLLM's per-request `metrics.speculative_decoding` (RequestSpecDecodeMetrics.to_dict, in
    its key order); histogram[j]: steps accepting j; per-step lists only when detailed."""
    histogram = [0] * (k + 1)
    for _, accepted in steps:
        histogram[accepted] += 1
    drafted = sum(p for p, _ in steps)
    accepted_total = sum(a for _, a in steps)
    obj: dict[str, Any] = {
        "mean_acceptance_length": 1 + accepted_total / len(steps) if steps else 1.0,
        "draft_acceptance_rate": accepted_total / drafted if drafted else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": len(steps), "num_accepted_draft_tokens": accepted_total,
        "num_draft_tokens": drafted, "num_spec_tokens": k,
    }
    if detailed and steps:
        obj["per_step_accepted"] = [a for _, a in steps]
        obj["per_step_drafted"] = [p for p, _ in steps]
    return obj


def sglang_details(steps: list[tuple[int, int]], completion: int) -> dict[str, Any]:
    """SGLang's per-request `spec_tokens_details` (its SpecTokensDetails, all nine fields);
    the histogram grows to the most drafts a step accepted, as SGLang's does."""
    accepted = [a for _, a in steps]
    histogram = [0] * (max(accepted) + 1)
    for a in accepted:
        histogram[a] += 1
    proposed = sum(p for p, _ in steps)
    return {"spec_accept_rate": sum(accepted) / proposed if proposed else 0.0,
            "spec_accept_length": completion / len(steps), "spec_cap_length": 0.0,
            "spec_block_accept_length": 0.0, "spec_num_correct_drafts": sum(accepted),
            "spec_num_proposed_drafts": proposed, "spec_verify_ct": len(steps),
            "spec_correct_drafts_histogram": histogram, "spec_cap_lens_histogram": []}


def llamacpp_timings(steps: list[tuple[int, int]], prompt: int, completion: int
                     ) -> dict[str, Any]:
    """llama.cpp's `timings`, with `draft_n` and `draft_n_accepted` only when it drafted."""
    drafted = sum(p for p, _ in steps)
    timings: dict[str, Any] = {"prompt_n": prompt, "predicted_n": completion}
    if drafted:
        timings |= {"draft_n": drafted, "draft_n_accepted": sum(a for _, a in steps)}
    return timings


@dataclass(frozen=True)
class _Asked:
    """One request as read: what to decode and how the answer is dressed."""

    chat: bool
    body: dict[str, Any]
    head: dict[str, Any]
    prompt: int
    plans: list[list[tuple[int, int]]]  # per sequence, its decode steps
    spec: dict[str, Any] | None  # the request's figures, when vLLM would give them
    times: _Times | None  # when vLLM would time it (--enable-per-request-metrics, n = 1)


def _figures(server: ServerModel, asked: _Asked, completion: int,
             stream: bool) -> dict[str, Any]:
    """The answer's spec-decode member in the shape of the server's dialect, {} when it sends
    none: SGLang's `sglext` when the request asks (`return_spec_tokens_details`) and a step
    was verified, llama.cpp's `timings`, else vLLM's `metrics` (null without figures when not
    streamed; on a stream only with figures)."""
    steps = asked.plans[0]
    if server.dialect == "sglang":
        if not server.spec_decode or not asked.body.get("return_spec_tokens_details") or (
                not steps):
            return {}
        return {"sglext": {"spec_tokens_details": sglang_details(steps, completion)}}
    if server.dialect == "llamacpp":
        return {"timings": llamacpp_timings(steps, asked.prompt, completion)} if (
            server.spec_decode) else {}
    timing = asked.times.fields(completion) if asked.times else None
    if stream:  # dumped without its nulls
        spec = {"speculative_decoding": asked.spec} if asked.spec else {}
        return {"metrics": (timing or {}) | spec} if spec or timing else {}
    if asked.spec is None and timing is None:
        return {"metrics": None}
    # The timing fields null unless timed, the object's unset per-step lists null: as vLLM's
    # model dumps them.
    nulls = {"per_step_accepted": None, "per_step_drafted": None}
    dumped = nulls | asked.spec if asked.spec else None
    return {"metrics": dict.fromkeys(_TIMING) | (timing or {}) | {"speculative_decoding": dumped}}


def _tail(dialect: str, finish: dict[str, Any], usage: dict[str, Any] | None,
          figures: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's last chunks, the figures where that server puts them: SGLang's in a chunk
    of their own after the finish chunk, llama.cpp's on the very last, vLLM's on the usage
    chunk, which only stream_options.include_usage asks for (no figures without it)."""
    chunks = [finish, *([usage] if usage else [])]
    if dialect == "sglang" and figures:
        chunks.insert(1, finish | {"choices": []} | figures)
    elif dialect == "llamacpp" or usage:
        chunks[-1] = chunks[-1] | figures
    return chunks


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _choice(chat: bool, text: str | None, finish: str | None, stream: bool,
            index: int) -> dict[str, Any]:
    if chat:
        key = "delta" if stream else "message"
        content = {} if text is None else {"role": "assistant", "content": text}
        return {"index": index, key: content, "logprobs": None, "finish_reason": finish}
    return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}


async def completions(request: web.Request, server: ServerModel, chat: bool) -> web.StreamResponse:
    """Answer one (chat) completion request, streamed as server-sent events when asked."""
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        tokens = max_tokens(body)
        prompt = prompt_tokens(body, chat)
        n = _bounded("n", body.get("n", 1), MAX_N)  # how many sequences to decode
    except (ValueError, UnicodeDecodeError) as exc:
        message = str(exc) if isinstance(exc, BadRequest) else f"body is not valid JSON: {exc}"
        return web.json_response(  # the OpenAI error shape
            {"error": {"message": message, "type": "invalid_request_error", "code": 400}},
            status=400)
    engine = server.pick_engine()
    server.in_flight[engine] += 1
    try:
        return await _answer(request, server, chat, body, engine, (tokens, prompt, n))
    finally:
        server.in_flight[engine] -= 1


async def _answer(request: web.Request, server: ServerModel, chat: bool, body: dict[str, Any],
                  engine: int, asked_for: tuple[int, int, int]) -> web.StreamResponse:
    """`completions`' answer of a valid request, decoded on `engine`."""
    tokens, prompt, n = asked_for
    plans = [server.plan_steps(tokens) for _ in range(n)]
    head = {
        "id": ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12),
        "object": ("chat.completion" if chat else "text_completion")
        + (".chunk" if chat and body.get("stream") else ""),
        "created": int(time.time()),
        "model": str(body.get("model") or server.model_name),
    }
    spec = None
    if server.spec_decode and n == 1 and server.per_request_metrics in ("summary", "detailed"):
        # vLLM cannot give one sequence's figures to a request of several.
        spec = spec_decode_object(plans[0], server.k, server.per_request_metrics == "detailed")
    asked = _Asked(chat, body, head, prompt, plans, spec,
                   _Times() if server.request_timing and n == 1 else None)
    if body.get("stream"):
        return await _stream(request, server, engine, asked)
    for steps in plans:
        for step in steps:
            await _step(server, engine, asked.times, step)
    return web.json_response(head | {
        "choices": [_choice(chat, "".join(step_texts(steps)), "length", False, i)
                    for i, steps in enumerate(plans)],
        "usage": _usage(prompt, tokens * n)} | _figures(server, asked, tokens, stream=False))


async def _stream(request: web.Request, server: ServerModel, engine: int,
                  asked: _Asked) -> web.StreamResponse:
    """The answer as server-sent events: token chunks, finishing chunks, the last ones."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)

    async def send(payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        await response.write(f"data: {data}\n\n".encode())

    head, chat = asked.head, asked.chat
    # Counters move step by step while the answer streams, as a scrape mid-request would see.
    for index, steps in enumerate(asked.plans):
        for step, text in zip(steps, step_texts(steps), strict=True):
            await _step(server, engine, asked.times, step)
            await send(head | {"choices": [_choice(chat, text, None, True, index)]})
        finish = head | {"choices": [_choice(chat, None, "length", True, index)]}
        if index < len(asked.plans) - 1:
            await send(finish)
    tokens = sum(1 + a for _, a in asked.plans[0])
    options = asked.body.get("stream_options")
    usage = head | {"choices": [], "usage": _usage(asked.prompt, tokens * len(asked.plans))} if (
        isinstance(options, dict) and options.get("include_usage")) else None
    for last in _tail(server.dialect, finish, usage,
                      _figures(server, asked, tokens, stream=True)):
        await send(last)
    await send("[DONE]")
    await response.write_eof()
    return response


async def _step(server: ServerModel, engine: int, times: _Times | None,
                step: tuple[int, int]) -> None:
    """One decode step: its time (if steps take any), its tokens, its count on `engine`."""
    proposed, accepted = step
    if server.step_seconds:
        await asyncio.sleep(server.step_seconds * (1 + DRAFT_COST * proposed))
    if times is not None:
        times.token()
    server.count_step(engine, proposed, accepted)


def models(server: ServerModel) -> dict[str, Any]:
    """`GET /v1/models`: the one model served."""
    return {"object": "list", "data": [{"id": server.model_name, "object": "model",
                                        "created": int(server.created), "owned_by": "fake-vllm"}]}
