"""The recording proxy's added latency: 64 and 8 concurrent streams, direct, through a
do-nothing aiohttp relay, through nginx, and through the exporter's proxy port.

`python -m bench.case_proxy` starts an upstream, the exporter (its target with `proxy.listen`,
one window open so that every answer is recorded, scraping the target at 1 s), the relay and
nginx, each its own process, then measures time to first byte and the gap between chunks, p50
and p99, per path. Rounds alternate the paths so that all see the same load on the host; each
figure is the median over rounds of that round's figure, and what a path adds over direct the
median over rounds of its difference from direct in the same round. nginx (`proxy_pass`,
`proxy_buffering off`, a keep-alive upstream, one worker) is the baseline users would pick:
`nginx_added_ms` is what it adds, and `goal` checks the proxy's added p99 time to first byte and
p99 chunk gap against issue 45's bar, 2x nginx's + 1 ms. The relay (one aiohttp hop, no
recording) shows what any Python hop costs on this host. `--direct URL --proxied URL` measures
servers already up instead. `--cpus A,B,C` pins the server, the hops under test and the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.common import (
    CaseResult,
    Child,
    Row,
    Skip,
    free_port,
    http_status,
    percentile,
    wait_until,
)
from bench.fleet import find_nginx
from exporter.server.eventloop import loop_kind, new_event_loop

BODY = {"model": "m", "prompt": "p", "max_tokens": 64, "stream": True}
PATHS = ("direct", "relay", "nginx", "proxied")


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


Samples = dict[str, tuple[list[float], list[float]]]  # path -> (ttfb, gaps) of one round


async def measure(bases: dict[str, str], streams: int, rounds: int) -> dict[str, object]:
    """p50/p99 of time to first byte and chunk gaps (ms) per path, and what the proxy adds."""
    per_round: list[Samples] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for r in range(rounds):
            per_round.append(samples := {name: ([], []) for name in bases})
            for name, base in _rotated(bases, r):
                await asyncio.gather(*(_stream(session, base, *samples[name])
                                       for _ in range(streams)))
    return _figures(per_round)


async def measure_paced(bases: dict[str, str], streams: int, rounds: int,
                        span: float) -> dict[str, object]:
    """Like `measure`, in steady state: `streams` clients each asking again as soon as its
    stream ends, `span` seconds per path per round (paths alternating)."""
    per_round: list[Samples] = []
    connector = aiohttp.TCPConnector(limit=0)

    async def client(session: aiohttp.ClientSession, base: str, until: float,
                     ttfb: list[float], gaps: list[float]) -> None:
        while time.perf_counter() < until:
            await _stream(session, base, ttfb, gaps)

    async with aiohttp.ClientSession(connector=connector) as session:
        for r in range(rounds):
            per_round.append(samples := {name: ([], []) for name in bases})
            for name, base in _rotated(bases, r):
                until = time.perf_counter() + span
                await asyncio.gather(*(client(session, base, until, *samples[name])
                                       for _ in range(streams)))
    return _figures(per_round)


def _rotated(bases: dict[str, str], r: int) -> list[tuple[str, str]]:
    """The paths in round r's order: each goes first, second and last equally often."""
    items = list(bases.items())
    return items[r % len(items):] + items[:r % len(items)]


def _quantiles(ttfb: list[float], gaps: list[float]) -> dict[str, float]:
    return {f"{kind}_{q}_ms": 1000 * percentile(values, p)
            for kind, values in (("ttfb", ttfb), ("gap", gaps))
            for q, p in (("p50", 50.0), ("p99", 99.0))}


def _figures(per_round: list[Samples]) -> dict[str, object]:
    """Each figure the median over rounds of that round's figure; what a path adds over
    direct the median of the rounds' differences (a round's load is the same for all paths)."""
    rounds = [{name: _quantiles(*pair) for name, pair in samples.items()}
              for samples in per_round]
    out: dict[str, object] = {
        name: {k: statistics.median(r[name][k] for r in rounds) for k in rounds[0][name]}
        | {"requests": sum(len(s[name][0]) for s in per_round)} for name in rounds[0]}
    keys = list(rounds[0]["direct"])

    def added(path: str, over: str = "direct") -> dict[str, float]:
        return {k: statistics.median(r[path][k] - r[over][k] for r in rounds) for k in keys}

    out["added_ms"] = ours = added("proxied")
    out["rounds"] = len(rounds)
    if "relay" in out:
        out["relay_added_ms"] = added("relay")
        out["over_relay_ms"] = added("proxied", "relay")
    if "nginx" in out:
        nginx = out["nginx_added_ms"] = added("nginx")
        # Issue 45's bar: the proxy's added p99s within 2x nginx's + 1 ms (nginx's below 0
        # counts as 0: it cannot make the server faster).
        out["goal"] = {k: {"proxy_ms": ours[k], "bar_ms": 2 * max(nginx[k], 0.0) + 1.0,
                           "met": ours[k] <= 2 * max(nginx[k], 0.0) + 1.0}
                       for k in ("ttfb_p99_ms", "gap_p99_ms")}
    return out


NGINX_CONF = """worker_processes 1;
error_log {dir}/nginx-error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/nginx-body;
    proxy_temp_path {dir}/nginx-proxy;
    upstream server {{ server 127.0.0.1:{upstream}; keepalive 128; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://server;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def nginx_child(workdir: Path, upstream: int, port: int, cpu: str | None) -> Child | None:
    """nginx in front of the server on `port`, or None where nginx is not installed."""
    binary = find_nginx()
    if binary is None:
        return None
    conf = workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=workdir, upstream=upstream, port=port))
    return Child(_pinned([binary, "-p", str(workdir), "-c", str(conf), "-g", "daemon off;"],
                         cpu), workdir / "nginx.log")


# -- a paced upstream: vLLM's stream shape, a token every `token_ms` ---------------------------

SPEC = {"num_spec_steps": 16, "num_draft_tokens": 48, "num_accepted_draft_tokens": 16,
        "acceptance_histogram": [4, 8, 4, 0], "mean_acceptance_length": 2.0,
        "draft_acceptance_rate": 1 / 3, "num_spec_tokens": 3}


def paced_app(tokens: int, token_ms: float) -> web.Application:
    """`/v1/completions` streamed a chunk every `token_ms` (the last with usage and vLLM's
    per-request object), `/metrics` a fake-vllm page: what a decoding server looks like."""
    from exporter.fakevllm import FakeServer

    page = FakeServer(k=3).render()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/plain")

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        head = {"id": "cmpl-1", "object": "text_completion", "model": "m"}
        for i in range(tokens):
            await asyncio.sleep(token_ms / 1000)
            chunk = head | {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        last = head | {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": tokens},
                       "metrics": {"speculative_decoding": SPEC}}
        await response.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    return app


# -- the baseline: one aiohttp hop that only relays -------------------------------------------

def relay_app(upstream: str, session_box: list[aiohttp.ClientSession]) -> web.Application:
    """Forwards every request to `upstream` and streams its answer back, as it arrives."""
    async def handler(request: web.Request) -> web.StreamResponse:
        async with session_box[0].request(request.method, upstream + request.path_qs,
                                          data=await request.read(),
                                          headers={"Content-Type": "application/json"}
                                          ) as answer:
            response = web.StreamResponse(status=answer.status)
            response.content_type = answer.content_type
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def session(_: web.Application):  # type: ignore[no-untyped-def]
        async with aiohttp.ClientSession(auto_decompress=False,
                                         connector=aiohttp.TCPConnector(limit=0)) as s:
            session_box.append(s)
            yield

    app = web.Application()
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


# -- the rig: fake-vllm, the exporter with a proxy port and an open window, the relay ---------

def _pinned(argv: list[str], cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu, *argv] if cpu else argv


def start_rig(workdir: Path, cpus: list[str | None], args: argparse.Namespace
              ) -> tuple[dict[str, str], list[Child], int]:
    """(path -> base URL, children, exporter pid) with a window open on the exporter."""
    fake, proxy, relay, listen = free_port(), free_port(), free_port(), free_port()
    nginx = free_port()
    py = [sys.executable, "-m"]
    config = {"listen": f"127.0.0.1:{listen}", "output_dir": str(workdir / "out"),
              "window_scrape_interval": "1s",
              "targets": [{"name": "v", "url": f"http://127.0.0.1:{fake}/metrics",
                           "proxy": {"listen": f"127.0.0.1:{proxy}"}}]}
    (workdir / "c.yaml").write_text(json.dumps(config))
    server = (["bench.case_proxy", "--paced-upstream", "--port", str(fake), "--tokens",
               str(args.tokens), "--token-ms", str(args.token_ms)] if args.shape == "paced"
              else ["exporter", "fake-vllm", "--port", str(fake), "--drafts-per-second", "0",
                    "--per-request-spec-decode-metrics", "summary"])
    children = [
        Child(_pinned(py + server, cpus[0]), workdir / "server.log"),
        Child(_pinned(py + ["exporter", "serve", "--config", str(workdir / "c.yaml")], cpus[1]),
              workdir / "exporter.log"),
        Child(_pinned(py + ["bench.case_proxy", "--relay", f"http://127.0.0.1:{fake}",
                            "--port", str(relay)], cpus[1]), workdir / "relay.log"),
    ]
    bases = {"direct": f"http://127.0.0.1:{fake}", "relay": f"http://127.0.0.1:{relay}",
             "proxied": f"http://127.0.0.1:{proxy}"}
    if (front := nginx_child(workdir, fake, nginx, cpus[1])) is not None:
        children.append(front)
        bases["nginx"] = f"http://127.0.0.1:{nginx}"
    for url in (f"http://127.0.0.1:{fake}/metrics", f"http://127.0.0.1:{listen}/-/ready",
                f"http://127.0.0.1:{relay}/metrics", *(
                    [f"http://127.0.0.1:{nginx}/metrics"] if front else [])):
        wait_until(partial(_answers, url), 30, url)
    request = urllib.request.Request(f"http://127.0.0.1:{listen}/api/v1/windows", data=b"{}",
                                     method="POST", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).close()
    return bases, children, children[1].pid


def _answers(url: str) -> bool:
    return http_status(url) is not None


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m bench.case_proxy`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direct")
    parser.add_argument("--proxied")
    parser.add_argument("--streams", default="64,8",
                        help="concurrent streams; several (64,8) are measured in turn")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--shape", choices=["paced", "burst"], default="paced",
                        help="paced: each client asks again as its stream ends, a token every "
                             "--token-ms (vLLM's shape); burst: all streams start at once to "
                             "fake-vllm, which sends every token at once")
    parser.add_argument("--span", type=float, default=3.0, help="paced: seconds per path")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--token-ms", type=float, default=10.0)
    parser.add_argument("--paced-upstream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", help="CPUs of the server, the hops and the client: 0,1,1")
    parser.add_argument("--exporter-pid", type=int, help="report the exporter's CPU per request")
    parser.add_argument("--relay", help=argparse.SUPPRESS)  # run as the baseline relay
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.relay or args.paced_upstream:  # a child of the rig, on the exporter's loop
        app = relay_app(args.relay, []) if args.relay else paced_app(args.tokens, args.token_ms)
        web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None,
                    loop=new_event_loop())
        return
    print(json.dumps(measure_rig(args), indent=1))


def run(*, rounds: int = 5, span: float = 3.0) -> CaseResult:
    """`python -m bench`'s proxy case: the rig at 64 and 8 streams, the proxy's added p99 time
    to first byte and chunk gap against nginx's in the same run (issue 45's bar)."""
    if find_nginx() is None:
        raise Skip("nginx is not installed: the baseline of the proxy case")
    args = build_parser().parse_args(["--rounds", str(rounds), "--span", str(span)])
    out = measure_rig(args)
    result = CaseResult("proxy", data=out)
    for streams in (64, 8):
        goal = out[f"streams_{streams}"]["goal"]
        nginx = out[f"streams_{streams}"]["nginx_added_ms"]
        for key, what in (("ttfb_p99_ms", "p99 time to first byte"),
                          ("gap_p99_ms", "p99 gap between chunks")):
            result.rows.append(Row(
                "proxy", f"added {what}, {streams} streams", goal[key]["proxy_ms"], "ms",
                baseline=nginx[key], baseline_name="nginx", target="<= 2x nginx's + 1 ms",
                met=goal[key]["met"]))
    return result


def measure_rig(args: argparse.Namespace) -> dict[str, object]:
    """Every figure of one run of the rig (or of the servers `--direct`/`--proxied` name)."""
    cpus: list[str | None] = (args.cpus.split(",") if args.cpus else [None, None, None])
    children: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        try:
            if args.direct and args.proxied:
                bases, pid = {"direct": args.direct, "proxied": args.proxied}, args.exporter_pid
            else:
                bases, children, pid = start_rig(Path(tmp), cpus, args)
            if cpus[2]:
                os.sched_setaffinity(0, {int(cpus[2])})
            pids = {"proxied": pid} | ({"relay": children[2].pid} if children else {}) | (
                {"nginx": children[3].pid} if len(children) > 3 else {})
            out: dict[str, object] = {"load_before": os.getloadavg()}
            for streams in (int(n) for n in str(args.streams).split(",")):
                out[f"streams_{streams}"] = _one_count(bases, streams, args, pids)
            out["load_after"] = os.getloadavg()
            out["host_cpus"] = os.cpu_count()
            out["event_loop"] = loop_kind()
            out["pinned"] = args.cpus
            out["shape"] = args.shape
        finally:
            for child in children:
                child.stop()
    return out


def _one_count(bases: dict[str, str], streams: int, args: argparse.Namespace,
               pids: dict[str, int | None]) -> dict[str, object]:
    """The figures at one count of streams, with each hop's CPU per request it relayed (the
    exporter's includes its scrapes; nginx's its workers')."""
    before = {path: _cpu_seconds(pid) for path, pid in pids.items()}
    out = asyncio.run(measure_paced(bases, streams, args.rounds, args.span)
                      if args.shape == "paced" else measure(bases, streams, args.rounds))
    out["cpu_ms_per_request"] = {
        path: 1000 * (_cpu_seconds(pid) - before[path]) / figures["requests"]
        for path, pid in pids.items()
        if pid and isinstance(figures := out.get(path), dict) and figures["requests"]}
    out["load"] = os.getloadavg()
    return out


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU of a process and its children's (Linux /proc), 0.0 without a pid."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        with open(f"/proc/{pid}/task/{pid}/children") as kids:
            children = [int(k) for k in kids.read().split()]
    except FileNotFoundError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(_cpu_seconds(child) for child in children)


if __name__ == "__main__":
    main()
