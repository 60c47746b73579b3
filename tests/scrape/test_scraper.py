"""The scraper against real loopback servers: every failure kind is data with a clear error."""

from __future__ import annotations

import asyncio
import datetime
import gzip
import ipaddress
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from exporter.config.model import TargetConfig, validate_config
from exporter.fakevllm import FakeServer, make_fake_app
from exporter.scrape.scraper import Scraper, ScrapeResult, make_session

PAGE = (
    b"# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n"
    b"# TYPE vllm:spec_decode_num_drafts counter\n"
    b'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
    b"# HELP vllm:spec_decode_num_draft_tokens Number of draft tokens.\n"
    b"# TYPE vllm:spec_decode_num_draft_tokens counter\n"
    b'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0\n'
    b"# HELP vllm:spec_decode_num_accepted_tokens Number of accepted tokens.\n"
    b"# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
    b'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 24.0\n'
)


def _target(url: str, **fields) -> TargetConfig:
    # Without the name filter's probes at first contact, which would add requests to what
    # these tests count: they are tested in test_namefilter.py.
    fields = {"name_filter": False} | fields
    return validate_config({"targets": [{"name": "t", "url": url} | fields]}).targets[0]


@pytest.fixture(params=["lean", "aiohttp"])
async def scraper(request):
    """Factory: `scraper(max_bytes=..., concurrency=...)`; every test runs on both client paths.

    `lean`: plain HTTP through our httptools client, TLS and proxies through aiohttp, as
    served; `aiohttp`: everything through the aiohttp session.
    """
    made = []

    def make(*, max_bytes: int = 16 * 1024 * 1024, concurrency: int = 8) -> Scraper:
        session = make_session(concurrency)
        made.append(Scraper(session, max_bytes=max_bytes, concurrency=concurrency,
                            lean=request.param == "lean"))
        return made[-1]

    yield make
    for scr in made:
        await scr.close()
        await scr.session.close()


async def _serve(aiohttp_server, handler, path: str = "/metrics", **kwargs):
    app = web.Application()
    app.router.add_get(path, handler)
    return await aiohttp_server(app, **kwargs)


async def _one_server_targets(aiohttp_server, handler, n: int) -> list:
    """`n` targets (t0, t1, ...) that all scrape one server answering with `handler`."""
    url = str((await _serve(aiohttp_server, handler)).make_url("/metrics"))
    return validate_config(
        {"targets": [{"name": f"t{i}", "url": url} for i in range(n)]}
    ).targets


class _RawServer:
    """An `asyncio` server whose connections end with it: on exit, a handler still running
    (one that never answers) is cancelled and its socket closed, so none is left for the
    loop's close to report."""

    def __init__(self, handle) -> None:
        self._handle = handle
        self._tasks: set[asyncio.Task] = set()
        self.server: asyncio.base_events.Server | None = None

    async def _serve(self, reader, writer) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        finally:
            writer.close()
            self._tasks.discard(task)

    async def __aenter__(self) -> _RawServer:
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()


async def _raw_server(handle) -> tuple[_RawServer, int]:
    raw = _RawServer(handle)
    raw.server = await asyncio.start_server(raw._serve, "127.0.0.1", 0)
    return raw, raw.server.sockets[0].getsockname()[1]


def _assert_failed(result: ScrapeResult, error: str) -> None:
    assert isinstance(result, ScrapeResult)
    assert result.ok is False and result.snapshot is None
    assert result.error is not None and error in result.error, result.error
    assert result.target == "t" and result.duration >= 0


async def _page(request: web.Request) -> web.Response:
    return web.Response(body=PAGE, content_type="text/plain")


class TestScrapeSuccess:
    async def test_page_parsed(self, aiohttp_server, scraper):
        server = await _serve(aiohttp_server, _page)
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 2.0,
                                        clock=lambda: 1234.0)
        assert result.ok and result.error is None
        assert result.at == 1234.0 and result.size == len(PAGE)
        totals = result.snapshot.totals()
        assert (totals.drafts, totals.draft_tokens, totals.accepted) == (10, 30, 24)

    async def test_gzip_decoded(self, aiohttp_server, scraper):
        seen = {}

        async def handler(request):
            seen["accept_encoding"] = request.headers.get("Accept-Encoding")
            return web.Response(body=gzip.compress(PAGE), headers={"Content-Encoding": "gzip"})

        server = await _serve(aiohttp_server, handler)
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 2.0)
        assert result.ok, result.error
        assert "gzip" in seen["accept_encoding"]
        assert result.size == len(PAGE)
        assert result.snapshot.totals().drafts == 10

    async def test_redirect_followed(self, aiohttp_server, scraper):
        async def moved(request):
            raise web.HTTPMovedPermanently("/real")

        app = web.Application()
        app.router.add_get("/metrics", moved)
        app.router.add_get("/real", _page)
        server = await aiohttp_server(app)
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 2.0)
        assert result.ok, result.error

    async def test_page_without_spec_decode_is_up(self, aiohttp_server, scraper):
        async def handler(request):
            return web.Response(text="# TYPE x counter\nx_total 1\n")

        server = await _serve(aiohttp_server, handler)
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 2.0)
        assert result.ok and not result.snapshot.has_spec_decode

    async def test_headers_and_bearer_token_reach_the_server(
        self, aiohttp_server, scraper, monkeypatch
    ):
        monkeypatch.setenv("SPECDEC_TEST_VLLM_KEY", "k3y")
        seen = {}

        async def handler(request):
            seen.update(request.headers)
            return await _page(request)

        server = await _serve(aiohttp_server, handler)
        target = _target(str(server.make_url("/metrics")), headers={"X-Tenant": "bench"},
                         token_env="SPECDEC_TEST_VLLM_KEY")
        result = await scraper().scrape(target, 2.0)
        assert result.ok, result.error
        assert seen["X-Tenant"] == "bench"
        assert seen["Authorization"] == "Bearer k3y"
        assert seen["User-Agent"].startswith("specdec-exporter/")
        assert "text/plain" in seen["Accept"]

    async def test_unset_token_env_sends_no_authorization(
        self, aiohttp_server, scraper, monkeypatch
    ):
        monkeypatch.delenv("SPECDEC_TEST_VLLM_KEY", raising=False)
        seen = {}

        async def handler(request):
            seen.update(request.headers)
            return await _page(request)

        server = await _serve(aiohttp_server, handler)
        target = _target(str(server.make_url("/metrics")), token_env="SPECDEC_TEST_VLLM_KEY")
        assert (await scraper().scrape(target, 2.0)).ok
        assert "Authorization" not in seen

    async def test_http_proxy_from_environment(self, aiohttp_server, scraper, monkeypatch):
        # A forward proxy sees the absolute URL of the target in the request line.
        asked = []

        async def proxy(request: web.Request) -> web.Response:
            asked.append(request.raw_path)
            return web.Response(body=PAGE)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", proxy)
        server = await aiohttp_server(app)
        for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "all_proxy",
                     "ALL_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.port}")
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{server.port}")
        scr = scraper()
        result = await scr.scrape(_target("http://vllm-behind-proxy.invalid:8000/metrics"), 2.0)
        assert result.ok, result.error
        assert asked == ["http://vllm-behind-proxy.invalid:8000/metrics"]

    async def test_no_proxy_from_environment(self, aiohttp_server, scraper, monkeypatch):
        proxied = []

        async def proxy(request: web.Request) -> web.Response:
            proxied.append(request.raw_path)
            return web.Response(status=502)

        proxy_app = web.Application()
        proxy_app.router.add_route("*", "/{tail:.*}", proxy)
        proxy_server = await aiohttp_server(proxy_app)
        target_server = await _serve(aiohttp_server, _page)
        for name in ("HTTPS_PROXY", "https_proxy", "all_proxy", "ALL_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy_server.port}")
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy_server.port}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        result = await scraper().scrape(_target(str(target_server.make_url("/metrics"))), 2.0)
        assert result.ok, result.error
        assert proxied == []


class TestScrapeFailures:
    async def test_connection_refused(self, scraper, unused_tcp_port):
        result = await scraper().scrape(_target(f"http://127.0.0.1:{unused_tcp_port}/metrics"), 2.0)
        _assert_failed(result, "connection failed: Connection refused")

    async def test_unknown_host(self, scraper):
        result = await scraper().scrape(_target("http://no-such-host.invalid:8000/metrics"), 5.0)
        _assert_failed(result, "connection failed: ")

    async def test_hang_is_a_timeout(self, scraper):
        async def never_answer(reader, writer):
            await asyncio.sleep(30)

        server, port = await _raw_server(never_answer)
        async with server:
            result = await scraper().scrape(_target(f"http://127.0.0.1:{port}/metrics"), 0.3)
        assert result.error == "timeout after 0.3s"
        _assert_failed(result, "timeout")
        # Answered by our timeout, long before the server would have (30 s).
        assert 0.3 <= result.duration < 30

    async def test_slow_body_beyond_timeout(self, aiohttp_server, scraper):
        async def dribble(request):
            response = web.StreamResponse(headers={"Content-Length": str(len(PAGE))})
            await response.prepare(request)
            for byte in PAGE:
                await response.write(bytes([byte]))
                await asyncio.sleep(0.05)
            return response

        server = await _serve(aiohttp_server, dribble)
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 0.4)
        assert result.error == "timeout after 0.4s"
        assert result.duration < len(PAGE) * 0.05  # cut off before the page could finish

    @pytest.mark.parametrize(
        ("status", "error"),
        [(500, "HTTP 500 Internal Server Error"), (404, "HTTP 404 Not Found"),
         (503, "HTTP 503 Service Unavailable"), (401, "HTTP 401 Unauthorized")],
    )
    async def test_http_status(self, aiohttp_server, scraper, status, error):
        async def handler(request):
            return web.Response(status=status, text=PAGE.decode())

        server = await _serve(aiohttp_server, handler)
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 2.0)
        assert result.error == error
        _assert_failed(result, error)

    async def test_redirect_loop(self, aiohttp_server, scraper):
        async def loop(request):
            raise web.HTTPMovedPermanently("/metrics")

        server = await _serve(aiohttp_server, loop)
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 2.0)
        assert result.error == "too many redirects"

    @pytest.mark.parametrize(
        "body",
        [
            b"<html><head><title>Login</title></head><body>sign in</body></html>",
            b"<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>",
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)),
            b"abc\x00\x01\x02\xff\xfe" * 50,
            bytes(range(128, 256)) * 8,
            b'{"error": "not here"}',
            b"Not Found\n",
            b"Service temporarily unavailable, try later\n",
        ],
        ids=["html", "doctype", "png", "nul-bytes", "not-utf8", "json", "text-404", "text-503"],
    )
    async def test_not_exposition(self, aiohttp_server, scraper, body):
        async def handler(request):
            return web.Response(body=body)

        server = await _serve(aiohttp_server, handler)
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 2.0)
        assert result.error == "response is not Prometheus text format"
        _assert_failed(result, "Prometheus")

    @pytest.mark.parametrize(
        "body",
        [b"", b"\n", b"# HELP x y\n# TYPE x gauge\nx 1\n", b"up 1\n", b'x{a="b"} NaN\n',
         b"x +Inf 123\n", b"x_total -1.5e+06\n"],
    )
    async def test_plain_exposition_is_not_garbage(self, aiohttp_server, scraper, body):
        async def handler(request):
            return web.Response(body=body)

        server = await _serve(aiohttp_server, handler)
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 2.0)
        assert result.ok, result.error

    async def test_over_size_with_content_length(self, aiohttp_server, scraper):
        body = b"# " + b"x" * 5000 + b"\n"

        async def handler(request):
            return web.Response(body=body)

        server = await _serve(aiohttp_server, handler)
        result = await scraper(max_bytes=2048).scrape(
            _target(str(server.make_url("/metrics"))), 2.0
        )
        assert result.error == f"response of {len(body)} bytes is over the 2048 byte cap"

    async def test_over_size_chunked(self, aiohttp_server, scraper):
        seen = {}

        async def handler(request):
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            seen["chunked"] = response.chunked
            for _ in range(50):
                await response.write(b"# " + b"x" * 998 + b"\n")
            return response

        server = await _serve(aiohttp_server, handler)
        result = await scraper(max_bytes=4096).scrape(
            _target(str(server.make_url("/metrics"))), 2.0
        )
        assert seen["chunked"] is True
        assert result.error == "response is over the 4096 byte cap"

    async def test_over_size_after_gunzip(self, aiohttp_server, scraper):
        # The cap is on the page, not on the wire: a small gzip of a huge page is refused.
        async def handler(request):
            body = gzip.compress(b"# " + b"x" * 200_000 + b"\n")
            return web.Response(body=body, headers={"Content-Encoding": "gzip"})

        server = await _serve(aiohttp_server, handler)
        result = await scraper(max_bytes=4096).scrape(
            _target(str(server.make_url("/metrics"))), 2.0
        )
        assert result.error == "response is over the 4096 byte cap"

    async def test_body_cut_off(self, scraper):
        async def cut(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                         b"Content-Length: 5000\r\n\r\n" + PAGE)
            await writer.drain()
            writer.close()

        server, port = await _raw_server(cut)
        async with server:
            result = await scraper().scrape(_target(f"http://127.0.0.1:{port}/metrics"), 2.0)
        assert result.error == (
            "body cut off or corrupt: Not enough data to satisfy content length header "
            f"(received {len(PAGE)} of 5000 bytes)."
        )

    async def test_chunked_body_cut_off(self, scraper):
        async def cut(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            chunk = PAGE[:40]
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
            writer.close()

        server, port = await _raw_server(cut)
        async with server:
            result = await scraper().scrape(_target(f"http://127.0.0.1:{port}/metrics"), 2.0)
        _assert_failed(result, "body cut off or corrupt: ")

    async def test_server_closes_before_answering(self, scraper):
        async def close(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.close()

        server, port = await _raw_server(close)
        async with server:
            result = await scraper().scrape(_target(f"http://127.0.0.1:{port}/metrics"), 2.0)
        _assert_failed(result, "Server disconnected")

    async def test_corrupt_gzip(self, aiohttp_server, scraper):
        async def handler(request):
            return web.Response(body=b"\x1f\x8b\x08\x00" + b"not deflate at all" * 10,
                                headers={"Content-Encoding": "gzip"})

        server = await _serve(aiohttp_server, handler)
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 2.0)
        assert result.error == "body cut off or corrupt: Can not decode content-encoding: gzip"

    async def test_one_line_error(self, aiohttp_server, scraper, unused_tcp_port):
        result = await scraper().scrape(_target(f"http://127.0.0.1:{unused_tcp_port}/m"), 2.0)
        assert "\n" not in result.error and len(result.error) <= 320


class TestConcurrency:
    async def test_bound_respected(self, aiohttp_server, scraper):
        in_flight = {"now": 0, "max": 0}

        async def handler(request):
            in_flight["now"] += 1
            in_flight["max"] = max(in_flight["max"], in_flight["now"])
            await asyncio.sleep(0.1)
            in_flight["now"] -= 1
            return await _page(request)

        targets = await _one_server_targets(aiohttp_server, handler, 7)
        scr = scraper(concurrency=2)
        results = await asyncio.gather(*(scr.scrape(t, 5.0) for t in targets))
        assert all(r.ok for r in results)
        assert in_flight["max"] == 2

    async def test_waiting_for_a_slot_is_not_timed(self, aiohttp_server, scraper):
        # Time queued behind the bound does not eat into a target's timeout.
        async def handler(request):
            await asyncio.sleep(0.2)
            return await _page(request)

        targets = await _one_server_targets(aiohttp_server, handler, 4)
        scr = scraper(concurrency=1)
        results = await asyncio.gather(*(scr.scrape(t, 0.5) for t in targets))
        assert [r.error for r in results] == [None] * 4


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key: via `cryptography`, else `openssl`, else skip."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor openssl is available")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
             "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))
    return cert, key


@pytest.fixture
async def https_server(aiohttp_server, tmp_path):
    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = await _serve(aiohttp_server, _page, ssl=context)
    return server, cert


class TestTls:
    async def test_self_signed_without_verify(self, https_server, scraper):
        server, _ = https_server
        url = str(server.make_url("/metrics"))
        assert url.startswith("https://")
        result = await scraper().scrape(_target(url, tls_verify=False), 2.0)
        assert result.ok, result.error

    async def test_self_signed_with_its_ca_file(self, https_server, scraper):
        server, cert = https_server
        target = _target(str(server.make_url("/metrics")), ca_file=str(cert))
        result = await scraper().scrape(target, 2.0)
        assert result.ok, result.error

    async def test_self_signed_refused_by_default(self, https_server, scraper):
        server, _ = https_server
        result = await scraper().scrape(_target(str(server.make_url("/metrics"))), 2.0)
        _assert_failed(result, "TLS certificate not trusted: ")
        assert "self-signed" in result.error or "verify failed" in result.error


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(families: dict, family: str, name: str, labels: dict) -> float | None:
    for sample in families[family].samples:
        if sample.name == name and sample.labels == labels:
            return sample.value
    return None


class TestFailingTargetInService:
    async def test_failure_is_data_everywhere(self, exporter, fake_vllm, unused_tcp_port):
        fake = await fake_vllm(k=2)
        down_url = f"http://127.0.0.1:{unused_tcp_port}/metrics"
        exp = await exporter({"targets": [
            {"name": "good", "url": fake.url},
            {"name": "down", "url": down_url, "labels": {"zone": "z1"}},
        ]})
        await exp.round()
        await exp.round()  # never raises, however often a target fails
        body = await (await exp.client.get("/metrics")).text()
        families = _families(body)
        down = {"target": "down", "zone": "z1"}
        assert _sample(families, "specdec_target_up", "specdec_target_up", down) == 0.0
        assert _sample(families, "specdec_target_up", "specdec_target_up", {"target": "good"}) == 1
        assert _sample(
            families, "specdec_scrape_errors", "specdec_scrape_errors_total", down
        ) == 2.0
        assert _sample(
            families, "specdec_scrape_errors", "specdec_scrape_errors_total", {"target": "good"}
        ) == 0.0

        targets = {t["name"]: t for t in (await (await exp.client.get("/api/v1/targets")).json())
                   ["targets"]}
        assert targets["down"]["up"] is False
        assert targets["down"]["last_error"] == "connection failed: Connection refused"
        assert targets["down"]["errors_total"] == 2
        assert targets["down"]["last_error_at"] is not None
        assert targets["good"]["last_error"] is None

        page = await (await exp.client.get("/")).text()
        assert "connection failed: Connection refused" in page

    async def test_recovers_and_keeps_last_error(self, exporter, fake_vllm):
        fake = await fake_vllm(k=2)
        port = fake.http.port
        exp = await exporter({"targets": [{"name": "flap", "url": fake.url}]})
        await fake.stop()
        await exp.round()
        assert exp.service.view().targets["flap"].up is False
        # Same port again, a fresh server: up again, the error is kept for the record.
        again = TestServer(make_fake_app(FakeServer(k=2)), port=port)
        await again.start_server()
        try:
            await exp.round()
            state = exp.service.view().targets["flap"]
            assert state.up is True and state.errors_total == 1
            assert state.last_error == "connection failed: Connection refused"
        finally:
            await again.close()

    async def test_timeout_uses_target_timeout(self, exporter, aiohttp_server):
        async def slow(request):
            await asyncio.sleep(5)
            return web.Response(body=PAGE)

        server = await _serve(aiohttp_server, slow)
        exp = await exporter({"scrape_interval": "10s", "scrape_timeout": "5s", "targets": [
            {"name": "slow", "url": str(server.make_url("/metrics")), "timeout": "200ms"},
        ]})
        await exp.round()
        assert exp.service.view().targets["slow"].last_error == "timeout after 0.2s"



class TestProxyPlan:
    """Proxies are worked out once per target and config, never per request."""

    @staticmethod
    def _clear_proxy_env(monkeypatch) -> None:
        for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "all_proxy",
                     "ALL_PROXY", "HTTP_PROXY", "http_proxy"):
            monkeypatch.delenv(name, raising=False)

    @staticmethod
    async def _proxy(aiohttp_server, seen: list):
        async def proxy(request: web.Request) -> web.Response:
            seen.append((request.raw_path, request.headers.get("Proxy-Authorization")))
            return web.Response(body=PAGE)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", proxy)
        return await aiohttp_server(app)

    async def test_environment_read_once_per_config(self, aiohttp_server, scraper, monkeypatch):
        first, second = [], []
        proxy_a = await self._proxy(aiohttp_server, first)
        proxy_b = await self._proxy(aiohttp_server, second)
        self._clear_proxy_env(monkeypatch)
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy_a.port}")
        scr = scraper()
        target = _target("http://vllm-behind-proxy.invalid:8000/metrics")
        assert (await scr.scrape(target, 2.0)).ok
        # The environment changes under a running exporter: the same config keeps its proxy...
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy_b.port}")
        assert (await scr.scrape(target, 2.0)).ok
        assert len(first) == 2 and second == []
        # ...and a reload works it out again.
        scr.reconfigure(max_bytes=scr.max_bytes, concurrency=8)
        assert (await scr.scrape(target, 2.0)).ok
        assert len(first) == 2 and len(second) == 1

    async def test_target_proxy_url_with_credentials(self, aiohttp_server, scraper, monkeypatch):
        seen = []
        proxy = await self._proxy(aiohttp_server, seen)
        self._clear_proxy_env(monkeypatch)
        target = _target("http://vllm-behind-proxy.invalid:8000/metrics",
                         proxy_url=f"http://user:pw@127.0.0.1:{proxy.port}")
        result = await scraper().scrape(target, 2.0)
        assert result.ok, result.error
        assert seen == [("http://vllm-behind-proxy.invalid:8000/metrics", "Basic dXNlcjpwdw==")]

    async def test_target_proxy_url_beats_no_proxy(self, aiohttp_server, scraper, monkeypatch):
        seen = []
        proxy = await self._proxy(aiohttp_server, seen)
        self._clear_proxy_env(monkeypatch)
        monkeypatch.setenv("NO_PROXY", "*")
        target = _target("http://vllm-behind-proxy.invalid:8000/metrics",
                         proxy_url=f"http://127.0.0.1:{proxy.port}")
        assert (await scraper().scrape(target, 2.0)).ok
        assert [path for path, _ in seen] == ["http://vllm-behind-proxy.invalid:8000/metrics"]


class TestConnectionsAndCompression:
    async def test_one_connection_reused_across_scrapes(self, aiohttp_server, scraper):
        peers = []

        async def handler(request):
            peers.append(request.transport.get_extra_info("peername"))
            return await _page(request)

        server = await _serve(aiohttp_server, handler)
        scr = scraper()
        target = _target(str(server.make_url("/metrics")))
        for _ in range(4):
            assert (await scr.scrape(target, 2.0)).ok
        assert len(peers) == 4 and len(set(peers)) == 1

    async def test_idle_connection_closed_by_server_is_retried(self, scraper):
        # uvicorn drops idle kept-alive connections after 5 s: a scrape that lands on one just
        # as it closes must open a new one, not fail.
        connections = []

        async def answer_once(reader, writer):
            connections.append(writer)
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE) + PAGE)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")  # the next request on this connection...
            writer.close()  # ...is dropped unanswered

        server, port = await _raw_server(answer_once)
        async with server:
            scr = scraper()
            target = _target(f"http://127.0.0.1:{port}/metrics")
            first = await scr.scrape(target, 2.0)
            second = await scr.scrape(target, 2.0)
        assert first.ok and second.ok, (first.error, second.error)
        assert len(connections) == 2

    @pytest.mark.parametrize(("compression", "asked"), [("gzip", "gzip"), ("none", "identity")])
    async def test_compression_option(self, aiohttp_server, scraper, compression, asked):
        seen = []

        async def handler(request):
            seen.append(request.headers.get("Accept-Encoding"))
            if "gzip" in request.headers.get("Accept-Encoding", ""):
                return web.Response(body=gzip.compress(PAGE),
                                    headers={"Content-Encoding": "gzip"})
            return await _page(request)

        server = await _serve(aiohttp_server, handler)
        target = _target(str(server.make_url("/metrics")), compression=compression)
        result = await scraper().scrape(target, 2.0)
        assert result.ok, result.error
        assert seen == [asked] and result.size == len(PAGE)

    async def test_redirect_to_another_server(self, aiohttp_server, scraper):
        real = await _serve(aiohttp_server, _page, path="/real")

        async def moved(request):
            raise web.HTTPFound(str(real.make_url("/real")))

        first = await _serve(aiohttp_server, moved)
        result = await scraper().scrape(_target(str(first.make_url("/metrics"))), 2.0)
        assert result.ok, result.error
        assert result.snapshot.totals().drafts == 10

    async def test_body_without_length_ends_at_close(self, scraper):
        async def until_close(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAGE)
            await writer.drain()
            writer.close()

        server, port = await _raw_server(until_close)
        async with server:
            result = await scraper().scrape(_target(f"http://127.0.0.1:{port}/metrics"), 2.0)
        assert result.ok, result.error
        assert result.size == len(PAGE)

    async def test_not_http_at_all(self, scraper):
        async def garbage(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"SSH-2.0-OpenSSH_9.2\r\n" + bytes(range(256)))
            await writer.drain()
            await asyncio.sleep(0.5)
            writer.close()

        server, port = await _raw_server(garbage)
        async with server:
            result = await scraper().scrape(_target(f"http://127.0.0.1:{port}/metrics"), 2.0)
        assert result.ok is False and result.error and "\n" not in result.error


class TestCredentialsAndRedirects:
    """Authorization and configured headers never cross an origin, as curl and Go's client
    behave; a redirect within the origin keeps them."""

    async def _two_servers(self, aiohttp_server, same_origin: bool):
        seen: list[dict] = []

        async def real(request):
            seen.append(dict(request.headers))
            return await _page(request)

        app = web.Application()
        app.router.add_get("/real", real)
        other = await aiohttp_server(app)

        async def moved(request):
            if same_origin:
                raise web.HTTPFound("/real")
            raise web.HTTPFound(str(other.make_url("/real")))

        app = web.Application()
        app.router.add_get("/metrics", moved)
        app.router.add_get("/real", real)
        first = await aiohttp_server(app)
        assert first.port != other.port
        return first, seen

    @pytest.mark.parametrize("auth", ["token_env", "userinfo"])
    async def test_cross_origin_redirect_drops_credentials(self, aiohttp_server, scraper,
                                                            monkeypatch, auth):
        monkeypatch.setenv("SCRAPE_TOKEN", "scrape-secret-123")
        first, seen = await self._two_servers(aiohttp_server, same_origin=False)
        url = str(first.make_url("/metrics"))
        fields: dict = {"headers": {"X-Api-Key": "custom-secret-456"}}
        if auth == "token_env":
            fields["token_env"] = "SCRAPE_TOKEN"
        else:
            url = url.replace("http://", "http://user:pass-789@")
        result = await scraper().scrape(_target(url, **fields), 2.0)
        assert result.ok, result.error
        assert len(seen) == 1
        assert "Authorization" not in seen[0] and "X-Api-Key" not in seen[0], seen[0]
        assert seen[0]["Accept"].startswith("text/plain")  # the request itself still whole

    async def test_same_origin_redirect_keeps_them(self, aiohttp_server, scraper, monkeypatch):
        monkeypatch.setenv("SCRAPE_TOKEN", "scrape-secret-123")
        first, seen = await self._two_servers(aiohttp_server, same_origin=True)
        target = _target(str(first.make_url("/metrics")), token_env="SCRAPE_TOKEN",
                         headers={"X-Api-Key": "custom-secret-456"})
        result = await scraper().scrape(target, 2.0)
        assert result.ok, result.error
        assert seen[0]["Authorization"] == "Bearer scrape-secret-123"
        assert seen[0]["X-Api-Key"] == "custom-secret-456"


async def _all_closed(open_a: set, open_b: set, closed_a: asyncio.Queue,
                      closed_b: asyncio.Queue) -> None:
    """Wait until the servers' handlers saw every connection close (none left to the GC)."""
    while open_a:
        await asyncio.wait_for(closed_a.get(), 10)
    while open_b:
        await asyncio.wait_for(closed_b.get(), 10)


class TestKeptAliveSockets:
    """Sockets of the lean client are closed when their target leaves, or when idle too long,
    seen from a real server counting its open connections."""

    @staticmethod
    async def _counting_server():
        open_now: set = set()
        closed = asyncio.Queue()

        async def serve(reader, writer):
            open_now.add(writer)
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE)
                                 + PAGE)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            open_now.discard(writer)
            writer.close()
            await closed.put(writer)

        server, port = await _raw_server(serve)
        return server, port, open_now, closed

    async def test_forget_closes_sockets_of_removed_targets(self):
        server, port, open_now, closed = await self._counting_server()
        other, other_port, other_open, other_closed = await self._counting_server()
        async with server, other:
            scr = Scraper(make_session(4), max_bytes=1 << 20, concurrency=4)
            try:
                gone = _target(f"http://127.0.0.1:{port}/metrics")
                kept = _target(f"http://127.0.0.1:{other_port}/metrics")
                assert (await scr.scrape(gone, 2.0)).ok and (await scr.scrape(kept, 2.0)).ok
                assert len(open_now) == 1 and len(other_open) == 1
                scr.forget([kept])
                await asyncio.wait_for(closed.get(), 10)
                assert len(open_now) == 0 and len(other_open) == 1
            finally:
                await scr.close()
                await scr.session.close()
                await _all_closed(open_now, other_open, closed, other_closed)

    async def test_idle_sockets_expire(self):
        server, port, open_now, closed = await self._counting_server()
        other, other_port, other_open, other_closed = await self._counting_server()
        async with server, other:
            scr = Scraper(make_session(4), max_bytes=1 << 20, concurrency=4)
            try:
                assert (await scr.scrape(_target(f"http://127.0.0.1:{port}/metrics"), 2.0)).ok
                assert len(open_now) == 1
                scr._pool.idle_timeout = 0.0  # every idle socket is now past its time
                assert (await scr.scrape(_target(f"http://127.0.0.1:{other_port}/m"), 2.0)).ok
                await asyncio.wait_for(closed.get(), 10)
                assert len(open_now) == 0
            finally:
                await scr.close()
                await scr.session.close()
                await _all_closed(open_now, other_open, closed, other_closed)
