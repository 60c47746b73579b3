"""The server's event loop: uvloop when installed, unless `SPECDEC_EVENT_LOOP=asyncio`."""

from __future__ import annotations

import asyncio
import os


def loop_kind() -> str:
    """`uvloop` if it is installed and not opted out, else `asyncio`."""
    if os.environ.get("SPECDEC_EVENT_LOOP", "").strip().lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of `loop_kind()`."""
    if loop_kind() == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()
