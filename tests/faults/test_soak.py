"""A long randomized run (`-m soak`): every window's result is the true increase.

`SOAK_SECONDS` bounds it (default 600). Random faults per target and step, server restarts,
exporter restarts on the same state, windows opening and closing all the time.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from faults.checks import still_serving
from faults.servers import Counters, RawTarget

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
FAULTS = ["hang", "http500", "html", "binary", "cut_off", "gzip_corrupt", "reset", "vanish",
          "cut_line", "slowloris", "redirect_loop"]
PAGE_FAULTS = [{"override": {"vllm:spec_decode_num_drafts": "NaN"}}, {"duplicate": True},
               {"override": {"vllm:spec_decode_num_accepted_tokens": "-1.0"}}]


@pytest.mark.soak
async def test_soak_random_faults_exact_windows(exporter, tmp_path):
    rng = random.Random(int(os.environ.get("SOAK_SEED", "1")))
    targets = [await RawTarget(Counters(k=3, engines=1 + n % 2)).start() for n in range(6)]
    added = {n: [0, 0, 0] for n in range(len(targets))}  # drafts, tokens, accepted ever added
    # Saved after every round (and at once when a restart is seen), so the exact oracle holds
    # across the simulated SIGKILLs even when a server restarts while the exporter is away.
    config = {"scrape_interval": "1s", "scrape_timeout": "200ms",
              "targets": [{"name": f"t{n}", "url": t.url} for n, t in enumerate(targets)]}
    exp = await exporter(config)
    open_windows: dict[str, dict[int, list[int]]] = {}
    down_at_start: dict[str, set[int]] = {}  # targets whose start scrape failed, per window
    seen_ok: set[int] = set()  # targets whose last scrape succeeded with no increments since
    checked = restarts = exporter_restarts = honest_failures = 0
    end = time.monotonic() + SOAK_SECONDS
    step = 0

    def up(n: int) -> bool:
        """The exporter's last scrape of target n succeeded."""
        return exp.service.view().targets[f"t{n}"].up

    def honest_failure(result: dict, truth: list[int], down: str | None) -> bool:
        """A start or stop scrape that failed (200 ms is short on a loaded machine) leaves an
        honest answer only: N/A naming the failed edge, or partial with counts within the truth
        (the stop's, counted up to the last good scrape)."""
        if down is None:
            return False
        fetch = f"Failed to fetch metrics from {result['url']} at window {down}"
        if result["status"] == "na":
            return fetch in (result["error"] or "")
        got = result["increase"]
        counts = [got["num_drafts"], got["num_draft_tokens"], got["num_accepted_tokens"]]
        return (down == "stop" and result.get("coverage") == "partial"
                and fetch in (result.get("coverage_note") or "")
                and all(0 <= c <= t for c, t in zip(counts, truth, strict=True)))

    async def start_or_stop(path: str, body: dict | None = None) -> dict:
        for target in targets:  # start and stop scrapes see healthy pages
            target.mode, target.page_options = "ok", {}
        response = await exp.client.post(path, json=body or {})
        assert response.status in (200, 201), await response.text()
        return await response.json()

    while time.monotonic() < end:
        step += 1
        for n, target in enumerate(targets):
            if rng.random() < 0.5:
                drafts = rng.randrange(1, 20)
                per_pos = [rng.randrange(0, drafts + 1) for _ in range(3)]
                target.counters.add(drafts, 3 * drafts, per_pos,
                                    engine=rng.randrange(target.counters.engines))
                added[n] = [added[n][0] + drafts, added[n][1] + 3 * drafts,
                            added[n][2] + sum(per_pos)]
                seen_ok.discard(n)
            elif n in seen_ok and rng.random() < 0.1:
                target.counters.restart()  # only right after we saw all it had counted
                restarts += 1
            roll = rng.random()
            target.mode, target.page_options = "ok", {}
            if roll < 0.25:
                target.mode = rng.choice(FAULTS)
            elif roll < 0.35:
                target.page_options = rng.choice(PAGE_FAULTS)
        await exp.round()
        # Only a scrape the exporter took saw the counts: an "ok" page can still time out on
        # a loaded machine, and a restart after that loses what no scrape saw (the oracle's,
        # not the exporter's, to know).
        seen_ok.update(n for n, target in enumerate(targets)
                       if target.mode == "ok" and not target.page_options and up(n))
        await still_serving(exp.client)

        if rng.random() < 0.3 and len(open_windows) < 5:
            window_id = f"s{step}"
            await start_or_stop("/api/v1/windows", {"id": window_id})
            open_windows[window_id] = {n: list(v) for n, v in added.items()}
            down_at_start[window_id] = {n for n in range(len(targets)) if not up(n)}
            seen_ok.update(n for n in range(len(targets)) if up(n))
        if open_windows and rng.random() < 0.2:
            window_id = rng.choice(sorted(open_windows))
            answer = await start_or_stop(f"/api/v1/windows/{window_id}/stop")
            seen_ok.update(n for n in range(len(targets)) if up(n))
            at_start = open_windows.pop(window_id)
            failed_start = down_at_start.pop(window_id)
            for n in range(len(targets)):
                truth = [a - b for a, b in zip(added[n], at_start[n], strict=True)]
                result = answer["results"][f"t{n}"]
                down = "stop" if not up(n) else "start" if n in failed_start else None
                if honest_failure(result, truth, down):
                    honest_failures += 1
                    continue
                if truth[0] == 0:
                    assert result["status"] == "na", result
                    continue
                assert result["status"] == "ok", (window_id, n, result["error"])
                got = result["increase"]
                assert [got["num_drafts"], got["num_draft_tokens"],
                        got["num_accepted_tokens"]] == truth, (
                            window_id, n, down, json.dumps(result))
                checked += 1
        if rng.random() < 0.03:
            # The exporter goes away and comes back on the same state (what SIGKILL leaves:
            # state saved after every round, start and stop).
            exp.service.book.store.close()  # gone without a last save, as after a SIGKILL
            await exp.client.close()
            exp = await exporter(config)
            exporter_restarts += 1
            seen_ok.clear()  # the restored windows have not seen the targets since
    print(f"\nsoak: steps={step} windows_checked={checked} server_restarts={restarts} "
          f"exporter_restarts={exporter_restarts} honest_failures={honest_failures}")
    assert checked > 0
    for target in targets:
        await target.stop()
