"""The recording proxy's added latency: 64 concurrent streams, direct against proxied.

Run against a fake-vllm and an exporter whose target has `proxy.listen` (both already up):
`python -m bench.case_proxy --direct http://127.0.0.1:18000 --proxied http://127.0.0.1:18001`.
Reports time to first byte and the gap between chunks, p50 and p99, for each path, and the
difference; rounds alternate direct and proxied so both see the same load on the host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import aiohttp

from bench.common import percentile

BODY = {"model": "m", "prompt": "p", "max_tokens": 64, "stream": True}


async def _stream(session: aiohttp.ClientSession, base: str, ttfb: list[float],
                  gaps: list[float]) -> None:
    start = time.perf_counter()
    async with session.post(base + "/v1/completions", json=BODY) as response:
        last = None
        async for _ in response.content.iter_any():
            now = time.perf_counter()
            if last is None:
                ttfb.append(now - start)
            else:
                gaps.append(now - last)
            last = now


async def measure(direct: str, proxied: str, streams: int, rounds: int) -> dict[str, object]:
    """p50/p99 of time to first byte and chunk gaps (ms) per path, and the proxy's addition."""
    figures: dict[str, tuple[list[float], list[float]]] = {"direct": ([], []),
                                                           "proxied": ([], [])}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(rounds):
            for name, base in (("direct", direct), ("proxied", proxied)):
                ttfb, gaps = figures[name]
                await asyncio.gather(*(_stream(session, base, ttfb, gaps)
                                       for _ in range(streams)))
    out: dict[str, object] = {}
    for name, (ttfb, gaps) in figures.items():
        out[name] = {f"{kind}_{q}_ms": 1000 * percentile(values, p)
                     for kind, values in (("ttfb", ttfb), ("gap", gaps))
                     for q, p in (("p50", 50.0), ("p99", 99.0))}
    d, p = out["direct"], out["proxied"]
    assert isinstance(d, dict) and isinstance(p, dict)
    out["added_ms"] = {k: p[k] - d[k] for k in d}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direct", required=True)
    parser.add_argument("--proxied", required=True)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--exporter-pid", type=int, help="report the exporter's CPU per request")
    args = parser.parse_args()
    before = _cpu_seconds(args.exporter_pid)
    out = asyncio.run(measure(args.direct, args.proxied, args.streams, args.rounds))
    if args.exporter_pid:
        used = _cpu_seconds(args.exporter_pid) - before
        out["exporter_cpu_ms_per_proxied_request"] = 1000 * used / (args.streams * args.rounds)
    print(json.dumps(out, indent=1))


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU of a process (Linux /proc), 0.0 without a pid."""
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
