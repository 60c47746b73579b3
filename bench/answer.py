"""`python -m bench.answer [N] [--repeats R]`: the CPU of one stop answer (`AnswerParts`).

A stopped window over N targets is built in-process, without any server: each target is fed
the parsed pages of one of the fleet's simulated vLLM servers (k = 8, one engine, as
`bench.fleet` serves them) at its start, three rounds and its stop. A few targets take the
other paths of a RESULT (a failed start, a failed stop, a removal, a restart). Then only
`AnswerParts(window, ADVICE).answer()` is timed, R times; the median is printed with its cost
per target and a digest of the answer's JSON text (key order included), so that a run of this
file against another checkout (an older commit's `exporter` and `bench.fleet`) shows whether
both give the same answer:

    PYTHONSAFEPATH=1 PYTHONPATH=<other checkout> python bench/answer.py 1000

Beside it, in the same run, `json.loads` of that answer's text: the C parser building the
same objects, a floor for Python code that builds them; the answer's two texts encoded whole
by orjson; and a stop's whole work (`stop_work`, as its child runs it) fed the stop scrapes:
its CPU while they come in (each RESULT, its advice, their texts and its file) and after the
last one (the tail the stop waits for).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fleet import PageSet
from exporter.core.parse import parse_page
from exporter.core.snapshot import ScrapeResult, Snapshot
from exporter.core.stopanswer import AnswerParts
from exporter.core.window import TargetRef, Window
from exporter.server.stop import ADVICE, END, FINAL, ResultCodec, stop_work
from exporter.state.answertext import compact, indented

T0 = 1796234400.0  # 2026-12-02T18:00:00Z
INTERVAL = 5.0
PAGES = 10
ROUNDS = 3  # between the start and the stop
# Every EVERY-th target takes one of the other paths, by its index modulo EVERY.
EVERY = 100
START_FAILS, STOP_FAILS, REMOVED, RESTARTS = 1, 2, 3, 4


def _snapshots(steps: int) -> list[list[Snapshot]]:
    """Per step (start, rounds, stop), the parsed page of each simulated server."""
    pages = PageSet(PAGES, k=8, target_bytes=0)  # no padding: only the spec-decode part counts
    steps_pages = []
    for step in range(steps):
        if step:
            pages.advance()
        steps_pages.append([parse_page(page) for page in pages.render()])
    return steps_pages


def build_window(n: int) -> Window:
    """A stopped window over n targets with realistic accumulators."""
    window, finals, stop = open_window(n)
    for result in finals:
        window.take_stop_scrape(result)
    window.stopped_at = stop
    return window


def open_window(n: int) -> tuple[Window, list[ScrapeResult], float]:
    """An open window over n targets with realistic accumulators, its stop scrapes and time."""
    steps = _snapshots(ROUNDS + 2)
    names = [f"t{i}" for i in range(n)]
    window = Window(
        id="bench-answer", name="bench", labels={"run": "bench"}, started_at=T0,
        targets={
            name: TargetRef(name, f"http://127.77.{i // 200}.{i % 200 + 1}:9000/metrics",
                            f"127.77.{i // 200}.{i % 200 + 1}:9000")
            for i, name in enumerate(names)
        },
    )

    def results(step: int, at: float) -> list[ScrapeResult]:
        out = []
        for i, name in enumerate(names):
            snapshot = steps[step][i % PAGES]
            if i % EVERY == RESTARTS and step == 2:
                # A server restart: counters from zero, then growing again.
                snapshot = Snapshot({k: v / 10 for k, v in snapshot.values.items()},
                                    {k: v + 1 for k, v in snapshot.created.items()},
                                    snapshot.gauges, snapshot.dialect)
            failed = (step == 0 and i % EVERY == START_FAILS) or (
                step == ROUNDS + 1 and i % EVERY == STOP_FAILS)
            out.append(ScrapeResult(name, at, 0.01, None if failed else snapshot,
                                    "timeout" if failed else None))
        return out

    window.take_baseline(results(0, T0))
    for step in range(1, ROUNDS + 1):
        for result in results(step, T0 + step * INTERVAL):
            if window.takes_scrapes_of(result.target):
                window.feed(result)
        if step == 1:
            for i, name in enumerate(names):
                if i % EVERY == REMOVED:
                    window.removed[name] = "removed from the config"
    stop = T0 + (ROUNDS + 1) * INTERVAL
    return window, results(ROUNDS + 1, stop), stop


def measure(n: int, repeats: int) -> dict[str, Any]:
    """Median seconds of a stop answer over `repeats` runs, and the answer's digest."""
    window = build_window(n)
    # Warm: first-call costs (imports, caches) left out.
    answer = AnswerParts(window, ADVICE).answer()
    digest = hashlib.sha256(json.dumps(answer).encode()).hexdigest()[:16]
    times = []
    for _ in range(repeats):
        gc.collect()  # each run starts from the same heap: the collections it triggers are its own
        started = time.perf_counter()
        AnswerParts(window, ADVICE).answer()
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    encodes = []
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        indented(answer)
        compact(answer)
        encodes.append(time.perf_counter() - started)
    text = json.dumps(answer)
    loads = []
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        json.loads(text)
        loads.append(time.perf_counter() - started)
    work, tail = stop_work_cpu(n, repeats)
    return {"targets": n, "repeats": repeats, "median_s": median,
            "per_target_ms": 1000 * median / n, "min_s": min(times), "digest": digest,
            "json_loads_median_s": statistics.median(loads),
            "texts_median_s": statistics.median(encodes),
            "stop_work_cpu_s": work, "stop_tail_cpu_s": tail}


def stop_work_cpu(n: int, repeats: int) -> tuple[float, float]:
    """Median CPU seconds of a stop's work over n targets: while its stop scrapes come in,
    and after the last one."""
    works, tails = [], []
    for _ in range(repeats):
        window, finals, stop = open_window(n)
        codec = ResultCodec()  # a stop's: each page's keys sent once
        messages = [(FINAL, codec.pack(result)) for result in finals]
        marks: list[float] = []
        with tempfile.TemporaryDirectory() as directory:
            gc.collect()
            stop_work(window, Path(directory))(_timed_inbox(messages, (END, stop, {}), marks))
            marks.append(time.process_time())
        works.append(marks[1] - marks[0])
        tails.append(marks[2] - marks[1])
    return statistics.median(works), statistics.median(tails)


def _timed_inbox(messages: list[Any], end: Any, marks: list[float]) -> Any:
    """`messages`, then `end`: the CPU time marked before the first and after the last."""
    marks.append(time.process_time())
    yield from messages
    marks.append(time.process_time())
    yield end


def main(argv: list[str] | None = None) -> int:
    """Build, time, print one line."""
    parser = argparse.ArgumentParser(prog="python -m bench.answer", description=__doc__.split(
        "\n")[0])
    parser.add_argument("targets", nargs="?", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    figures = measure(args.targets, args.repeats)
    print(f"stop answer over {figures['targets']} targets: median {figures['median_s']:.4f} s "
          f"({figures['per_target_ms']:.4f} ms per target, min {figures['min_s']:.4f} s, "
          f"{figures['repeats']} runs); answer digest {figures['digest']}; json.loads of "
          f"the same answer: median {figures['json_loads_median_s']:.4f} s; its two texts "
          f"(window.json indented, the API's compact) by orjson: median "
          f"{figures['texts_median_s']:.4f} s; a stop's work (its child's), CPU: "
          f"{figures['stop_work_cpu_s']:.4f} s while its scrapes come in, "
          f"{figures['stop_tail_cpu_s']:.4f} s after the last")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
