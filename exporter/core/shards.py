"""Shards of one fleet, pure: who owns a target, and one answer from every shard's answer.

Ownership is rendezvous hashing on the target name (the shard with the highest score wins), so
going from N to N+1 shards moves only the ~1/(N+1) of the targets the new shard wins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.core.aisbench import Result, Status, aggregate, is_count, result_problem
from exporter.core.errors import StoreError, UnknownWindowError
from exporter.core.isotime import is_number, with_iso_times
from exporter.core.requestblock import merged_block
from exporter.core.snapshot import integral


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
    local: bool = False  # the shard that took the request: its answer heads the merged one
    refused: dict[str, str] = field(default_factory=dict)  # target -> why its result is not used

    @property
    def reason(self) -> str:
        """What the merged answer says of a shard that gave no answer."""
        if self.status is None:
            return f"shard {self.index} at {self.url} unreachable: {self.error}"
        return f"shard {self.index} at {self.url} answered {self.status}: {self.error}"


@dataclass(frozen=True)
class Asked:
    """A fanned-out call as its merge reads it: the fleet and what each shard was asked for."""

    shards: int
    fleet: dict[str, tuple[str, str]]  # every target of the fleet: name -> (url, host:port)
    shares: Mapping[int, list[str]]  # each shard's targets, for N/A when it gave no answer
    window_id: str | None = None
    query: Mapping[str, str] = field(default_factory=dict)  # checked by the shard asked first


# The most windows a list answers, on one shard and over the fleet.
MAX_LIST = 1000
# A fleet route's merge: every shard's part (a peer's not vetted yet) -> (status, one body).
Merge = Callable[[list[ShardPart], Asked], tuple[int, dict[str, Any]]]


def settle(parts: Sequence[ShardPart], asked: Asked) -> None:
    """A shard that could not save (503) keeps its window open and the caller retries
    (`StoreError`); a window no shard has is `UnknownWindowError`."""
    for part in parts:
        if part.status == 503 and asked.window_id is not None:  # not a list's
            raise StoreError(part.reason)
    if asked.window_id is not None and all(p.status == 404 for p in parts):
        raise UnknownWindowError(asked.window_id)


def _peers(parts: Sequence[ShardPart], vet: Callable[[ShardPart], None]) -> None:
    for part in parts:
        if not part.local and part.answer is not None:
            vet(part)


def merged_stop(parts: list[ShardPart], asked: Asked) -> tuple[int, dict[str, Any]]:
    """The fleet's stop answer (also a GET's once every shard stopped)."""
    _peers(parts, lambda part: vet_stop(part, asked.shards, asked.fleet))
    return 200, merge_stop(parts, asked)


def merged_window(parts: list[ShardPart], asked: Asked) -> tuple[int, dict[str, Any]]:
    """The fleet's GET of a window: its stop answer once every shard stopped it, else open."""
    if all("results" in p.answer for p in parts if p.answer is not None):
        return merged_stop(parts, asked)
    _peers(parts, lambda part: vet_open(part, asked.fleet))
    scrapes: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    targets: list[str] = []
    for part in parts:
        if part.answer is None:
            targets += asked.shares.get(part.index, [])
            errors |= dict.fromkeys(asked.shares.get(part.index, []), part.reason)
            continue
        targets += part.answer.get("targets", [])
        scrapes |= part.answer.get("scrapes") or {}
        errors |= part.answer.get("errors") or {}
    counted = {p.index: list(p.answer.get("targets", [])) for p in parts if p.answer}
    return 200, _with_per_request(_head(parts) | {
        "targets": targets, "stopped_at": None, "status": "open", "scrapes": scrapes,
        "errors": errors, "shards": _shards(parts, counted),
    }, parts, stopped=False)


def _shards(parts: Sequence[ShardPart], counted: Mapping[int, list[str]]) -> list[dict[str, Any]]:
    shards = []
    for p in parts:
        entry = {"shard": p.index, "url": p.url, "targets": counted.get(p.index, []),
                 "error": None if p.answer is not None else p.reason}
        if p.answer is not None and isinstance(p.answer.get("results_dir"), str):
            entry["results_dir"] = p.answer["results_dir"]  # each shard writes its own files
        if p.refused:
            entry["refused"] = dict(p.refused)
        shards.append(entry)
    return shards


# What a merged answer takes from a peer's head (`_head`): never its `results_dir` or the rest.
_HEAD_KEYS = ("id", "name", "labels", "started_at", "started_at_iso", "stopped_at",
              "stopped_at_iso", "status")


def _head(parts: Sequence[ShardPart]) -> dict[str, Any]:
    """The merged answer's own keys: the requested shard's answer, else the first peer's."""
    answers = [p.answer for p in parts if p.answer is not None]
    local = [p.answer for p in parts if p.local and p.answer is not None]
    if local:
        return dict(local[0])
    return {k: answers[0][k] for k in _HEAD_KEYS if k in answers[0]} if answers else {}


# A window's shards start (and stop) it within one round of peer calls: a peer's time further
# than this from our own is not this window's.
SAME_WINDOW_SPAN = 60.0


def _time(parts: Sequence[ShardPart], key: str, *, earliest: bool) -> float | None:
    """The earliest start or latest stop of the shards; a peer's only near our own time."""
    times: list[float] = [t for p in parts if p.answer is not None
                          if is_number(t := p.answer.get(key))]
    mine = [p.answer for p in parts if p.local and p.answer is not None]
    if mine:
        own = mine[0].get(key)
        if not is_number(own):
            return None
        times = [t for t in times if abs(t - own) <= SAME_WINDOW_SPAN]
    if not times:
        return None
    return min(times) if earliest else max(times)


def merged_start(parts: list[ShardPart], asked: Asked) -> tuple[int, dict[str, Any]]:
    """The fleet's start answer, 201 when any shard opened the window: every shard's targets,
    the earliest start, and who could not start."""
    _peers(parts, lambda part: vet_open(part, asked.fleet))
    opened = any(p.status == 201 for p in parts if p.answer is not None)
    targets = [t for p in parts for t in (p.answer["targets"] if p.answer
                                           else asked.shares.get(p.index, []))]
    counted = {p.index: list(p.answer["targets"]) for p in parts if p.answer}
    start_errors = {k: v for p in parts if p.answer
                    for k, v in (p.answer.get("start_errors") or {}).items()}
    body = _head(parts) | {
        "targets": targets,
        "started_at": _time(parts, "started_at", earliest=True),
        "start_errors": start_errors,
        "shards": _shards(parts, counted),
    }
    errors = {f"shard {p.index}": p.reason for p in parts if p.answer is None}
    return 201 if opened else 200, body | ({"errors": errors} if errors else {})


def merged_delete(parts: list[ShardPart], asked: Asked) -> tuple[int, dict[str, Any]]:
    """The fleet's delete: 409 naming the shards where the window is still open; a 404 is
    fine; an unreachable shard (it still holds the window) is in `errors`."""
    still_open = [p for p in parts if p.status == 409]
    if still_open:
        return 409, {"error": "; ".join(p.reason for p in still_open)}
    errors = {f"shard {p.index}": p.reason for p in parts
              if p.answer is None and p.status != 404}
    body: dict[str, Any] = {"id": asked.window_id, "deleted": True}
    return 200, body | ({"errors": errors} if errors else {})


def merge_stop(parts: Sequence[ShardPart], asked: Asked) -> dict[str, Any]:
    """One stop answer: every target's RESULT, the aggregate recomputed from the counts; a
    target two shards report (it moved between them) keeps the answer that counted it."""
    results: dict[str, dict[str, Any]] = {}
    counted: dict[int, list[str]] = {}
    for part in parts:
        for name, result in (part.answer or {}).get("results", {}).items():
            if name in results and results[name].get("status") == Status.OK:
                continue
            results[name] = dict(result) | {"shard": part.index}
            if result.get("status") == Status.OK:
                counted.setdefault(part.index, []).append(name)
    for part in parts:
        if part.answer is None:
            for name in asked.shares.get(part.index, []):  # N/A, saying why
                url, host_port = asked.fleet.get(name, (None, None))
                na = Result(Status.NA, url, part.reason, target=name, host_port=host_port)
                results.setdefault(name, na.to_json() | {"shard": part.index})
    merged_aggregate = aggregate((n, Result.from_json(r)) for n, r in results.items())
    first = _head(parts)
    # Each shard's advice covers its own targets only: the caller advises over the whole.
    first.pop("advice", None)
    body = first | {
        "targets": list(results),
        "started_at": _time(parts, "started_at", earliest=True),
        "stopped_at": _time(parts, "stopped_at", earliest=False),
        "results": results,
        "aggregate": merged_aggregate.to_json(),
        "shards": _shards(parts, counted),
    }
    return _with_per_request(body, parts, stopped=True)


def _with_per_request(body: dict[str, Any], parts: Sequence[ShardPart], *,
                      stopped: bool) -> dict[str, Any]:
    """`body` with one `per_request` over every shard's proxied targets (each shard's blocks
    vetted already), made against the merged RESULTs once stopped; without, if none."""
    blocks: dict[str, Mapping[str, Any]] = {}
    for part in parts:
        per_request = (part.answer or {}).get("per_request")
        for name, block in (per_request or {}).get("targets", {}).items():
            blocks.setdefault(name, block)
    body = {k: v for k, v in body.items() if k != "per_request"}
    if blocks:
        body["per_request"] = merged_block(blocks, body if stopped else None)
    return body


def _distrust(part: ShardPart, why: str) -> None:
    """Use nothing of the part's answer: its targets come out N/A with `why`."""
    part.answer = None
    part.error = f"its answer is malformed: {why}"


def vet_stop(part: ShardPart, shards: int, fleet: Iterable[str]) -> None:
    """Keep of a peer's stop answer the RESULTs of the fleet's, counted ones only of its split
    (the rest: `part.refused`), `data` derived again; one malformed and none is used."""
    assert part.answer is not None
    results = part.answer.get("results")
    if not isinstance(results, Mapping):
        _distrust(part, "its results are not an object")
        return
    known = set(fleet)
    vetted: dict[str, Any] = {}
    for name, result in results.items():
        if (problem := result_problem(result)) is not None:
            _distrust(part, f"its result for {name!r:.80} {problem}")
            return
        if name not in known:
            part.refused[name] = "no such target in the fleet"
        elif result["status"] == Status.OK and (home := owner(name, shards)) != part.index:
            part.refused[name] = (f"counted by shard {part.index}, but the split gives it to "
                                  f"shard {home}")
        else:
            vetted[name] = dict(result) | {"data": Result.from_json(result).data()}
    part.answer = dict(part.answer) | {"results": vetted}
    vet_per_request(part, lambda name: name in vetted)


def vet_per_request(part: ShardPart, ours: Callable[[str], bool]) -> None:
    """Keep of a peer's `per_request` the blocks of targets whose answer it gave (`ours`)
    that read as a tally (`merged_block`); the others are refused with why."""
    assert part.answer is not None
    per_request = part.answer.get("per_request")
    if per_request is None:
        return
    targets = per_request.get("targets") if isinstance(per_request, Mapping) else None
    if not isinstance(targets, Mapping):
        part.answer = {k: v for k, v in part.answer.items() if k != "per_request"}
        part.refused["per_request"] = "its per-request figures are not an object"
        return
    kept: dict[str, Any] = {}
    for name, block in targets.items():
        if not isinstance(name, str) or not ours(name):
            part.refused[str(name)[:80]] = "per-request figures of a target it did not answer for"
            continue
        try:
            merged_block({name: block}, None)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            part.refused[name] = f"its per-request figures are malformed: {exc}"
            continue
        kept[name] = block
    part.answer = dict(part.answer) | {"per_request": {"targets": kept}}


def _names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _texts(value: object) -> bool:
    return value is None or (isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()))


def vet_open(part: ShardPart, fleet: Iterable[str]) -> None:
    """A peer's start answer or open window: targets of the fleet, scrapes counted, errors
    as text; anything else and none of it is used."""
    answer = part.answer
    assert answer is not None
    scrapes = answer.get("scrapes")
    if not _names(answer.get("targets")):
        _distrust(part, "its targets are not a list of names")
    elif scrapes is not None and not (isinstance(scrapes, Mapping)
                                      and all(is_count(v) for v in scrapes.values())):
        _distrust(part, "its scrapes are not counts")
    elif not (_texts(answer.get("errors")) and _texts(answer.get("start_errors"))):
        _distrust(part, "its errors are not texts")
    elif not is_number(answer.get("started_at")):
        _distrust(part, "its started_at is not a time")
    else:
        known = set(fleet)
        part.refused |= {n: "no such target in the fleet" for n in answer["targets"]
                         if n not in known}
        kept = [n for n in answer["targets"] if n in known]
        part.answer = dict(answer) | {"targets": kept}
        vet_per_request(part, set(kept).__contains__)


def _summary_problem(item: object) -> str | None:
    if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
        return "a window without an id"
    if item.get("state") not in ("open", "stopped") or not _names(item.get("targets")):
        return f"window {item['id']!r:.80}: state or targets malformed"
    figures = item.get("aggregate")
    if figures is not None and not (isinstance(figures, Mapping) and all(
            v is None or is_count(figures.get(k)) for k, v in figures.items() if k != "status")):
        return f"window {item['id']!r:.80}: aggregate malformed"
    return None


def vet_list(part: ShardPart) -> None:
    """A peer's window list: summaries of the shape `merged_list` reads, or none of it."""
    assert part.answer is not None
    windows = part.answer.get("windows")
    if not isinstance(windows, list):
        _distrust(part, "its windows are not a list")
        return
    for item in windows:
        if (problem := _summary_problem(item)) is not None:
            _distrust(part, problem)
            return


def _summed_figures(items: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One list item's aggregate figures from each shard's: counts summed, then divided."""
    figures = [i["aggregate"] for i in items if i.get("aggregate")]
    ok = [f for f in figures if f.get("status") == Status.OK]
    if not ok:
        return dict(figures[0]) if figures else None
    counts = [(f.get("num_drafts"), f.get("draft_tokens"), f.get("accepted_tokens")) for f in ok]
    known = [c for c in counts if all(is_count(n) for n in c)]
    drafts = sum(c[0] for c in known)
    body: dict[str, Any] = {"status": Status.OK.value, "num_drafts": integral(drafts),
                            "acceptance_rate": None, "acceptance_length": None}
    if len(known) == len(counts):
        tokens = sum(c[1] for c in known)
        accepted = sum(c[2] for c in known)
        body |= {"draft_tokens": integral(tokens), "accepted_tokens": integral(accepted),
                 "acceptance_rate": 100 * accepted / tokens if tokens else None,
                 "acceptance_length": 1 + accepted / drafts if drafts else None}
    return body


def merged_list(parts: list[ShardPart], asked: Asked) -> tuple[int, dict[str, Any]]:
    """The fleet's window list, newest first, at most `limit`: each id's summaries from every
    shard as one (open while open anywhere, figures from the summed counts), ISO times beside."""
    _peers(parts, vet_list)
    by_id: dict[str, list[Mapping[str, Any]]] = {}
    for part in parts:
        for item in (part.answer or {}).get("windows", []):
            by_id.setdefault(item["id"], []).append(item)
    windows: list[dict[str, Any]] = []
    for items in by_id.values():
        first = items[0]
        open_somewhere = any(i["state"] == "open" for i in items)
        stops: list[float] = [i["stopped_at"] for i in items if is_number(i.get("stopped_at"))]
        starts: list[float] = [i["started_at"] for i in items if is_number(i.get("started_at"))]
        windows.append({k: v for k, v in first.items() if not k.endswith("_at_iso")} | {
            "state": "open" if open_somewhere else "stopped",
            "targets": [t for i in items for t in i["targets"]],
            "started_at": min(starts, default=None),
            "stopped_at": None if open_somewhere else max(stops, default=None),
            "aggregate": _summed_figures(items),
        })
    windows.sort(key=lambda w: float(w["started_at"] or 0.0), reverse=True)
    limit = int(asked.query.get("limit") or MAX_LIST)
    return 200, with_iso_times({"windows": windows[:limit], "shards": _shards(parts, {})})


def merged_series(parts: list[ShardPart], asked: Asked) -> tuple[int, dict[str, Any]]:
    """The fleet's series of a window: each target's from the shard the split gives it to."""
    head = _head(parts)
    targets: dict[str, Any] = {}
    for part in parts:
        got = (part.answer or {}).get("targets")
        if part.answer is not None and not isinstance(got, Mapping):
            _distrust(part, "its series are not an object")
            continue
        for name, rows in (got or {}).items():
            if part.local or (home := owner(name, asked.shards)) == part.index:
                targets.setdefault(name, rows if isinstance(rows, list) else [])
            else:
                part.refused[name] = f"the split gives it to shard {home}"
    return 200, head | {"targets": targets,
                        "started_at": _time(parts, "started_at", earliest=True),
                        "stopped_at": _time(parts, "stopped_at", earliest=False),
                        "shards": _shards(parts, {})}
