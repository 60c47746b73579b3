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

    @pytest.mark.parametrize("stated", [0, 1, len(PAGE) - 1, len(PAGE) + 1, 0xFFFF_FFFF])
    def test_a_wrong_stated_size_is_refused_within_the_cap(self, backend, stated):
        # isal's first buffer is the size the gzip trailer states: a lie costs steps, never
        # a page other than zlib's answer or more than the cap.
        whole = gzip.compress(PAGE)
        lying = whole[:-4] + stated.to_bytes(4, "little")
        with pytest.raises(InflateError):
            inflate(lying, 1 << 20, backend=backend)
        with pytest.raises(OverCapError):
            inflate(lying, 4096, backend=backend)

    @pytest.mark.parametrize("size", [0, 1, 65_535, 65_536, 65_537, 300_000])
    def test_sizes_around_a_step(self, backend, size):
        page = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        assert inflate(gzip.compress(page), size, backend=backend) == page
        assert inflate(zlib.compress(page), size, gzip=False, backend=backend) == page
        if size:
            with pytest.raises(OverCapError):
                inflate(zlib.compress(page), size - 1, gzip=False, backend=backend)

