"""An OpenAI-compatible face for the simulator: completions and chat completions, streamed too.

Enough for real benchmark clients (AISBench, `vllm bench serve`, `openai`); each request decodes
`max_tokens` tokens through the counter model, so the counters match the served tokens. Its
per-request spec-decode figures take the shape of the server's dialect (vLLM's, SGLang's or
llama.cpp's; docs/api.md, "The recording proxy").
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from exporter.fakevllm.model import ServerModel

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_CAP = 32768  # bounds the work one request can ask of the simulator
_WORDS = ("speculative", " decoding", " drafts", " tokens", " and", " the", " target", " model",
          " accepts", " a", " prefix", " of", " them", ",", " then", " emits", " one", " more",
          ".")


class BadRequest(ValueError):
    """A request body the OpenAI API would refuse with 400."""


def max_tokens(body: dict[str, Any]) -> int:
    """The request's output length: `max_tokens` (or chat's `max_completion_tokens`)."""
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return DEFAULT_MAX_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS_CAP:
        raise BadRequest(f"max_tokens must be an integer within 1..{MAX_TOKENS_CAP}, "
                         f"got {value!r}")
    return value


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


def spec_decode_object(steps: list[tuple[int, int]], k: int, detailed: bool) -> dict[str, Any]:
    """vLLM's per-request `metrics.speculative_decoding`; histogram[j]: steps accepting j."""
    histogram = [0] * (k + 1)
    for _, accepted in steps:
        histogram[accepted] += 1
    drafted = sum(p for p, _ in steps)
    accepted_total = sum(a for _, a in steps)
    obj: dict[str, Any] = {
        "num_spec_steps": len(steps), "num_draft_tokens": drafted,
        "num_accepted_draft_tokens": accepted_total, "num_spec_tokens": k,
        "mean_acceptance_length": 1 + accepted_total / len(steps) if steps else 1.0,
        "draft_acceptance_rate": accepted_total / drafted if drafted else 0.0,
        "acceptance_histogram": histogram,
    }
    if detailed:
        obj["steps"] = [{"num_draft_tokens": p, "num_accepted_tokens": a} for p, a in steps]
    return obj


def _metrics(server: ServerModel, steps: list[tuple[int, int]]) -> dict[str, Any]:
    """The answer's `metrics` member, present only when the server was started to emit it."""
    if not server.spec_decode or server.per_request_metrics not in ("summary", "detailed"):
        return {}
    detailed = server.per_request_metrics == "detailed"
    return {"metrics": {"speculative_decoding": spec_decode_object(steps, server.k, detailed)}}


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


def _figures(server: ServerModel, body: dict[str, Any], steps: list[tuple[int, int]],
             prompt: int, completion: int) -> dict[str, Any]:
    """The answer's spec-decode member in the shape of the server's dialect, {} when it sends
    none: SGLang's `sglext` when the request asks (`return_spec_tokens_details`) and a step
    was verified, llama.cpp's `timings` always, else vLLM's `metrics` (with the server flag)."""
    if not server.spec_decode:
        return {}
    if server.dialect == "sglang":
        if not body.get("return_spec_tokens_details") or not steps:
            return {}
        return {"sglext": {"spec_tokens_details": sglang_details(steps, completion)}}
    if server.dialect == "llamacpp":
        return {"timings": llamacpp_timings(steps, prompt, completion)}
    return _metrics(server, steps)


def _tail(dialect: str, finish: dict[str, Any], usage: dict[str, Any] | None,
          figures: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's last chunks, the figures where that server puts them: vLLM's on the finish
    chunk, SGLang's in a chunk of their own after it, llama.cpp's on the very last."""
    chunks = [finish, *([usage] if usage else [])]
    if dialect == "sglang" and figures:
        chunks.insert(1, finish | {"choices": []} | figures)
    elif dialect == "llamacpp":
        chunks[-1] = chunks[-1] | figures
    else:
        chunks[0] = finish | figures
    return chunks


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _choice(chat: bool, text: str | None, finish: str | None, stream: bool) -> dict[str, Any]:
    if chat:
        key = "delta" if stream else "message"
        content = {} if text is None else {"role": "assistant", "content": text}
        return {"index": 0, key: content, "logprobs": None, "finish_reason": finish}
    return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}


async def completions(request: web.Request, server: ServerModel, chat: bool) -> web.StreamResponse:
    """Answer one (chat) completion request, streamed as server-sent events when asked."""
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        tokens = max_tokens(body)
        prompt = prompt_tokens(body, chat)
    except (ValueError, UnicodeDecodeError) as exc:
        message = str(exc) if isinstance(exc, BadRequest) else f"body is not valid JSON: {exc}"
        return web.json_response(  # the OpenAI error shape
            {"error": {"message": message, "type": "invalid_request_error", "code": 400}},
            status=400)
    engine = server.pick_engine()
    steps = server.plan_steps(tokens)
    head = {
        "id": ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12),
        "object": ("chat.completion" if chat else "text_completion")
        + (".chunk" if chat and body.get("stream") else ""),
        "created": int(time.time()),
        "model": str(body.get("model") or server.model_name),
    }
    if not body.get("stream"):
        for proposed, accepted in steps:
            server.count_step(engine, proposed, accepted)
        return web.json_response(head | {
            "choices": [_choice(chat, "".join(step_texts(steps)), "length", stream=False)],
            "usage": _usage(prompt, tokens),
        } | _figures(server, body, steps, prompt, tokens))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)

    async def send(payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        await response.write(f"data: {data}\n\n".encode())

    # Counters move step by step while the answer streams, as a scrape mid-request would see.
    for (proposed, accepted), text in zip(steps, step_texts(steps), strict=True):
        server.count_step(engine, proposed, accepted)
        await send(head | {"choices": [_choice(chat, text, None, stream=True)]})
    finish = head | {"choices": [_choice(chat, None if chat else "", "length", stream=True)]}
    options = body.get("stream_options")
    usage = head | {"choices": [], "usage": _usage(prompt, tokens)} if isinstance(
        options, dict) and options.get("include_usage") else None
    for last in _tail(server.dialect, finish, usage, _figures(server, body, steps, prompt,
                                                              tokens)):
        await send(last)
    await send("[DONE]")
    await response.write_eof()
    return response


def models(server: ServerModel) -> dict[str, Any]:
    """`GET /v1/models`: the one model served."""
    return {"object": "list", "data": [{"id": server.model_name, "object": "model",
                                        "created": int(server.created), "owned_by": "fake-vllm"}]}
