"""SIGKILL of the real exporter: nothing it has seen may be lost.

The exporter runs as `python -m exporter serve` in a subprocess over a `fake-vllm` subprocess
whose counters the test drives through its control endpoints. "Seen" is checked through the
API (a window's scrape count grows by two after a change, so one whole scrape began after it),
never by sleeping for a scrape.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import threading
import time

import pytest
from clitools import CLI, fake_add, fake_vllm, free_port, http, process, wait_http, write_config

from faults.servers import hanging_listener

pytestmark = pytest.mark.e2e

K = 5


class Exporter:
    """The `serve` subprocess over target `e`, restartable on the same state."""

    def __init__(self, tmp_path, vllm_port: int, *extra_targets: dict):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        targets = [{"name": "e", "url": f"http://127.0.0.1:{vllm_port}/metrics"}, *extra_targets]
        timing = {"scrape_interval": "3s", "scrape_timeout": "2s"} if extra_targets else {}
        config = write_config(tmp_path / "c.yaml", self.port, targets, **timing)
        self.command = CLI + ["serve", "--config", str(config)]
        self.proc = None
        self._ctx = None

    def start(self) -> None:
        self._ctx = process(self.command)
        self.proc = self._ctx.__enter__()
        wait_http(f"{self.base}/-/ready")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._ctx.__exit__(None, None, None)

    def stop(self) -> None:
        if self._ctx is not None and self.proc.poll() is None:
            self._ctx.__exit__(None, None, None)

    def api(self, method: str, path: str, body: dict | None = None):
        try:
            return http(method, f"{self.base}/api/v1{path}", body)
        except OSError as exc:  # killed under the request: no answer
            return 0, repr(exc)

    def scrapes(self, window_id: str, target: str = "e") -> int:
        status, state = self.api("GET", f"/windows/{window_id}")
        assert status == 200, state
        return state["scrapes"].get(target, 0)

    def wait_seen(self, window_id: str) -> None:
        """Until a scrape that began after now has been counted by the window."""
        goal = self.scrapes(window_id) + 2
        end = time.monotonic() + 30
        while self.scrapes(window_id) < goal:
            assert time.monotonic() < end, "the exporter stopped scraping"
            time.sleep(0.05)


def restart_server(port: int) -> None:
    status, body = http("POST", f"http://127.0.0.1:{port}/control/restart")
    assert status == 200, body


def add(port: int, truth: dict, drafts: int, per_pos: list[int]) -> None:
    fake_add(port, drafts, drafts * K, per_pos)
    truth["drafts"] += drafts
    truth["tokens"] += drafts * K
    truth["per_pos"] = [a + b for a, b in zip(truth["per_pos"], per_pos, strict=True)]


def assert_exact(result: dict, truth: dict) -> None:
    assert result["status"] == "ok", result
    inc = result["increase"]
    assert inc["num_drafts"] == truth["drafts"], result
    assert inc["num_draft_tokens"] == truth["tokens"], result
    assert [inc["accepted_per_pos"][str(p)] for p in range(K)] == truth["per_pos"], result


def new_truth() -> dict:
    return {"drafts": 0, "tokens": 0, "per_pos": [0] * K}


def opened_with_ten(exporter: Exporter, vllm) -> dict:
    """Window "w" started, 10 drafts counted by `e` and seen; the truth so far."""
    truth = new_truth()
    assert exporter.api("POST", "/windows", {"id": "w"})[0] == 201
    add(vllm, truth, 10, [9, 8, 7, 6, 5])
    exporter.wait_seen("w")
    return truth


def stopped_result(exporter: Exporter) -> dict:
    """Window "w" stopped: target `e`'s RESULT."""
    status, answer = exporter.api("POST", "/windows/w/stop")
    assert status == 200, answer
    return answer["results"]["e"]


@pytest.fixture
def exporter_over_e(tmp_path):
    with fake_vllm("--k", str(K)) as vllm:
        exporter = Exporter(tmp_path, vllm)
        exporter.start()
        try:
            yield exporter, vllm
        finally:
            exporter.stop()


class TestRestartSeenThenKilled:
    @pytest.mark.parametrize("restarts", [1, 2])
    def test_exact_after_sigkill(self, exporter_over_e, restarts):
        exporter, vllm = exporter_over_e
        truth = opened_with_ten(exporter, vllm)
        for n in range(restarts):
            restart_server(vllm)
            add(vllm, truth, 5 - n, [5 - n, 4 - n, 3, 2, 1])
            exporter.wait_seen("w")  # the restart is seen live
        exporter.kill()  # long before any periodic save of old would have run
        add(vllm, truth, 5, [4, 4, 4, 4, 4])  # counted while the exporter is down
        exporter.start()
        result = stopped_result(exporter)
        assert truth["drafts"] == 20 + (restarts - 1) * 4
        assert_exact(result, truth)
        assert result["resets"] == restarts
        # What the server counted between our last scrape and each restart cannot be known:
        # never full. Each span is dated by the restarted counters' `_created`, kept across
        # the kill.
        assert result["coverage"] == "partial"
        spans = result["unobserved"]
        assert len(spans) == restarts
        assert all(s["from"] <= s["restart_at"] <= s["next_scrape_at"] for s in spans)
        assert "restart seen" in result["reset_note"]
        # Seen live, so it must not be blamed on our absence.
        assert "while the exporter was down" not in result["reset_note"]

    def test_restart_while_down_is_said(self, exporter_over_e):
        exporter, vllm = exporter_over_e
        truth = opened_with_ten(exporter, vllm)
        exporter.kill()
        restart_server(vllm)
        add(vllm, truth, 5, [4, 4, 4, 4, 4])
        exporter.start()
        result = stopped_result(exporter)
        assert_exact(result, truth)  # everything was seen before the kill: still exact
        assert "while the exporter was down" in result["reset_note"]


class TestKilledAfterRoundParts:
    def test_the_last_round_part_is_what_restores(self, exporter_over_e, tmp_path):
        # Rounds after the start write only each accumulator's round part (its latest values):
        # killed then, and the server restarted while we were down, the count must go on from
        # those values, not from the whole row written at the start.
        exporter, vllm = exporter_over_e
        truth = opened_with_ten(exporter, vllm)
        exporter.kill()
        # Read-only: a closing reader must not fold the log into the file before the restart.
        db = sqlite3.connect(f"file:{tmp_path / 'out' / 'state.sqlite'}?mode=ro", uri=True)
        try:
            (whole,) = db.execute("SELECT doc FROM accumulators WHERE target='e'").fetchone()
            (part,) = db.execute("SELECT doc FROM accumulator_rounds WHERE target='e'").fetchone()
        finally:
            db.close()
        whole, part = json.loads(whole), json.loads(part)
        assert part["scrapes"] > whole["scrapes"] == part["base"]
        restart_server(vllm)
        add(vllm, truth, 5, [4, 4, 4, 4, 4])
        exporter.start()
        assert_exact(stopped_result(exporter), truth)
        assert truth["drafts"] == 15


def test_kill_during_a_stop(tmp_path):
    hang = hanging_listener()
    slow = {"name": "slow", "url": f"http://127.0.0.1:{hang.getsockname()[1]}/metrics"}
    try:
        with fake_vllm("--k", str(K)) as vllm:
            exporter = Exporter(tmp_path, vllm, slow)
            exporter.start()
            try:
                truth = opened_with_ten(exporter, vllm)
                restart_server(vllm)
                add(vllm, truth, 5, [5, 4, 3, 2, 1])
                exporter.wait_seen("w")
                answers: list = []
                stopper = threading.Thread(
                    target=lambda: answers.append(exporter.api("POST", "/windows/w/stop")))
                stopper.start()
                time.sleep(0.5)  # the stop waits for the slow target's scrape (2 s timeout)
                exporter.kill()
                stopper.join(timeout=30)
                assert answers and answers[0][0] != 200, answers  # never answered
                # The stop's child, left without its server, writes no half answer: its inbox
                # ended without the stop's end (it exits once the pipe closes).
                time.sleep(0.5)
                assert list(tmp_path.rglob("window.json")) == []
                assert list(tmp_path.rglob("performances")) == []
                add(vllm, truth, 5, [4, 4, 4, 4, 4])
                exporter.start()
                status, answer = exporter.api("POST", "/windows/w/stop")
                assert status == 200, answer
                assert_exact(answer["results"]["e"], truth)
                assert truth["drafts"] == 20
                assert "while the exporter was down" not in answer["results"]["e"]["reset_note"]
            finally:
                exporter.stop()
    finally:
        hang.close()


def _random_kill_run(tmp_path, kills: int, seed: int) -> int:
    """Random counts, server restarts, starts, stops and SIGKILLs; every window checked exact.

    Returns how many windows were checked. Counts change only between API calls, so a start or
    stop killed in flight is retried with nothing added in between, and the truth is the same
    whether it was committed before the kill or not.
    """
    rng = random.Random(seed)
    checked = 0
    with fake_vllm("--k", str(K)) as vllm:
        exporter = Exporter(tmp_path, vllm)
        exporter.start()
        open_windows: dict[str, dict] = {}
        serial = 0
        try:
            for _ in range(kills):
                for _ in range(rng.randrange(1, 5)):
                    roll = rng.random()
                    if roll < 0.3 and len(open_windows) < 3:
                        serial += 1
                        window_id = f"r{serial}"
                        assert exporter.api("POST", "/windows", {"id": window_id})[0] == 201
                        open_windows[window_id] = new_truth()
                    elif roll < 0.45 and open_windows:
                        window_id = rng.choice(sorted(open_windows))
                        status, answer = exporter.api("POST", f"/windows/{window_id}/stop")
                        assert status == 200, answer
                        checked += _check(answer, open_windows.pop(window_id))
                    elif roll < 0.6 and open_windows:
                        exporter.wait_seen(next(iter(open_windows)))
                        restart_server(vllm)  # everything counted so far was seen
                    drafts = rng.randrange(1, 9)
                    per_pos = [rng.randrange(0, drafts + 1) for _ in range(K)]
                    fake_add(vllm, drafts, drafts * K, per_pos)
                    for truth in open_windows.values():
                        _count(truth, drafts, per_pos)
                    if open_windows and rng.random() < 0.5:
                        exporter.wait_seen(next(iter(open_windows)))
                where, window_id, acked = _kill_somewhere(exporter, rng, open_windows, serial)
                if where == "start":
                    serial += 1
                    open_windows[window_id] = new_truth()  # acknowledged or retried below
                if where == "stop" and acked is not None:
                    checked += _check(acked, open_windows.pop(window_id))
                in_limbo = where != "idle" and acked is None
                if not in_limbo and rng.random() < 0.5:
                    drafts = rng.randrange(1, 9)
                    per_pos = [rng.randrange(0, drafts + 1) for _ in range(K)]
                    fake_add(vllm, drafts, drafts * K, per_pos)  # while we are down
                    for truth in open_windows.values():
                        _count(truth, drafts, per_pos)
                exporter.start()
                if in_limbo and where == "start":
                    status, _ = exporter.api("POST", "/windows", {"id": window_id})
                    assert status in (200, 201)  # 200: committed just before the kill
                elif in_limbo:
                    status, answer = exporter.api("POST", f"/windows/{window_id}/stop")
                    assert status == 200, answer
                    checked += _check(answer, open_windows.pop(window_id))
            for window_id, truth in sorted(open_windows.items()):
                status, answer = exporter.api("POST", f"/windows/{window_id}/stop")
                assert status == 200, answer
                checked += _check(answer, truth)
        finally:
            exporter.stop()
    return checked


def _count(truth: dict, drafts: int, per_pos: list[int]) -> None:
    truth["drafts"] += drafts
    truth["tokens"] += drafts * K
    truth["per_pos"] = [a + b for a, b in zip(truth["per_pos"], per_pos, strict=True)]


def _check(answer: dict, truth: dict) -> int:
    result = answer["results"]["e"]
    if truth["drafts"] == 0:
        assert result["status"] == "na", result
    else:
        assert_exact(result, truth)
    return 1


def _kill_somewhere(exporter: Exporter, rng: random.Random, open_windows: dict, serial: int):
    """SIGKILL while idle, during a start or during a stop: (where, window id, answer or None)."""
    where = rng.choice(["idle", "start", "stop"] if open_windows else ["idle", "start"])
    if where == "idle":
        time.sleep(rng.uniform(0, 0.6))
        exporter.kill()
        return where, None, None
    if where == "start":
        window_id = f"r{serial + 1}"
        call = ("POST", "/windows", {"id": window_id})
    else:
        window_id = rng.choice(sorted(open_windows))
        call = ("POST", f"/windows/{window_id}/stop", None)
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(exporter.api(*call)))
    thread.start()
    time.sleep(rng.uniform(0, 0.05))
    exporter.kill()
    thread.join(timeout=30)
    acked = answers and answers[0][0] in (200, 201)
    return where, window_id, answers[0][1] if acked else None


def test_random_kills_short(tmp_path):
    assert _random_kill_run(tmp_path, kills=4, seed=int(os.environ.get("SOAK_SEED", "3"))) > 0


@pytest.mark.soak
def test_random_kills_soak(tmp_path):
    kills = int(os.environ.get("SOAK_KILLS", "60"))
    assert _random_kill_run(tmp_path, kills=kills, seed=int(os.environ.get("SOAK_SEED", "1"))) > 0


class TestTrafficWindowKilledWhileIdle:
    """A window with traffic edges, its target idle between a paced client's requests through
    the proxy: killed while idle, its server restarted while we are down, it loses nothing the
    server counted before the kill (what the restart erased was sampled while idle)."""

    INTERVAL = 0.5  # scrape_interval: every round feeds the windows and saves what they took

    def _serve(self, tmp_path, vllm: int) -> tuple[Exporter, int]:
        proxy = free_port()
        exporter = Exporter(tmp_path, vllm)
        config = write_config(
            tmp_path / "c.yaml", exporter.port,
            [{"name": "e", "url": f"http://127.0.0.1:{vllm}/metrics",
              "proxy": {"listen": f"127.0.0.1:{proxy}"}}],
            scrape_interval=f"{self.INTERVAL}s", scrape_timeout="250ms")
        exporter.command = CLI + ["serve", "--config", str(config)]
        return exporter, proxy

    @staticmethod
    def _paced(proxy: int, tokens: list[int], truth: dict) -> float:
        """One request at a time through the proxy, a pause after each; the time the last
        answer came."""
        for n in tokens:
            status, answer = http("POST", f"http://127.0.0.1:{proxy}/v1/completions",
                                  {"model": "m", "prompt": "p", "max_tokens": n})
            assert status == 200, answer
            last = time.time()
            spec = answer["metrics"]["speculative_decoding"]
            truth["drafts"] += spec["num_spec_steps"]
            truth["tokens"] += spec["num_draft_tokens"]
            truth["accepted"] += spec["num_accepted_draft_tokens"]
            time.sleep(0.15)
        return last

    def _rounds_after(self, exporter: Exporter, since: float, rounds: int) -> None:
        """Until the target has been scraped `rounds` intervals after `since`: a whole round,
        and the save after it, came while it was idle."""
        end = time.monotonic() + 30
        while True:
            status, targets = exporter.api("GET", "/targets")
            assert status == 200, targets
            (target,) = [t for t in targets["targets"] if t["name"] == "e"]
            if (target["last_scrape_at"] or 0) >= since + rounds * self.INTERVAL:
                return
            assert time.monotonic() < end, "the exporter stopped scraping"
            time.sleep(0.05)

    def test_killed_while_idle_then_its_server_restarted_loses_nothing(self, tmp_path):
        with fake_vllm("--k", str(K), "--per-request-spec-decode-metrics", "summary") as vllm:
            exporter, proxy = self._serve(tmp_path, vllm)
            exporter.start()
            try:
                truth = {"drafts": 0, "tokens": 0, "accepted": 0}
                status, opened = exporter.api("POST", "/windows", {"id": "t", "edges": "traffic"})
                assert status == 201, opened
                idle_since = self._paced(proxy, [30, 12, 25, 40, 18, 33, 21, 27], truth)
                self._rounds_after(exporter, idle_since, 3)
                exporter.kill()
                restart_server(vllm)  # what it counted before is gone from its counters
                exporter.start()
                self._paced(proxy, [14, 22, 9], truth)
                status, answer = exporter.api("POST", "/windows/t/stop")
                assert status == 200, answer
            finally:
                exporter.stop()
        data = answer["results"]["e"]["data"]
        assert (data["num_drafts"], data["draft_tokens"], data["accepted_tokens"]) == (
            truth["drafts"], truth["tokens"], truth["accepted"]), answer["results"]["e"]
        assert answer["results"]["e"]["resets"] == 1
