"""Load generator run as a subprocess: N clients on /metrics and the API; prints JSON stats.

python loadclient.py BASE_URL SECONDS CLIENTS TARGETS
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import aiohttp

THINK = 0.1  # mean seconds a client waits between requests


async def client(n: int, session: aiohttp.ClientSession, base: str, end: float, targets: int,
                 stats: dict) -> None:
    rng = random.Random(n)
    cycle = 0
    while time.monotonic() < end:
        roll = rng.random()
        started = time.monotonic()
        try:
            if roll < 0.6:
                await _get(session, f"{base}/metrics", stats, text=True)
            elif roll < 0.75:
                await _get(session, f"{base}/api/v1/targets", stats)
            elif roll < 0.95:
                await _get(session, f"{base}/api/v1/windows", stats)
            else:
                cycle += 1
                await _window(session, base, f"load-{n}-{cycle}", f"t{rng.randrange(targets)}",
                              stats)
        except (aiohttp.ClientError, TimeoutError, AssertionError) as exc:
            stats["errors"].append(f"{type(exc).__name__}: {exc}"[:200])
        stats["latencies"].append(time.monotonic() - started)
        await asyncio.sleep(THINK * rng.random() * 2)  # a client, not a tight loop


async def _get(session, url, stats, text=False):
    async with session.get(url) as response:
        assert response.status == 200, f"GET {url} -> {response.status}"
        if text:
            body = await response.text()
            assert "specdec_target_up" in body
        else:
            await response.json()
    stats["requests"] += 1


async def _window(session, base, window_id, target, stats):
    async with session.post(f"{base}/api/v1/windows",
                            json={"id": window_id, "targets": [target]}) as response:
        assert response.status == 201, f"start -> {response.status} {await response.text()}"
    async with session.get(f"{base}/api/v1/windows/{window_id}") as response:
        assert response.status == 200
    async with session.post(f"{base}/api/v1/windows/{window_id}/stop") as response:
        assert response.status == 200, f"stop -> {response.status}"
        answer = await response.json()
    result = answer["results"][target]
    stats["requests"] += 3
    if result["status"] != "ok" and "timeout after" in (result["error"] or ""):
        # A scrape that misses its timeout on a loaded machine is an honest N/A, not a wrong
        # number: counted, never asserted away (how often depends on the machine).
        stats["na_timeouts"] += 1
        return
    assert result["status"] == "ok", result["error"]
    raw = result["raw"]
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        # Every scrape of a target adds to its counters, never a reset: increase = after - before.
        assert result["increase"][key] == raw["after"][key] - raw["before"][key], (key, result)
    stats["windows"] += 1


async def main(base: str, seconds: float, clients: int, targets: int) -> dict:
    stats = {"requests": 0, "windows": 0, "na_timeouts": 0, "errors": [], "latencies": []}
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        end = time.monotonic() + seconds
        await asyncio.gather(*(client(n, session, base, end, targets, stats)
                               for n in range(clients)))
    latencies = sorted(stats.pop("latencies")) or [0.0]
    stats["p50"] = latencies[len(latencies) // 2]
    stats["p99"] = latencies[int(len(latencies) * 0.99)]
    stats["max"] = latencies[-1]
    stats["error_count"] = len(stats["errors"])
    stats["errors"] = stats["errors"][:10]
    return stats


if __name__ == "__main__":
    base, seconds, clients, targets = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(
        sys.argv[4])
    print(json.dumps(asyncio.run(main(base, seconds, clients, targets))))
