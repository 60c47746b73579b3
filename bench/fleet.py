"""A fleet of simulated vLLM servers: pre-rendered pages served by nginx on many loopback addresses.

Each target gets its own address (127.77.x.y, one port), so clients keep one connection per
target as they would against real hosts. A few distinct pages are shared: target i serves page
i % pages. `advance()` rewrites the files with grown counters, so windows see activity.
"""

from __future__ import annotations

import gzip
import math
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from bench.common import Child, Skip, find_binary, wait_until
from exporter.fakevllm import FakeServer

NGINX_CANDIDATES = ("nginx", "/usr/sbin/nginx")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_ADAPTERS = 4  # LoRA adapters a served model commonly carries


def find_nginx() -> str | None:
    """The nginx binary, or None."""
    return find_binary(*NGINX_CANDIDATES)


def address(index: int) -> str:
    """The loopback address of target `index` (up to 50,000 targets)."""
    return f"127.77.{index // 200}.{index % 200 + 1}"


class PageSet:
    """A few simulated servers (k positions, one engine) whose pages are padded to a size.

    Padding adds LoRA variants of the non-spec families, so a page carries the series per KiB
    of a real vLLM page (its histograms per adapter), not long lines; past 4 adapters a page
    gets more data-parallel engines instead (vLLM labels each rank's series). The pages
    alternate between the two adapter counts around the size, so their mean lands on it.
    """

    def __init__(self, count: int, *, k: int = 8, target_bytes: int = 100_000, seed: int = 0):
        self.servers = []
        for i in range(count):
            for engines in (1, 2, 4, 8):
                server = FakeServer(k=k, engines=engines, seed=seed + i,
                                    acceptance=0.6 + 0.03 * i, lora_adapters=MAX_ADAPTERS)
                server.simulate(2000 + 100 * i)
                if len(server.render()) >= target_bytes:
                    break
            server.lora_adapters = 0
            base = len(server.render())
            if base < target_bytes:
                server.lora_adapters = 1
                per_variant = max(1, len(server.render()) - base)
                wanted = (target_bytes - base) / per_variant
                low = math.floor(wanted)
                server.lora_adapters = low + (1 if (i + 0.5) / count < wanted - low else 0)
            self.servers.append(server)
    def render(self) -> list[bytes]:
        """The current pages."""
        return [server.render() for server in self.servers]

    def advance(self, drafts: int = 200) -> None:
        """Let traffic flow on every server."""
        for server in self.servers:
            server.simulate(drafts)


class NginxFleet:
    """nginx serving `size` targets at http://127.77.x.y:<port>/metrics, as a child process."""

    def __init__(self, size: int, *, pages: int = 10, k: int = 8, page_bytes: int = 160 * 1024):
        nginx = find_nginx()
        if nginx is None:
            raise Skip("nginx not found: apt-get install -y nginx (or nginx-light)")
        self.nginx = nginx
        self.size = size
        self.dir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
        # Started as root, nginx's workers drop to an unprivileged user that must read the pages.
        self.dir.chmod(0o755)
        self.pages = PageSet(pages, k=k, target_bytes=page_bytes)
        self.gzip = True  # .gz twins beside the pages: nginx answers gzip to who accepts it
        self.page_bytes = 0
        self.page_series = 0
        self.child: Child | None = None
        self.port = 0
        self.write_pages()
        for _attempt in range(3):
            self.port = _free_port_on(address(0))
            try:
                self._start()
                return
            except RuntimeError as exc:
                last = exc
        self.close()
        raise Skip(f"nginx did not start: {last}")

    # -- pages ---------------------------------------------------------------------------

    def set_gzip(self, on: bool) -> None:
        """Serve the pages gzipped to clients that accept it, or plain to all, as vLLM does."""
        self.gzip = on
        self.write_pages()

    def write_pages(self) -> None:
        """Write the current pages and, with `gzip`, their .gz twins (nginx gzip_static), else
        remove them; atomically."""
        root = self.dir / "pages"
        root.mkdir(mode=0o755, exist_ok=True)
        sizes, series = [], []
        for i, page in enumerate(self.pages.render()):
            series.append(sum(1 for line in page.splitlines() if line and line[:1] != b"#"))
            twins = [(f"page{i}.prom", page)]
            if self.gzip:
                twins.append((f"page{i}.prom.gz", gzip.compress(page, 6)))
            else:
                (root / f"page{i}.prom.gz").unlink(missing_ok=True)
            for name, body in twins:
                tmp = root / (name + ".tmp")
                tmp.write_bytes(body)
                tmp.chmod(0o644)
                os.replace(tmp, root / name)
            sizes.append(len(page))
        self.page_bytes = round(sum(sizes) / len(sizes))
        self.page_series = round(sum(series) / len(series))

    def advance(self, drafts: int = 200) -> None:
        """Grow every counter and rewrite the files."""
        self.pages.advance(drafts)
        self.write_pages()

    # -- targets -------------------------------------------------------------------------

    def url(self, index: int) -> str:
        """Target `index`'s metrics URL."""
        return f"http://{address(index)}:{self.port}/metrics"

    def urls(self, n: int) -> list[str]:
        """The first n targets' URLs."""
        if n > self.size:
            raise ValueError(f"fleet has {self.size} targets, asked for {n}")
        return [self.url(i) for i in range(n)]

    def host_ports(self, n: int) -> list[str]:
        """The first n targets as host:port (Prometheus static_configs)."""
        return [f"{address(i)}:{self.port}" for i in range(n)]

    # -- access log: scrapes counted by the server, the same way for every client ---------

    def requests_by(self, agent_prefix: str) -> int:
        """How many 200 answers nginx logged for user agents starting with agent_prefix."""
        count = 0
        with open(self.dir / "access.log", "rb") as log:
            for line in log:
                parts = line.split(b" ", 2)
                if len(parts) == 3 and parts[1] == b"200" and parts[2].startswith(
                    agent_prefix.encode()
                ):
                    count += 1
        return count

    # -- process -------------------------------------------------------------------------

    def _config(self) -> str:
        npages = len(self.pages.servers)
        listens = "\n".join(
            f"        listen {address(i)}:{self.port};" for i in range(self.size)
        )
        mapping = "\n".join(
            f"        {address(i)} page{i % npages}.prom;" for i in range(self.size)
        )
        d = self.dir
        return f"""
daemon off;
worker_processes 1;
worker_rlimit_nofile 65536;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 32768; }}
http {{
    client_body_temp_path {d}/tmp-body;
    proxy_temp_path {d}/tmp-proxy;
    fastcgi_temp_path {d}/tmp-fastcgi;
    uwsgi_temp_path {d}/tmp-uwsgi;
    scgi_temp_path {d}/tmp-scgi;
    log_format bench '$msec $status $http_user_agent';
    access_log {d}/access.log bench;
    types {{ }}
    default_type "{CONTENT_TYPE}";
    keepalive_timeout 120s;
    keepalive_requests 1000000;
    sendfile on;
    gzip_static on;
    gzip_vary on;
    map $server_addr $page {{
        default page0.prom;
{mapping}
    }}
    server {{
{listens}
        root {d}/pages;
        location = /metrics {{ try_files /$page =404; }}
    }}
}}
"""

    def _start(self) -> None:
        conf = self.dir / "nginx.conf"
        conf.write_text(self._config())
        (self.dir / "access.log").write_bytes(b"")
        child = Child(
            [self.nginx, "-p", str(self.dir), "-c", str(conf), "-e", str(self.dir / "error.log")],
            self.dir / "nginx.out",
        )
        last = self.size - 1
        try:
            wait_until(
                lambda: _connects(address(0), self.port) and _connects(address(last), self.port),
                15, "nginx", child.proc,
            )
        except RuntimeError as exc:
            child.stop()
            err = (self.dir / "error.log")
            detail = err.read_text(errors="replace")[-500:] if err.exists() else ""
            raise RuntimeError(f"{exc}; {detail.strip()}") from None
        self.child = child
        time.sleep(0.1)

    def close(self) -> None:
        """Stop nginx and remove the files."""
        if self.child is not None:
            self.child.stop()
            self.child = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> NginxFleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _free_port_on(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
