"""Shards of one fleet, pure: who owns a target, and one answer from every shard's answer.

Ownership is rendezvous (highest-random-weight) hashing on the target name: each shard scores
every name and the highest score wins, so going from N to N+1 shards moves only the ~1/(N+1)
of the targets the new shard wins, where `crc32 % N` would move almost all of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.analysis.advise import window_advice
from exporter.core.results import Result, Status, aggregate


def _score(shard: int, name: str) -> int:
    digest = hashlib.blake2b(f"{shard}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(name: str, shards: int) -> int:
    """The shard (0..shards-1) that scrapes the target called `name`."""
    if shards <= 1:
        return 0
    return max(range(shards), key=lambda shard: _score(shard, name))


def split(names: Iterable[str], shards: int) -> dict[int, list[str]]:
    """Every shard's share of `names`, in their order (shards without any get [])."""
    shares: dict[int, list[str]] = {shard: [] for shard in range(shards)}
    for name in names:
        shares[owner(name, shards)].append(name)
    return shares


@dataclass
class ShardPart:
    """One shard's part of a fanned-out call: its answer, or why there is none."""

    index: int
    url: str
    answer: dict[str, Any] | None = None
    status: int | None = None  # the HTTP status it answered, None when unreachable
    error: str | None = None
    expected: list[str] = field(default_factory=list)  # its targets, for N/A when it failed
    urls: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (url, host:port)

    @property
    def reason(self) -> str:
        """What the merged answer says of a shard that gave no answer."""
        if self.status is None:
            return f"shard {self.index} at {self.url} unreachable: {self.error}"
        return f"shard {self.index} at {self.url} answered {self.status}: {self.error}"


def _na(part: ShardPart, name: str) -> dict[str, Any]:
    url, host_port = part.urls.get(name, (None, None))
    result = Result(status=Status.NA, url=url, error=part.reason, target=name,
                    host_port=host_port)
    return result.to_json() | {"shard": part.index}


def _shards(parts: Sequence[ShardPart], counted: Mapping[int, list[str]]) -> list[dict[str, Any]]:
    shards = []
    for p in parts:
        entry = {"shard": p.index, "url": p.url, "targets": counted.get(p.index, []),
                 "error": None if p.answer is not None else p.reason}
        if p.answer is not None and "results_dir" in p.answer:
            entry["results_dir"] = p.answer["results_dir"]  # each shard writes its own files
        shards.append(entry)
    return shards


def merge_start(parts: Sequence[ShardPart]) -> dict[str, Any]:
    """One start answer: every shard's targets, the earliest start, and who could not start."""
    answered = [p for p in parts if p.answer is not None]
    first = answered[0].answer if answered and answered[0].answer else {}
    targets = [t for p in parts for t in (p.answer["targets"] if p.answer else p.expected)]
    counted = {p.index: list(p.answer["targets"]) for p in answered if p.answer}
    start_errors = {k: v for p in answered if p.answer
                    for k, v in (p.answer.get("start_errors") or {}).items()}
    body = dict(first) | {
        "targets": targets,
        "started_at": min((p.answer["started_at"] for p in answered if p.answer), default=None),
        "start_errors": start_errors,
        "shards": _shards(parts, counted),
    }
    errors = {f"shard {p.index}": p.reason for p in parts if p.answer is None}
    return body | ({"errors": errors} if errors else {})


def merge_delete(parts: Sequence[ShardPart], window_id: str) -> tuple[int, dict[str, Any]]:
    """(status, body) of a delete on every shard: 409 naming the shards where the window is
    still open (the others forgot it); a shard that never had it or forgot it before is fine;
    one that could not be reached is named under `errors` (it still holds the window)."""
    still_open = [p for p in parts if p.status == 409]
    if still_open:
        return 409, {"error": "; ".join(p.reason for p in still_open)}
    errors = {f"shard {p.index}": p.reason for p in parts
              if p.answer is None and p.status != 404}
    body: dict[str, Any] = {"id": window_id, "deleted": True}
    return 200, body | ({"errors": errors} if errors else {})


def merge_stop(parts: Sequence[ShardPart]) -> dict[str, Any]:
    """One stop answer: every target's RESULT, the aggregate recomputed from the counts.

    A shard that gave no answer makes its targets N/A with the reason; a target two shards
    report (it moved between them during the window) keeps the answer that counted it.
    """
    answered = [p for p in parts if p.answer is not None]
    results: dict[str, dict[str, Any]] = {}
    counted: dict[int, list[str]] = {}
    for part in answered:
        assert part.answer is not None
        for name, result in part.answer.get("results", {}).items():
            if name in results and results[name].get("status") == Status.OK:
                continue
            results[name] = dict(result) | {"shard": part.index}
            if result.get("status") == Status.OK:
                counted.setdefault(part.index, []).append(name)
    for part in parts:
        if part.answer is None:
            for name in part.expected:
                results.setdefault(name, _na(part, name))
    merged_aggregate = aggregate((n, Result.from_json(r)) for n, r in results.items())
    first = answered[0].answer if answered and answered[0].answer else {}
    stops = [p.answer.get("stopped_at") for p in answered if p.answer]
    body = dict(first) | {
        "targets": list(results),
        "started_at": min((p.answer["started_at"] for p in answered if p.answer), default=None),
        "stopped_at": max((s for s in stops if s is not None), default=None),
        "results": results,
        "aggregate": merged_aggregate.to_json(),
        "shards": _shards(parts, counted),
    }
    # Each shard's advice covers its own targets only: advise again over the merged whole.
    return body | {"advice": window_advice(body)}


def merge_open(parts: Sequence[ShardPart]) -> dict[str, Any]:
    """One open-window state: every shard's scrapes and errors, unreachable shards named."""
    answered = [p for p in parts if p.answer is not None]
    first = answered[0].answer if answered and answered[0].answer else {}
    scrapes: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    targets: list[str] = []
    for part in parts:
        if part.answer is None:
            targets += part.expected
            errors |= {name: part.reason for name in part.expected}
            continue
        targets += part.answer.get("targets", [])
        scrapes |= part.answer.get("scrapes") or {}
        errors |= part.answer.get("errors") or {}
    counted = {p.index: list(p.answer.get("targets", [])) for p in answered if p.answer}
    return dict(first) | {
        "targets": targets, "stopped_at": None, "status": "open", "scrapes": scrapes,
        "errors": errors, "shards": _shards(parts, counted),
    }
