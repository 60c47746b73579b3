"""The real-vLLM tier's fixtures: two real servers shared by the session, and what reads them.

Every test here is marked `vllm` and `e2e` (the fast loop leaves them out). Without the vLLM
virtualenv (scripts/vllm-env.sh) the tier skips saying why in one line; under CI=true that skip
fails (tests/conftest.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from clitools import CLI, free_port, process, wait_http, write_config

from realvllm import servers

_HERE = Path(__file__).resolve().parent
_SAMPLE = re.compile(rb'^vllm:spec_decode_(\w+)_total\{([^}]*)\} (\S+)$', re.M)
_POSITION = re.compile(rb'position="(\d+)"')


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of this folder is marked `vllm` and `e2e`."""
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.e2e)


@dataclass(frozen=True)
class Counters:
    """The four spec-decode counters of one page, summed over engines."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]

    def minus(self, before: Counters) -> Counters:
        """The increase from `before` (no restart between them)."""
        return Counters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                        self.accepted - before.accepted,
                        tuple(a - b for a, b in zip(self.per_position, before.per_position,
                                                    strict=True)))


def get(url: str, timeout: float = 10.0) -> bytes:
    """The body of a GET."""
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        body: bytes = answer.read()
        return body


def read_counters(page: bytes) -> Counters:
    """The counters a vLLM page shows, read here by a regex, not by the exporter's parser."""
    sums = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    positions: dict[int, float] = {}
    for name, labels, value in _SAMPLE.findall(page):
        field = name.decode()
        if field == "num_accepted_tokens_per_pos":
            pos = int(_POSITION.search(labels).group(1))
            positions[pos] = positions.get(pos, 0.0) + float(value)
        else:
            sums[field] += float(value)
    return Counters(int(sums["num_drafts"]), int(sums["num_draft_tokens"]),
                    int(sums["num_accepted_tokens"]),
                    tuple(int(positions[p]) for p in sorted(positions)))


def post(url: str, body: dict, timeout: float = 120.0) -> bytes:
    """The raw answer of a JSON POST (an OpenAI request)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        raw: bytes = answer.read()
        return raw


def ask(base: str, *, chat: bool, stream: bool, usage: bool = True, max_tokens: int = 48,
        prompt: str = "hello world the a of and to in", **extra: object) -> bytes:
    """One OpenAI request to a real server (or a proxy before it): greedy, a fixed length."""
    body: dict[str, object] = {"model": servers.MODEL_NAME, "max_tokens": max_tokens,
                               "temperature": 0, "ignore_eos": True, "stream": stream} | extra
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return post(base + path, body)


@dataclass
class Exporter:
    """A served exporter (the real CLI in a subprocess) and its ports."""

    url: str
    proxy: str | None
    out: Path

    def start(self, window_id: str, **body: object) -> dict:
        """Open a window; its answer."""
        return json.loads(post(f"{self.url}/api/v1/windows", {"id": window_id} | body))

    def stop(self, window_id: str) -> dict:
        """Close a window; its answer."""
        return json.loads(post(f"{self.url}/api/v1/windows/{window_id}/stop", {}))


@contextmanager
def exporter_over(server: servers.RealVllm, tmp_path: Path, *, proxy: bool = False,
                  interval: str = "1s", timeout: str = "1s") -> Iterator[Exporter]:
    """`specdec-exporter serve` over one real server (named `real`), with its proxy if asked."""
    port = free_port()
    target: dict[str, object] = {"name": "real", "url": server.metrics_url}
    proxy_port = free_port() if proxy else None
    if proxy_port is not None:
        target["proxy"] = {"listen": f"127.0.0.1:{proxy_port}"}
    config = write_config(tmp_path / "exporter.yaml", port, [target], scrape_interval=interval,
                          scrape_timeout=timeout, window_scrape_interval=interval)
    with process(CLI + ["serve", "--config", str(config)]) as proc:
        try:
            wait_http(f"http://127.0.0.1:{port}/-/ready", deadline=30)
        except AssertionError:
            if proc.poll() is not None:
                raise AssertionError(f"the exporter exited: {proc.stderr.read()}") from None
            raise
        yield Exporter(f"http://127.0.0.1:{port}",
                       f"http://127.0.0.1:{proxy_port}" if proxy_port else None,
                       tmp_path / "out")


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The exporter's CLI, run to its end."""
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout)


def vllm_cli() -> list[str]:
    """vLLM's own CLI (`vllm ...`) from its virtualenv."""
    return [str(servers.python()), str(servers.LAUNCH)]


@dataclass
class Fleet:
    """The session's real servers: n-gram k=3 (the issue's flags) and draft_model k=5."""

    ngram: servers.RealVllm
    draft: servers.RealVllm
    first_pages: dict[str, bytes]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Llama model, made once (cached in .vllm-cache/); skip where vLLM cannot run."""
    reason = servers.unavailable()
    if reason is not None:
        pytest.skip(f"real-vLLM tier: {reason}")
    return servers.make_model()


# Package scope: the servers (6 GiB between them) stop after the tier's last test, not at the
# end of a whole-suite run.
@pytest.fixture(scope="package")
def fleet(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Both servers, started side by side once for the whole tier; their pages before traffic."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    ngram = servers.RealVllm(tiny_model, free_port(), servers.ngram(3), log=logs / "ngram.log")
    draft = servers.RealVllm(tiny_model, free_port(), servers.draft_model(tiny_model, 5),
                             log=logs / "draft.log")
    with servers.serving(ngram, draft):
        first = {"ngram": get(ngram.metrics_url), "draft": get(draft.metrics_url)}
        sys.stderr.write(f"\nreal vLLM servers ready: rss ngram {ngram.rss_bytes() >> 20} MiB, "
                         f"draft {draft.rss_bytes() >> 20} MiB\n")
        yield Fleet(ngram, draft, first)
