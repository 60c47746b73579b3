"""Misbehaving /metrics servers on loopback: raw asyncio sockets, one behaviour per `mode`."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import random
import socket
import time
from dataclasses import dataclass, field

HANG_SECONDS = 30.0  # the longest any handler lingers: every fault is bounded in time


@dataclass
class Counters:
    """A server's spec-decode counters per engine, with `_created` that changes on restart."""

    k: int = 3
    engines: int = 1
    model: str = "m"
    created: float = field(default_factory=time.time)
    values: list[list[int]] = field(default_factory=list)  # engine -> [drafts, tokens, p0..]
    # Engines started after the server, each with its own `_created` (as a labelled child
    # made later has in prometheus_client).
    engine_created: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.values:
            self.values = [[0] * (2 + self.k) for _ in range(self.engines)]

    def add(self, drafts: int, tokens: int, per_pos: list[int], engine: int = 0) -> None:
        row = self.values[engine]
        row[0] += drafts
        row[1] += tokens
        for pos, count in enumerate(per_pos):
            row[2 + pos] += count

    def add_engine(self) -> None:
        """A new data-parallel rank starts (from zero)."""
        self.values.append([0] * (2 + self.k))
        self.engine_created[self.engines] = max(time.time(), self.created)
        self.engines += 1

    def restart(self) -> None:
        """Every counter back to zero, a new `_created`."""
        self.values = [[0] * (2 + self.k) for _ in range(self.engines)]
        # Never in the future: a `_created` after a scrape reads as created after it.
        self.created = max(time.time(), self.created + 1e-6)
        self.engine_created = {}

    def totals(self) -> dict:
        """Summed over engines, in the result's `increase` shape."""
        per_pos = {str(p): sum(row[2 + p] for row in self.values) for p in range(self.k)}
        return {
            "num_drafts": sum(row[0] for row in self.values),
            "num_draft_tokens": sum(row[1] for row in self.values),
            "num_accepted_tokens": sum(per_pos.values()),
            "accepted_per_pos": per_pos,
        }

    def page(self, *, engine_label: bool = True, created: bool = True,
             override: dict[str, str] | None = None, duplicate: bool = False,
             model: str | None = None) -> bytes:
        """A vLLM V1 page; `override` replaces a field's value text (e.g. NaN) on engine 0."""
        model = self.model if model is None else model
        override = override or {}
        lines = ["# HELP vllm:num_requests_running Requests running.",
                 "# TYPE vllm:num_requests_running gauge",
                 f'vllm:num_requests_running{{model_name="{model}"}} 1.0']
        names = ["vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens"]
        for index, name in enumerate(names + ["vllm:spec_decode_num_accepted_tokens_per_pos"]):
            lines.append(f"# TYPE {name} counter")
            for engine, row in enumerate(self.values):
                labels = f'engine="{engine}",' if engine_label else ""
                labels += f'model_name="{model}"'
                if index < 3:
                    series = [(labels, float(row[index] if index < 2 else sum(row[2:])))]
                else:
                    series = [(f'{labels},position="{p}"', float(row[2 + p]))
                              for p in range(self.k)]
                for label_text, value in series:
                    text = override.get(name, repr(value)) if engine == 0 else repr(value)
                    lines.append(f"{name}_total{{{label_text}}} {text}")
                    if duplicate:
                        lines.append(f"{name}_total{{{label_text}}} {value + 1000!r}")
                    if created:
                        stamp = self.engine_created.get(engine, self.created)
                        lines.append(f"{name}_created{{{label_text}}} {stamp!r}")
        return ("\n".join(lines) + "\n").encode()


def _head(status: int, headers: dict[str, str]) -> bytes:
    reason = {200: "OK", 301: "Moved Permanently", 404: "Not Found",
              500: "Internal Server Error"}.get(status, "X")
    lines = [f"HTTP/1.1 {status} {reason}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class RawTarget:
    """A /metrics server whose next answers follow `mode`; `counters` is the truth it serves."""

    def __init__(self, counters: Counters | None = None):
        self.counters = counters or Counters()
        self.mode = "ok"
        self.requests = 0
        self.last_head = b""  # the last request's line and headers, as received
        self.page_options: dict = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    async def start(self) -> RawTarget:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", self.port or 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            self.requests += 1
            self.last_head = head
            path = head.split(b" ", 2)[1].decode()
            await getattr(self, f"_mode_{self.mode}")(writer, path)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                TimeoutError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _send(self, writer, status: int, body: bytes, **headers: str) -> None:
        headers.setdefault("Content-Type", "text/plain; version=0.0.4")
        headers["Content-Length"] = str(len(body))
        writer.write(_head(status, headers) + body)
        await writer.drain()

    def page(self) -> bytes:
        return self.counters.page(**self.page_options)

    async def _mode_ok(self, writer, path):
        await self._send(writer, 200, self.page())

    async def _mode_hang(self, writer, path):
        await asyncio.sleep(HANG_SECONDS)

    async def _mode_slowloris(self, writer, path):
        # A complete, valid answer, one byte every 50 ms: only the scrape timeout ends it.
        data = _head(200, {"Content-Length": str(len(self.page()))}) + self.page()
        for byte in data[: int(HANG_SECONDS / 0.05)]:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)

    async def _mode_http500(self, writer, path):
        await self._send(writer, 500, b"internal error\n")

    async def _mode_http404(self, writer, path):
        await self._send(writer, 404, b"not found\n")

    async def _mode_redirect_loop(self, writer, path):
        target = "/b" if path != "/b" else "/metrics"
        await self._send(writer, 301, b"", Location=target)

    async def _mode_html(self, writer, path):
        body = b"<!DOCTYPE html>\n<html><body><h1>502 Bad Gateway</h1></body></html>\n"
        await self._send(writer, 200, body, **{"Content-Type": "text/html"})

    async def _mode_binary(self, writer, path):
        await self._send(writer, 200, random.Random(7).randbytes(8192),
                         **{"Content-Type": "application/octet-stream"})

    async def _mode_endless(self, writer, path):
        writer.write(_head(200, {"Transfer-Encoding": "chunked"}))
        chunk = b"# filler " + b"x" * 4000 + b"\n"
        frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        for _ in range(64 * 1024 * 1024 // len(chunk)):  # bounded: 64 MB at most
            writer.write(frame)
            await writer.drain()

    async def _mode_oversize_declared(self, writer, path):
        writer.write(_head(200, {"Content-Length": str(10**10)}) + self.page())
        await writer.drain()
        await asyncio.sleep(HANG_SECONDS)

    async def _mode_cut_off(self, writer, path):
        page = self.page()
        writer.write(_head(200, {"Content-Length": str(len(page))}) + page[: len(page) // 2])
        await writer.drain()

    async def _mode_cut_line(self, writer, path):
        # No length: the close ends the body, in the middle of the drafts line's value.
        page = self.page()
        line = page.index(b"vllm:spec_decode_num_drafts_total")
        end = page.index(b"\n", line)
        writer.write(_head(200, {}) + page[: end - 2])
        await writer.drain()

    async def _mode_gzip_corrupt(self, writer, path):
        good = gzip.compress(self.page())
        body = good[:10] + bytes(b ^ 0x5A for b in good[10:])
        await self._send(writer, 200, body, **{"Content-Encoding": "gzip"})

    async def _mode_vanish(self, writer, path):
        # A valid page that has lost every spec-decode series.
        body = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1.0\n"
        await self._send(writer, 200, body)

    async def _mode_reset(self, writer, path):
        writer.transport.abort()


def hanging_listener() -> socket.socket:
    """A port that accepts connections (the kernel does) and never answers; the caller closes it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock
