"""Case: the floor of one scrape on this machine, beside what the exporter spends.

Receive (a kept-alive blocking-socket GET of a gzip'd fleet page, read whole), inflate (each
installed backend) and `bytes.count(b"\\n")` over the page (the least any parser must do):
CPU time per call, medians of 3 repeats. Their sum is what no scraper can go under; the
fleet case's CPU per target-scrape is set against it when that case ran.
"""

from __future__ import annotations

import socket
import statistics
import time
from urllib.parse import urlsplit

from bench.common import CaseResult, Row, ratio
from bench.fleet import NginxFleet
from exporter.core.parse import parse_page
from exporter.scrape.inflate import BACKEND, BACKENDS, inflate


def _cpu_per_call(fn, *, repeats: int = 3, min_seconds: float = 0.2) -> float:
    """Median over `repeats` of thread CPU seconds per call, each repeat lasting min_seconds."""
    medians = []
    for _ in range(repeats):
        calls, start = 0, time.thread_time()
        while True:
            fn()
            calls += 1
            spent = time.thread_time() - start
            if spent >= min_seconds:
                break
        medians.append(spent / calls)
    return statistics.median(medians)


class _Getter:
    """GET over one kept-alive socket, the whole gzip'd answer read: the receive floor."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port))
        self.request = (f"GET {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
                        "Accept-Encoding: gzip\r\nUser-Agent: bench-floor\r\n\r\n").encode()

    def get(self) -> bytes:
        self.sock.sendall(self.request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        chunks = [body]
        got = len(body)
        while got < length:
            chunk = self.sock.recv(max(65536, length - got))
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self.sock.close()


def run(fleet: NginxFleet, fleet_data: dict | None = None) -> CaseResult:
    """Receive, inflate and count floors for the fleet's page; ours beside them."""
    result = CaseResult("floor")
    getter = _Getter(fleet.url(0))
    try:
        body = getter.get()
        receive = _cpu_per_call(getter.get)
    finally:
        getter.close()
    page = inflate(body, 1 << 26)
    inflates = {name: _cpu_per_call(lambda b=name: inflate(body, 1 << 26, backend=b))
                for name in BACKENDS}
    count = _cpu_per_call(lambda: page.count(b"\n"))
    parse = _cpu_per_call(lambda: parse_page(page))
    floor = receive + inflates[BACKEND] + count
    result.data = {"page_bytes": len(page), "gzip_bytes": len(body), "receive_s": receive,
                   "inflate_s": inflates, "count_s": count, "parse_s": parse,
                   "floor_s": floor, "floor_without_gzip_s": receive + count}
    us = 1e6
    result.rows = [
        Row("floor", f"receive one gzip'd page ({len(body):,} B), kept-alive socket",
            receive * us, "us"),
        *[Row("floor", f"inflate to {len(page):,} B with {name}", seconds * us, "us",
              inflates["zlib"] * us, "zlib", ratio(seconds, inflates["zlib"]))
          for name, seconds in inflates.items()],
        Row("floor", "page.count(b'\\n')", count * us, "us"),
        Row("floor", "our parser on the page", parse * us, "us", count * us, "count(b'\\n')",
            ratio(parse, count)),
        Row("floor", f"floor of one scrape: receive + inflate ({BACKEND}) + count", floor * us,
            "us"),
    ]
    per = (fleet_data or {}).get("points", {})
    for n in sorted(per, key=int):
        ours = (per[n].get("exporter") or {}).get("cpu_ms_per_target_scrape")
        if ours is not None:
            result.rows.append(Row("floor", f"N={n}: exporter's CPU per target-scrape vs floor",
                                   ours * 1e3, "us", floor * us, "floor", ratio(ours / 1e3, floor)))
    return result
