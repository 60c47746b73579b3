"""A long randomized run (`-m soak`): every window's result is the true increase.

`SOAK_SECONDS` bounds it (default 600). Random faults per target and step, server restarts,
exporter restarts on the same state, windows opening and closing all the time.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import deque

import pytest

from exporter.core.window import UNSEEN_AT_BASELINE
from faults.checks import still_serving
from faults.servers import Counters, RawTarget

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
FAULTS = ["hang", "http500", "html", "binary", "cut_off", "gzip_corrupt", "reset", "vanish",
          "cut_line", "slowloris", "redirect_loop"]
# Notes that say a target's numbers start after the window's start (so they may fall short).
LATE_NOTES = (UNSEEN_AT_BASELINE, "no baseline was saved before the exporter stopped")
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
    # What each target went through lately, printed with a mismatch.
    history = {n: deque[str](maxlen=200) for n in range(len(targets))}
    seen_ok: set[int] = set()  # targets whose last scrape succeeded with no increments since
    checked = restarts = exporter_restarts = 0
    honest: dict[str, int] = {}  # honest answers short of the truth, per kind
    end = time.monotonic() + SOAK_SECONDS
    step = 0

    def up(n: int) -> bool:
        """The exporter's last scrape of target n succeeded."""
        return exp.service.view().targets[f"t{n}"].up

    def honest_failure(result: dict, truth: list[int], down: str | None) -> str | None:
        """A start or stop scrape that failed (200 ms is short on a loaded machine) leaves an
        honest answer only: N/A naming the failed edge, or partial with counts within the truth
        (counted from the first good scrape after the start, up to the last before the stop),
        naming the failed edge or why the numbers start late; which of them, or None."""
        fetch = f"Failed to fetch metrics from {result['url']} at window {down}"
        if result["status"] == "na":
            return f"na, {down} failed" if down and fetch in (result["error"] or "") else None
        note = result.get("coverage_note") or ""
        named = [f"{down} failed"] if down is not None and fetch in note else []
        named += [late[:40] for late in LATE_NOTES if late in note]
        got = result["increase"]
        counts = [got["num_drafts"], got["num_draft_tokens"], got["num_accepted_tokens"]]
        if (result.get("coverage") == "partial" and named
                and all(0 <= c <= t for c, t in zip(counts, truth, strict=True))):
            return "partial, " + ", ".join(named)
        return None

    def told(n: int, window_id: str, truth: list[int], result: dict) -> str:
        """A mismatch: the whole result and what the target went through since the start."""
        since = list(history[n])
        starts = [i for i, line in enumerate(since) if f"start {window_id} " in line]
        return (f"{window_id} t{n} truth={truth}\n{json.dumps(result)}\n"
                + "\n".join(since[starts[-1] if starts else 0:]))

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
                history[n].append(f"{step} add {drafts} -> {added[n]}")
            elif n in seen_ok and rng.random() < 0.1:
                target.counters.restart()  # only right after we saw all it had counted
                restarts += 1
                history[n].append(f"{step} server restart")
            roll = rng.random()
            target.mode, target.page_options = "ok", {}
            if roll < 0.25:
                target.mode = rng.choice(FAULTS)
            elif roll < 0.35:
                target.page_options = rng.choice(PAGE_FAULTS)
        await exp.round()
        for n, target in enumerate(targets):
            history[n].append(f"{step} round {target.mode} {target.page_options} up={up(n)}")
        # Only a scrape the exporter took saw the counts: an "ok" page can still time out on
        # a loaded machine, and a restart after that loses what no scrape saw (the oracle's,
        # not the exporter's, to know).
        seen_ok.update(n for n, target in enumerate(targets)
                       if target.mode == "ok" and not target.page_options and up(n))
        await still_serving(exp.client)

        if rng.random() < 0.3 and len(open_windows) < 5:
            window_id = f"s{step}"
            started = await start_or_stop("/api/v1/windows", {"id": window_id})
            open_windows[window_id] = {n: list(v) for n, v in added.items()}
            # The start answer names the targets whose start scrape failed (`up` is the last
            # scrape's, which may be a round's taken since).
            down_at_start[window_id] = {n for n in range(len(targets))
                                        if f"t{n}" in started["start_errors"]}
            for n in range(len(targets)):
                history[n].append(f"{step} start {window_id} up={up(n)} "
                                  f"failed={n in down_at_start[window_id]}")
            seen_ok.update(n for n in range(len(targets)) if up(n))
        if open_windows and rng.random() < 0.2:
            window_id = rng.choice(sorted(open_windows))
            answer = await start_or_stop(f"/api/v1/windows/{window_id}/stop")
            for n in range(len(targets)):
                history[n].append(f"{step} stop {window_id} up={up(n)}")
            seen_ok.update(n for n in range(len(targets)) if up(n))
            at_start = open_windows.pop(window_id)
            failed_start = down_at_start.pop(window_id)
            for n in range(len(targets)):
                truth = [a - b for a, b in zip(added[n], at_start[n], strict=True)]
                result = answer["results"][f"t{n}"]
                down = "stop" if not up(n) else "start" if n in failed_start else None
                if (kind := honest_failure(result, truth, down)) is not None:
                    honest[kind] = honest.get(kind, 0) + 1
                    continue
                if truth[0] == 0:
                    assert result["status"] == "na", told(n, window_id, truth, result)
                    continue
                assert result["status"] == "ok", told(n, window_id, truth, result)
                got = result["increase"]
                assert [got["num_drafts"], got["num_draft_tokens"],
                        got["num_accepted_tokens"]] == truth, told(n, window_id, truth, result)
                checked += 1
        if rng.random() < 0.03:
            # The exporter goes away and comes back on the same state (what SIGKILL leaves:
            # state saved after every round, start and stop).
            exp.service.book.store.close()  # gone without a last save, as after a SIGKILL
            await exp.client.close()
            exp = await exporter(config)
            exporter_restarts += 1
            for n in range(len(targets)):
                history[n].append(f"{step} exporter restart (SIGKILL)")
            seen_ok.clear()  # the restored windows have not seen the targets since
    print(f"\nsoak: steps={step} windows_checked={checked} server_restarts={restarts} "
          f"exporter_restarts={exporter_restarts} honest={honest}")
    assert checked > 0
    for target in targets:
        await target.stop()
