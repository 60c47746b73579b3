"""gzip/deflate bodies inflated with the fastest zlib-compatible backend installed, capped.

`isal` (Intel ISA-L) inflates a ~118 KB vLLM page about twice as fast as the stdlib's zlib
(`python -m bench.profile` measures it); `zlib-ng` measured the same within noise. It is an
optional dependency (the `fast` extra): without it the stdlib's zlib does the same job slower.
"""

from __future__ import annotations

import zlib
from types import ModuleType

_fastest: ModuleType | None
try:
    from isal import isal_zlib

    _fastest = isal_zlib
except ImportError:  # pragma: no cover - depends on what is installed
    _fastest = None

BACKENDS: dict[str, ModuleType] = {"zlib": zlib}
if _fastest is not None:
    BACKENDS["isal"] = _fastest
BACKEND = "isal" if _fastest is not None else "zlib"


class InflateError(ValueError):
    """Not a valid (or a truncated) gzip/deflate stream."""


class OverCapError(ValueError):
    """The inflated body is bigger than the cap."""


def inflate(body: bytes, cap: int, *, gzip: bool = True, backend: str = BACKEND) -> bytes:
    """The inflated `body`, at most `cap` bytes (a small bomb is refused, not expanded)."""
    module = BACKENDS[backend]
    inflater = module.decompressobj(31 if gzip else 15)
    try:
        page: bytes = inflater.decompress(body, cap + 1)
    except module.error as exc:
        raise InflateError(str(exc)) from None
    if len(page) > cap:
        raise OverCapError(f"over {cap} bytes")
    if not inflater.eof:
        raise InflateError("stream ends early")
    return page


_installed = False


def use_fastest_zlib() -> None:
    """Let aiohttp (TLS and proxied scrapes, our gzip'd /metrics) use the same backend."""
    global _installed
    if _installed or _fastest is None:
        return
    import aiohttp

    if hasattr(aiohttp, "set_zlib_backend"):  # aiohttp >= 3.12
        aiohttp.set_zlib_backend(_fastest)
    _installed = True
