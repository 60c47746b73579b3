"""Where `compare` and `advise` read a window from: an exporter's API or a result folder
(a window's, `measure`'s or AISBench's: one `performances/spec_decode_*.json` per server)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.analysis.compare import summed_result
from exporter.client import ClientError, ExporterClient
from exporter.core.errors import ExporterError

MAX_FILE_BYTES = 16 * 1024 * 1024


class SourceError(ExporterError):
    """A window or folder that cannot be read."""


@dataclass(frozen=True)
class Source:
    """One side of a comparison: where it came from and its answer-shaped body."""

    label: str  # "window w1 on http://..." or the folder path
    answer: dict[str, Any]  # {"results": {name: RESULT}, "aggregate": RESULT or None, ...}


class ExporterSourceError(SourceError):
    """The exporter unreachable or refusing (README's exit code 1 where it applies)."""


def load_source(spec: str, exporter: str | None, token: str | None) -> Source:
    """A stopped window's answer from `exporter`'s API, or (without one) a result folder."""
    if not exporter:
        return load_folder(Path(spec))
    try:
        client = ExporterClient(exporter, token=token, timeout=30)
        state = client.get(spec)
    except ClientError as exc:
        raise ExporterSourceError(f"window {spec!r}: {exc}") from None
    if state.get("stopped_at") is None or "results" not in state:
        raise SourceError(f"window {spec!r} on {client.url} is still open; stop it first")
    return Source(f"window {spec} on {client.url}", state)


def _label(result: dict[str, Any], path: Path) -> str:
    """Our files by the target's config name, as a window on the exporter names it;
    AISBench's (no `target`) by host:port (`align_names` lets the two meet)."""
    target = result.get("target")
    if isinstance(target, str) and target:
        return target
    return _address(result) or path.stem.removeprefix("spec_decode_")


def _address(result: dict[str, Any]) -> str | None:
    """The server's host:port, from our `host_port` or AISBench's `url`."""
    host_port = result.get("host_port")
    if isinstance(host_port, str) and host_port:
        return host_port
    url = result.get("url")
    if isinstance(url, str) and url:
        return re.sub(r"^https?://", "", url).rstrip("/").removesuffix("/metrics")
    return None


def align_names(a: Source, b: Source) -> tuple[Source, Source]:
    """A server named by its config name on one side and by host:port on the other (AISBench's
    files) meets under its config name on both."""
    ra, rb = a.answer["results"], b.answer["results"]
    only_b = {_address(r): n for n, r in rb.items() if n not in ra}
    rename_a: dict[str, str] = {}
    rename_b: dict[str, str] = {}
    for name_a, result in ra.items():
        address = _address(result)
        name_b = only_b.get(address) if name_a not in rb and address else None
        if name_b is None:
            continue
        # The config name, where one side has it (neither is taken on the other side).
        name = name_b if name_a == address else name_a
        rename_a[name_a], rename_b[name_b] = name, name
    return _renamed(a, rename_a), _renamed(b, rename_b)


def _renamed(source: Source, names: dict[str, str]) -> Source:
    if not names:
        return source
    results = {names.get(n, n): r for n, r in source.answer["results"].items()}
    return Source(source.label, source.answer | {"results": results})


def load_folder(folder: Path) -> Source:
    """Every `spec_decode_*.json` of a result folder (or of its `performances/` itself)."""
    if not folder.is_dir():
        raise SourceError(f"{folder}: no such directory (to compare window ids, give "
                          "--exporter URL)")
    directory = folder / "performances" if (folder / "performances").is_dir() else folder
    files = sorted(directory.glob("spec_decode_*.json"))
    if not files:
        raise SourceError(f"{folder}: no performances/spec_decode_*.json in it")
    results: dict[str, dict[str, Any]] = {}
    for path in files:
        result = _read_result(path)
        name = _label(result, path)
        if name in results:
            name = path.stem.removeprefix("spec_decode_")
        results[name] = result
    _one_window(folder, results)
    answer = {"results": results, "aggregate": summed_result(results)}
    return Source(str(folder), answer | _timed_block(directory.parent / "window.json"))


def _timed_block(path: Path) -> dict[str, Any]:
    """The `per_request` block of our window.json beside the files (its timings: the paired
    speed-up), {} without one (AISBench's folders, a folder of files alone)."""
    try:
        written = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    block = written.get("per_request") if isinstance(written, dict) else None
    return {"per_request": block} if isinstance(block, dict) else {}


def _one_window(folder: Path, results: dict[str, dict[str, Any]]) -> None:
    """SourceError unless the files' [first, last] scrape spans overlap, as one window's do."""
    spans = [(r["first_scrape_at"], r["last_scrape_at"], name) for name, r in results.items()
             if isinstance(r.get("first_scrape_at"), int | float)
             and isinstance(r.get("last_scrape_at"), int | float)]
    if not spans:
        return  # AISBench's own files carry no scrape times
    latest_start = max(spans)
    earliest_end = min(spans, key=lambda span: span[1])
    if latest_start[0] > earliest_end[1]:
        raise SourceError(f"{folder}: its files come from different windows ({earliest_end[2]} "
                          f"ended before {latest_start[2]} began); give one run's folder")


def _read_result(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise SourceError(f"{path}: larger than {MAX_FILE_BYTES} bytes; not a result file")
        result = json.loads(path.read_bytes())
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise SourceError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(result, dict) or "status" not in result:
        raise SourceError(f"{path}: not a spec-decode result (no \"status\")")
    if result.get("status") == "ok" and not isinstance(result.get("data"), dict):
        raise SourceError(f"{path}: status ok without a \"data\" object")
    rates = (result.get("data") or {}).get("per_position_acceptance_rates") or {}
    if not isinstance(rates, dict) or not all(
        re.fullmatch(r"[0-9]{1,4}", str(pos)) and isinstance(rate, int | float)
        and not isinstance(rate, bool) and math.isfinite(rate)
        for pos, rate in rates.items()
    ):
        raise SourceError(f"{path}: per_position_acceptance_rates must map positions "
                          "0..9999 to finite numbers")
    return result
