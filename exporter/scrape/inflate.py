"""gzip/deflate bodies inflated, capped, with `isal` (Intel ISA-L) where installed, else zlib."""

from __future__ import annotations

import functools
import zlib
from types import ModuleType

BACKENDS: dict[str, ModuleType] = {"zlib": zlib}
try:
    from isal import igzip_lib, isal_zlib

    BACKENDS["isal"] = isal_zlib
    # isal's stub declares it an instance of Exception; it is the class.
    _ISAL_ERROR: type[Exception] = getattr(igzip_lib, "IsalError")  # noqa: B009
except ImportError:  # pragma: no cover - depends on what is installed
    pass
BACKEND = "isal" if "isal" in BACKENDS else "zlib"


class InflateError(ValueError):
    """Not a valid (or a truncated) gzip/deflate stream."""


class OverCapError(ValueError):
    """The inflated body is bigger than the cap."""


# What is asked for at a time when the inflated size is not known (as zlib's blocks grow).
_STEP = 64 * 1024


def inflate(body: bytes, cap: int, *, gzip: bool = True, backend: str = BACKEND) -> bytes:
    """The inflated `body`, at most `cap` bytes (a small bomb is refused, not expanded)."""
    if backend == "isal":
        page, eof = _inflate_isal(body, cap, gzip)
    else:
        module = BACKENDS[backend]
        inflater = module.decompressobj(31 if gzip else 15)
        try:
            page = inflater.decompress(body, cap + 1)
        except module.error as exc:
            raise InflateError(str(exc)) from None
        eof = inflater.eof
    if len(page) > cap:
        raise OverCapError(f"over {cap} bytes")
    if not eof:
        raise InflateError("stream ends early")
    return page


def _inflate_isal(body: bytes, cap: int, gzip: bool) -> tuple[bytes, bool]:
    """(the body, whether it ended) by ISA-L, which fills one buffer of the size asked for (first
    the gzip trailer's ISIZE: a wrong one costs only more steps, never more than the cap)."""
    flag = igzip_lib.DECOMP_GZIP if gzip else igzip_lib.DECOMP_ZLIB
    inflater = igzip_lib.IgzipDecompressor(flag=flag)
    stated = int.from_bytes(body[-4:], "little") + 1 if gzip and len(body) >= 18 else _STEP
    want, data = min(cap + 1, stated), body
    parts: list[bytes] = []
    size = 0
    try:
        while True:
            part = inflater.decompress(data, want)
            parts.append(part)
            size += len(part)
            if inflater.eof or size > cap or inflater.needs_input:
                break
            data, want = b"", min(cap + 1 - size, max(size, _STEP))
    except _ISAL_ERROR as exc:
        raise InflateError(str(exc)) from None
    return parts[0] if len(parts) == 1 else b"".join(parts), inflater.eof


@functools.cache  # once
def use_fastest_zlib() -> None:
    """Let aiohttp (TLS and proxied scrapes, our gzip'd /metrics) use the same backend."""
    import aiohttp

    if BACKEND == "isal" and hasattr(aiohttp, "set_zlib_backend"):  # aiohttp >= 3.12
        aiohttp.set_zlib_backend(BACKENDS["isal"])
