"""A real headless Chromium driven over the DevTools protocol (aiohttp's websocket client).

Debian's `chromium` package, started with the flags a CI box needs (no sandbox as root, no
GPU, nothing fetched from the network, a fresh profile), one page, a few CDP calls: load a URL
at a given viewport width, evaluate a script, take a screenshot. Nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

ARTIFACTS = Path(os.environ.get("SPECDEC_TEST_ARTIFACTS")
                 or Path(__file__).resolve().parent.parent / "test-artifacts")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-default-apps", "--hide-scrollbars", "--remote-debugging-port=0"]


def chromium_path() -> str:
    """Debian's chromium; skipped outside CI when absent, a failure under CI=true."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium missing in CI: scripts/test.sh installs Debian's chromium")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return path


class Browser:
    """One headless Chromium process and one page of it."""

    def __init__(self, profile: Path):
        self.profile = profile
        self.proc: asyncio.subprocess.Process | None = None
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def __aenter__(self) -> Browser:
        self.proc = await asyncio.create_subprocess_exec(
            chromium_path(), *FLAGS, f"--user-data-dir={self.profile}", "about:blank",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        endpoint = await asyncio.wait_for(self._devtools_port(), 60)
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://{endpoint}/json/list") as response:
            pages = [t for t in await response.json() if t["type"] == "page"]
        self.ws = await self.session.ws_connect(pages[0]["webSocketDebuggerUrl"],
                                                max_msg_size=64 * 1024 * 1024)
        await self.call("Page.enable")
        return self

    async def _devtools_port(self) -> str:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            if match := re.search(rb"DevTools listening on ws://([^/]+)/", line):
                return match.group(1).decode()
        raise AssertionError("chromium exited before opening its DevTools port")

    async def __aexit__(self, *exc: object) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one CDP command and return its result (events on the way are kept)."""
        assert self.ws is not None
        call_id = next(self.ids)
        await self.ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads((await asyncio.wait_for(self.ws.receive(), 60)).data)
            if message.get("id") == call_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return dict(message.get("result") or {})
            self.events.append(message)

    async def open(self, url: str, width: int, height: int = 900) -> None:
        """Load `url` in a viewport `width` px wide and wait for its load event."""
        await self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                        deviceScaleFactor=1, mobile=width < 600)
        self.events.clear()
        await self.call("Page.navigate", url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            assert self.ws is not None
            message = json.loads((await asyncio.wait_for(self.ws.receive(), 60)).data)
            self.events.append(message)

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression evaluated in the page."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def screenshot(self, name: str) -> Path:
        """A PNG of the whole page, saved under the test artefacts folder."""
        shot = await self.call("Page.captureScreenshot", format="png",
                               captureBeyondViewport=True)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        return path
