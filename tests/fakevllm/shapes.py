"""What fake-vllm and a real vLLM must agree on: shapes of pages and answers, not values.

Shared by the fast side-by-side test against captured fixtures (tests/fakevllm/test_realshapes.py)
and the real-vLLM tier's test against live servers (tests/realvllm/test_pages.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

PROMPT = "hello world the a of and to in"
# name -> (path, body beyond model, prompt and length): each kind of answer the proxy reads.
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/v1/completions", {"stream": False}),
    # vLLM refuses n > 1 with greedy sampling (400): n sequences are sampled.
    "completion-n2": ("/v1/completions", {"stream": False, "n": 2, "temperature": 1.0}),
    "chat-stream-usage": ("/v1/chat/completions",
                          {"stream": True, "stream_options": {"include_usage": True}}),
    "chat-stream": ("/v1/chat/completions", {"stream": True}),
    "completion-stream-n2-usage": ("/v1/completions", {
        "stream": True, "n": 2, "temperature": 1.0, "stream_options": {"include_usage": True}}),
}
_SAMPLE = re.compile(r"^(vllm:spec_decode_\w+)\{([^}]*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def request_body(model: str, path: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The body of one of REQUESTS: greedy, 48 tokens (for n-gram drafts to find a loop)."""
    body: dict[str, Any] = {"model": model, "max_tokens": 48, "temperature": 0,
                            "ignore_eos": True} | extra
    if "chat" in path:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    return body


def page_shape(page: bytes) -> set[tuple[str, str, tuple[str, ...]]]:
    """Each spec-decode sample name with its TYPE line's type and its label names."""
    types: dict[str, str] = {}
    shape = set()
    for line in page.decode().splitlines():
        if line.startswith("# TYPE vllm:spec_decode_"):
            _, _, name, kind = line.split()
            types[name] = kind
        elif match := _SAMPLE.match(line):
            labels = tuple(sorted(k for k, _ in _LABEL.findall(match.group(2))))
            shape.add((match.group(1), types.get(match.group(1), "?"), labels))
    return shape


def page_values(page: bytes) -> dict[tuple[str, str], float]:
    """Each spec-decode `_total` sample's value by (name, position), summed over engines."""
    values: dict[tuple[str, str], float] = {}
    for line in page.decode().splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1).endswith("_total"):
            position = dict(_LABEL.findall(match.group(2))).get("position", "")
            key = (match.group(1), position)
            values[key] = values.get(key, 0.0) + float(match.group(3))
    return values


def json_shape(value: Any) -> Any:
    """A JSON value's shape: objects by key, lists by their first item, scalars by kind."""
    if isinstance(value, dict):
        return {k: json_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return ["list", json_shape(value[0])] if value else ["list"]
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else "str"


def events(raw: bytes) -> list[dict[str, Any]]:
    """A stream's JSON events, in order."""
    return [json.loads(line[5:]) for line in raw.decode().splitlines()
            if line.startswith("data: {")]


def answer_traits(raw: bytes, stream: bool) -> dict[str, Any]:
    """What the proxy relies on in one answer: where `usage` and `metrics` ride, and the
    shape of `metrics` there."""
    if not stream:
        body = json.loads(raw)
        return {"choices": sorted(c["index"] for c in body["choices"]),
                "usage": "usage" in body,
                "metrics": json_shape(body.get("metrics", "absent"))}
    chunks = events(raw)
    with_usage = [i for i, c in enumerate(chunks) if "usage" in c]
    with_metrics = [i for i, c in enumerate(chunks) if "metrics" in c]
    last = chunks[-1] if chunks else {}
    return {"choices": sorted({c["index"] for ch in chunks for c in ch["choices"]}),
            "usage_on_last_only": with_usage == ([len(chunks) - 1] if "usage" in last else []),
            "usage": "usage" in last,
            "metrics_on": "usage chunk" if with_metrics and with_metrics == with_usage
            else ("nowhere" if not with_metrics else "elsewhere"),
            "metrics": json_shape(last.get("metrics", "absent"))}
