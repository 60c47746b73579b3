"""`demo`: simulated spec-decode servers plus the exporter over them, all in this process."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time

from aiohttp import web

from exporter.config.model import Config, TargetConfig
from exporter.core.console import format_window
from exporter.core.errors import ListenError
from exporter.fakevllm import FakeServer, make_fake_app
from exporter.server.targets import TargetState
from exporter.web.app import make_app
from exporter.web.handlers import SERVICE


def demo_fleet() -> list[tuple[str, FakeServer, float]]:
    """(name, server, drafts per second): k 3 to 5, two engines, ngram, no spec decode."""
    return [
        ("llama-eagle-k3", FakeServer(k=3, acceptance=0.85, seed=1), 40.0),
        ("qwen-mtp-k5-dp2", FakeServer(k=5, acceptance=0.75, engines=2,
                                       model_name="Qwen/Qwen3-8B", seed=2), 60.0),
        ("ngram-k4", FakeServer(k=4, acceptance=0.6, ngram=True,
                                model_name="meta-llama/Llama-3.1-8B", seed=3), 30.0),
        ("no-spec-decode", FakeServer(spec_decode=False, seed=4), 0.0),
    ]


def _why_no_figures(state: TargetState) -> str:
    if state.last_error:
        return state.last_error
    snapshot = state.last.snapshot if state.last else None
    if snapshot is not None and not snapshot.has_spec_decode:
        return "no spec-decode series on this server"
    return "no spec-decode activity yet"


def _live_table(app: web.Application) -> str:
    view = app[SERVICE].view()
    lines = [f"{'target':<18}{'up':<5}{'rate %':>8}{'length':>8}  per-position"]
    for name, state in view.targets.items():
        span = view.live[name].over_span(view.now)
        if span is None or span.drafts <= 0:
            figures = f"{'–':>8}{'–':>8}  " + _why_no_figures(state)
        else:
            per_pos = ", ".join(
                f"{p}: {span.per_position[p] / span.drafts:.2f}" for p in sorted(span.per_position)
            )
            figures = (f"{100 * span.accepted / span.draft_tokens:>8.2f}"
                       f"{1 + span.accepted / span.drafts:>8.2f}  {{{per_pos}}}")
        lines.append(f"{name:<18}{'yes' if state.up else 'no':<5}{figures}")
    return "\n".join(lines)


async def run_demo(port: int, duration: float | None, output_dir: str | None) -> None:
    """Serve the fleet and the exporter; print live figures; record one window; keep serving."""
    fleet = demo_fleet()
    runners = []
    targets = []
    for name, server, drafts_per_second in fleet:
        runner = web.AppRunner(make_fake_app(server, drafts_per_second=drafts_per_second),
                               access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()  # a free port, taken as it is found
        runners.append(runner)
        member_port = runner.addresses[0][1]
        targets.append(TargetConfig(name=name, url=f"http://127.0.0.1:{member_port}/metrics",
                                    labels={"demo": "true"}))
    # Without --output-dir the results go to a temporary folder that leaves with the demo.
    out = output_dir or tempfile.mkdtemp(prefix="specdec-demo-")
    config = Config(listen=f"127.0.0.1:{port}", scrape_interval=1.0, scrape_timeout=1.0,
                    live_window=10.0, output_dir=out, targets=targets)
    app = make_app(config)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    runners.append(runner)
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    except OSError as exc:
        await _cleanup(runners, None if output_dir else out)
        raise ListenError(f"127.0.0.1:{port}", exc, "--port P") from None
    kept = "" if output_dir else " (a temporary folder, removed at exit; --output-dir to keep)"
    print(f"specdec-exporter demo: exporter on http://127.0.0.1:{port}/ "
          f"(metrics at /metrics), {len(fleet)} simulated servers, results in {out}{kept}",
          flush=True)
    started = time.monotonic()
    window_length = min(10.0, max(3.0, (duration or 30.0) / 2 - 2))
    try:
        await asyncio.sleep(2.5)
        print(_live_table(app), "\n", flush=True)
        service = app[SERVICE]
        _, window = await service.start_window(name="demo")
        print(f"window {window.id} started; recording {window_length:g}s of traffic", flush=True)
        await asyncio.sleep(window_length)
        window = await service.stop_window(window.id)
        assert window.answer is not None, "a stopped window has its answer"
        print(format_window(window.answer), flush=True)
        print(f"results written to {out}/{window.id}/", flush=True)
        while duration is None or (left := duration - (time.monotonic() - started)) > 0:
            await asyncio.sleep(5.0 if duration is None else min(5.0, left))
            print(_live_table(app), "\n", flush=True)
    finally:
        await _cleanup(runners, None if output_dir else out)


async def _cleanup(runners: list[web.AppRunner], temporary: str | None) -> None:
    for runner in reversed(runners):
        with contextlib.suppress(Exception):
            await runner.cleanup()
    if temporary is not None:
        shutil.rmtree(temporary, ignore_errors=True)
