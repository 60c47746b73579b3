"""gzip/deflate inflate on every installed backend: the page back, a cap, corrupt and cut input."""

from __future__ import annotations

import gzip
import zlib

import pytest

from exporter.scrape.inflate import BACKENDS, InflateError, OverCapError, inflate

PAGE = b"".join(b'vllm:spec_decode_num_drafts_total{engine="%d"} %d.0\n' % (i, i * 7)
                for i in range(2000))


@pytest.fixture(params=sorted(BACKENDS))
def backend(request) -> str:
    return request.param


class TestInflate:
    def test_gzip_page_back(self, backend):
        assert inflate(gzip.compress(PAGE), len(PAGE), backend=backend) == PAGE

    def test_deflate_page_back(self, backend):
        assert inflate(zlib.compress(PAGE), len(PAGE), gzip=False, backend=backend) == PAGE

    def test_over_cap_is_refused_without_expanding(self, backend):
        bomb = gzip.compress(b"\0" * 50_000_000)
        with pytest.raises(OverCapError):
            inflate(bomb, 4096, backend=backend)

    def test_exactly_the_cap_is_fine(self, backend):
        assert inflate(gzip.compress(PAGE), len(PAGE), backend=backend) == PAGE
        with pytest.raises(OverCapError):
            inflate(gzip.compress(PAGE), len(PAGE) - 1, backend=backend)

    @pytest.mark.parametrize("body", [b"\x1f\x8b\x08\x00" + b"not deflate at all" * 10,
                                      b"plain text", b""], ids=["corrupt", "not-gzip", "empty"])
    def test_corrupt(self, backend, body):
        with pytest.raises(InflateError):
            inflate(body, 1 << 20, backend=backend)

    def test_cut_off(self, backend):
        whole = gzip.compress(PAGE)
        with pytest.raises(InflateError):
            inflate(whole[: len(whole) // 2], 1 << 20, backend=backend)
