"""Real vLLM servers on loopback: the tiny model, start, wait until ready, kill, restart, stop.

Used by the real-vLLM test tier (tests/realvllm/) and importable by bench/ as
`tests.realvllm.servers`. Needs the virtualenv that scripts/vllm-env.sh makes (`.vllm-venv/`,
or `$VLLM_VENV`); `unavailable()` says in one line why the tier cannot run where it cannot.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VENV = Path(os.environ.get("VLLM_VENV", REPO / ".vllm-venv"))
CACHE = Path(os.environ.get("VLLM_TEST_CACHE", REPO / ".vllm-cache"))
LAUNCH = HERE / "launch.py"
MAKE_MODEL = HERE / "makemodel.py"
MODEL_NAME = "tiny-llama"
READY_SECONDS = 240.0  # a cold start on a busy 2-core machine; 20-30 s when warm and alone

# What the tier's servers share: the CPU backend, a 1 GiB KV cache, no hub.
ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def python() -> Path:
    """The vLLM virtualenv's interpreter."""
    return VENV / "bin" / "python"


def unavailable() -> str | None:
    """Why real vLLM servers cannot run here (one line), or None when they can."""
    reason_file = Path(f"{VENV}.unavailable")
    if reason_file.exists():
        return reason_file.read_text().strip()
    if not python().exists():
        return f"no vLLM virtualenv at {VENV}: run `bash scripts/vllm-env.sh`"
    # Found, not imported (seconds): a broken install fails the first server's start loudly.
    done = subprocess.run([str(python()), "-c", "import importlib.util as u; "
                           "assert u.find_spec('vllm') and u.find_spec('transformers')"],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"no vllm or transformers in {VENV}: run `bash scripts/vllm-env.sh`"
    return None


def make_model(cache: Path = CACHE) -> Path:
    """The tiny Llama model's folder, made once per version of makemodel.py (atomically)."""
    digest = hashlib.sha256(MAKE_MODEL.read_bytes()).hexdigest()[:12]
    folder = cache / f"tiny-llama-{digest}"
    if (folder / "config.json").exists():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="building-", dir=cache))
    try:
        done = subprocess.run([str(python()), str(MAKE_MODEL), str(building)], text=True,
                              capture_output=True, timeout=600, env=os.environ | ENV)
        if done.returncode != 0:
            raise RuntimeError(f"making the tiny model failed: {done.stderr[-2000:]}")
        building.rename(folder)
    except OSError:
        if not (folder / "config.json").exists():  # not another session's rename: a real error
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return folder


def ngram(k: int = 3) -> dict[str, object]:
    """An n-gram speculative config proposing up to k tokens."""
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
            "prompt_lookup_min": 2}


def draft_model(model: Path, k: int) -> dict[str, object]:
    """The model drafting for itself: every draft accepted at temperature 0."""
    return {"method": "draft_model", "model": str(model), "num_speculative_tokens": k}


@dataclass
class RealVllm:
    """One `vllm serve` of the tiny model on a loopback port, in its own process group."""

    model: Path
    port: int
    speculative: dict[str, object] | None
    extra: tuple[str, ...] = ()
    log: Path = field(default_factory=lambda: Path(tempfile.mkstemp(suffix=".vllm.log")[1]))
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def base_url(self) -> str:
        """Where the OpenAI API answers."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """The server's /metrics."""
        return f"{self.base_url}/metrics"

    def argv(self) -> list[str]:
        """The `vllm serve` command line."""
        args = [str(python()), str(LAUNCH), "serve", str(self.model), "--host", "127.0.0.1",
                "--port", str(self.port), "--served-model-name", MODEL_NAME,
                "--max-model-len", "512", "--dtype", "bfloat16", "--enforce-eager"]
        if self.speculative is not None:
            args += ["--speculative-config", json.dumps(self.speculative),
                     "--per-request-spec-decode-metrics", "summary"]
        return args + list(self.extra)

    def start(self) -> RealVllm:
        """Start the server (not waiting for it)."""
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts + 1}: {' '.join(self.argv())}\n".encode())
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=os.environ | ENV,
                                         start_new_session=True)
        self.starts += 1
        return self

    def wait_ready(self, deadline: float = READY_SECONDS) -> RealVllm:
        """Return once /health answers 200; fail with the log's tail if it dies or times out."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve on :{self.port} exited: {self.tail()}")
            with contextlib.suppress(urllib.error.URLError, OSError):
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return self
            time.sleep(0.5)
        raise RuntimeError(f"vllm serve on :{self.port} not ready in {deadline:.0f} s: "
                           f"{self.tail()}")

    def tail(self, lines: int = 15) -> str:
        """The last lines of the server's log."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def kill9(self) -> None:
        """SIGKILL the whole server (API process, engine core, workers), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM the server's process group; SIGKILL what is left after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill9()
        with contextlib.suppress(ProcessLookupError):  # engine processes left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)

    def rss_bytes(self) -> int:
        """Resident memory of the server's process group now (API, engine core, workers)."""
        if self.proc is None:
            return 0
        total = 0
        for status in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = status.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.proc.pid:  # field 5 of stat: the process group
                    pid = status.parent.name
                    rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
                    total += rss_pages * os.sysconf("SC_PAGE_SIZE")
        return total


@contextlib.contextmanager
def serving(*servers: RealVllm) -> Iterator[tuple[RealVllm, ...]]:
    """Start every server at once, wait until all are ready, stop them all at the end."""
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()
