"""The API under bad input. Nothing crashes, nothing escapes, nobody gets in."""

from __future__ import annotations

import asyncio
import hmac
import io

import pytest

from exporter.web import handlers as api
from faults.checks import still_serving, value


async def _no_windows(exp) -> None:
    listing = await (await exp.client.get("/api/v1/windows")).json()
    assert listing["windows"] == []


class TestBodies:
    @pytest.mark.parametrize(
        ("body", "needle"),
        [
            (b"null", "JSON object"),
            (b'"a string"', "JSON object"),
            (b"\xff\xfe{}", "not valid JSON"),
            (b"[" * 30_000 + b"]" * 30_000, "not valid JSON"),  # nesting past the recursion limit
            (b'{"a": ' * 5_000 + b"1" + b"}" * 5_000, ""),
            (b'{"id": 5}', "id"),
            (b'{"id": null, "targets": [1]}', "targets.0"),
            (b'{"labels": {"a": 1}}', "labels.a"),
            (b'{"labels": ["a"]}', "labels"),
            (b'{"name": "' + b"n" * 300 + b'"}', "name must be at most"),
            (b'{"id": "x", "id": "../../etc"}', "id must be"),  # the last duplicate key wins
        ],
        ids=lambda v: repr(v)[:40] if isinstance(v, bytes) else None,
    )
    async def test_bad_bodies_are_400(self, exp, body, needle):
        response = await exp.client.post("/api/v1/windows", data=body,
                                         headers={"Content-Type": "application/json"})
        assert response.status == 400, await response.text()
        assert needle in (await response.json())["error"]
        await _no_windows(exp)
        await still_serving(exp.client)

    @pytest.mark.parametrize("path", ["/api/v1/windows", "/api/v1/windows/w/stop", "/-/reload"])
    async def test_one_megabyte_body_is_413(self, exp, path):
        # A file-like body: aiohttp warns that raw bytes this large block its loop.
        body = io.BytesIO(b"{" + b" " * (1024 * 1024) + b"}")
        response = await exp.client.post(path, data=body)
        assert response.status == 413
        assert "error" in await response.json()
        await _no_windows(exp)
        await still_serving(exp.client)


ODD_IDS = [
    "../../etc", "..", ".", ".hidden", "a/b", "a\\b", "/etc/passwd", "abc\n", "abc\r\n",
    "a\x00b", "ｗ１", "é", "w\u0301", "\u202ewindow", "w\u200b", "😀", "a" * 129, "", " ",
    "-flag", "a b", "%2e%2e",
]


class TestIds:
    @pytest.mark.parametrize("odd", ODD_IDS, ids=[repr(i) for i in ODD_IDS])
    async def test_odd_ids_are_refused(self, exp, odd, tmp_path):
        response = await exp.client.post("/api/v1/windows", json={"id": odd})
        assert response.status == 400, await response.text()
        assert "id must be" in (await response.json())["error"]
        await _no_windows(exp)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    @pytest.mark.parametrize(
        "path",
        ["..%2F..%2Fetc", "%2e%2e", "..%5C..", "a%00b", "%EF%BD%97", "abc%0A", "%F0%9F%98%80",
         "a" * 129, "%ff%fe"],
    )
    async def test_odd_ids_in_the_path(self, exp, path):
        for method, url in (("GET", f"/api/v1/windows/{path}"),
                            ("POST", f"/api/v1/windows/{path}/stop")):
            response = await exp.client.request(method, url)
            assert response.status in (400, 404), (url, await response.text())
            assert "error" in await response.json()
        await still_serving(exp.client)

    async def test_unicode_names_and_labels_round_trip(self, exp, target, tmp_path):
        name = "窗口 🚀 \u202eevil\u202c \x00 \"quoted\" <b>"
        labels = {"é": "ñ", "k": "😀" * 100}
        response = await exp.client.post(
            "/api/v1/windows", json={"id": "u1", "name": name, "labels": labels})
        assert response.status == 201
        target.counters.add(3, 6, [2, 1])
        answer = await (await exp.client.post("/api/v1/windows/u1/stop")).json()
        assert answer["name"] == name and answer["labels"] == labels
        assert (await exp.client.get("/")).status == 200
        written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json"))
        assert [str(p) for p in written] == [
            "out/u1/performances/" + f"spec_decode_127.0.0.1_{target.port}.json",
            "out/u1/window.json",
        ]


class TestManyWindows:
    async def test_ten_thousand_starts_hit_the_cap_with_429(self, exporter, target):
        exp = await exporter({"max_open_windows": 1000,
                              "targets": [{"name": "a", "url": target.url}]})
        statuses: list[int] = []

        async def opener(first: int) -> None:
            for n in range(first, 10_000, 50):
                response = await exp.client.post("/api/v1/windows",
                                                 json={"id": f"m{n}", "targets": []})
                statuses.append(response.status)
                if response.status == 429:
                    assert "max_open_windows=1000" in (await response.json())["error"]
                response.release()

        await asyncio.gather(*(opener(i) for i in range(50)))
        assert statuses.count(201) == 1000 and statuses.count(429) == 9000
        found = await still_serving(exp.client)
        assert value(found, "specdec_windows_open") == 1000
        await exp.round()  # a scrape round saves 1000 open windows
        opened = exp.service.book.open_windows()
        stop = await exp.client.post(f"/api/v1/windows/{opened[0].id}/stop")
        assert stop.status == 200
        again = await exp.client.post("/api/v1/windows", json={"id": "after", "targets": []})
        assert again.status == 201


class TestTokens:
    @pytest.fixture
    async def guarded(self, exporter, target, monkeypatch):
        monkeypatch.setenv("SPECDEC_FAULT_TOKEN", "s3cret-token")
        return await exporter({"auth": {"token_env": "SPECDEC_FAULT_TOKEN"},
                               "targets": [{"name": "a", "url": target.url}]})

    @pytest.mark.parametrize(
        "header",
        [None, "", "Bearer", "Bearer ", "bearer s3cret-token", "Basic czNjcmV0LXRva2Vu",
         "Bearer s3cret-toke", "Bearer s3cret-tokenX", "Bearer S3CRET-TOKEN",
         "Bearer  s3cret-token", "Bearer s3cret\u00e9token"],
    )
    async def test_missing_or_wrong_token_is_401_everywhere(self, guarded, header):
        headers = {} if header is None else {"Authorization": header}
        for path in ("/api/v1/windows", "/api/v1/windows/x/stop", "/-/reload"):
            response = await guarded.client.post(path, json={"id": "x"}, headers=headers)
            assert response.status == 401, (path, header)
            assert "token" in (await response.json())["error"]
        await _no_windows(guarded)

    async def test_non_utf8_header_bytes_are_401_not_500(self, guarded):
        reader, writer = await asyncio.open_connection(guarded.client.host, guarded.client.port)
        writer.write(b"POST /api/v1/windows HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                     b"Authorization: Bearer \xff\xfe\r\nConnection: close\r\n\r\n{}")
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        assert status_line.split()[1] in (b"400", b"401")
        await _no_windows(guarded)

    async def test_every_post_goes_through_one_constant_time_compare(self, guarded, monkeypatch):
        calls: list[tuple[bytes, bytes]] = []
        real = hmac.compare_digest

        def spy(a, b):
            calls.append((a, b))
            return real(a, b)

        monkeypatch.setattr(api.hmac, "compare_digest", spy)
        for header in ("", "Bearer x", "Bearer s3cret-tokeX", "Bearer " + "s" * 1000):
            response = await guarded.client.post("/api/v1/windows", json={},
                                                 headers={"Authorization": header})
            assert response.status == 401
        ok = await guarded.client.post("/api/v1/windows", json={"id": "ok"},
                                       headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status == 201
        # No shortcut on length or prefix: every token, right or wrong, reached compare_digest.
        assert len(calls) == 5
        assert all(expected == b"Bearer s3cret-token" for _, expected in calls)
