"""What the recording proxy counted survives our own restart (SIGTERM and SIGKILL of the real
`serve` subprocess): a stopped window's GET answers the `per_request` and `edges` of its stop
answer, and an open window keeps the requests it had recorded by its last saved round."""

from __future__ import annotations

import signal

import pytest
from clitools import CLI, fake_vllm, free_port, http, process, wait_http, write_config

pytestmark = pytest.mark.e2e


class Serve:
    """`serve` over one fake-vllm target with a proxy port, restartable on the same state."""

    def __init__(self, tmp_path, vllm_port: int):
        self.port, self.proxy = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = write_config(tmp_path / "c.yaml", self.port, [{
            "name": "v", "url": f"http://127.0.0.1:{vllm_port}/metrics",
            "proxy": {"listen": f"127.0.0.1:{self.proxy}"}}])
        self.command = CLI + ["serve", "--config", str(config)]

    def __enter__(self) -> Serve:
        self._ctx = process(self.command)
        self.proc = self._ctx.__enter__()
        wait_http(f"{self.base}/-/ready")
        return self

    def end(self, how: signal.Signals) -> None:
        self.proc.send_signal(how)
        self.proc.wait(timeout=30)
        self._ctx.__exit__(None, None, None)

    def __exit__(self, *_: object) -> None:
        self._ctx.__exit__(None, None, None)

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        status, answer = http(method, f"{self.base}/api/v1{path}", body)
        assert status in (200, 201), answer
        return dict(answer)

    def ask(self, max_tokens: int) -> None:
        status, answer = http("POST", f"http://127.0.0.1:{self.proxy}/v1/completions",
                              {"model": "m", "prompt": "p", "max_tokens": max_tokens})
        assert status == 200 and answer["metrics"]["speculative_decoding"], answer

    def saved(self, window_id: str) -> None:
        """Until the window took two more scrapes (rounds: no window rounds are configured): a
        whole round, and its save, after now."""
        before = self.api("GET", f"/windows/{window_id}")["scrapes"]["v"]
        for _ in range(300):
            if self.api("GET", f"/windows/{window_id}")["scrapes"]["v"] >= before + 2:
                return
            wait_http(f"{self.base}/-/healthy")
        raise AssertionError("no scrape round came")


@pytest.fixture
def vllm():
    with fake_vllm("--per-request-spec-decode-metrics", "summary", "--k", "3") as port:
        yield port


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_windows_per_request_and_edges_are_its_stop_answers_after_a_restart(
        tmp_path, vllm, how):
    serve = Serve(tmp_path, vllm)
    with serve:
        serve.api("POST", "/windows", {"id": "t", "edges": "traffic", "skip_requests": 1})
        for max_tokens in (30, 12, 25, 40):  # the warm-up, then three measured
            serve.ask(max_tokens)
        answer = serve.api("POST", "/windows/t/stop")
        assert answer["per_request"]["targets"]["v"]["requests"] == 3
        assert answer["per_request"]["aggregate"]["covers_all"] is True
        assert answer["edges"]["measured_requests"] == 3
        serve.end(how)
    with serve:
        again = serve.api("GET", "/windows/t")
        assert again["per_request"] == answer["per_request"]
        assert again["edges"] == answer["edges"]
        assert again["results_dir"] == answer["results_dir"]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_an_open_windows_records_survive_a_restart(tmp_path, vllm, how):
    serve = Serve(tmp_path, vllm)
    with serve:
        serve.api("POST", "/windows", {"id": "o"})
        for max_tokens in (30, 12, 25):
            serve.ask(max_tokens)
        assert serve.api("GET", "/windows/o")["per_request"]["aggregate"]["requests"] == 3
        serve.saved("o")
        serve.end(how)
    with serve:
        kept = serve.api("GET", "/windows/o")["per_request"]
        assert kept["aggregate"]["requests"] == 3
        for max_tokens in (8, 17):
            serve.ask(max_tokens)
        answer = serve.api("POST", "/windows/o/stop")
    block = answer["per_request"]["targets"]["v"]
    data = answer["results"]["v"]["data"]
    assert block["requests"] == 5 and block["covers_all"] is True
    assert block["num_spec_steps"] == data["num_drafts"]
