"""The state database's schema version (SQLite's `user_version`), and the one migration to it.
Version 1: every key present, accumulators in rows of their own written whole by the current
codec. Version 2: an open window's per-request tallies and edges in its row, a stopped one's
answer whole (`per_request`, `edges` and `results_dir` in it, taken from its `window.json`
where the handler had added them there). Version 3: every per-request block has its `timing`
(empty in a block written before timings were kept). Version 4: an accumulator's intervals by
load (`by_load`, its last `running` reading); what a row counted before is in the `unknown`
band. Older forms are rewritten once, in one transaction, so that no reader knows them."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter.core.counting import Accumulator
from exporter.core.errors import StoreError
from exporter.core.loadbands import UNKNOWN
from exporter.core.timing import Timings
from exporter.core.window import Window

log = logging.getLogger(__name__)

SCHEMA_VERSION = 4

# Keys added to a window's or an accumulator's row during version 0, as they were when absent.
_WINDOW_DEFAULTS: Mapping[str, Any] = {
    "accumulators": {}, "downtimes": [], "series": {}, "late_baselines": {}, "per_request": {},
    "edges": None}
# What version 1 added to a stop answer after its row was written (in `window.json` only).
_SPLICED = ("edges", "per_request")
_ACCUMULATOR_DEFAULTS: Mapping[str, Any] = {
    "dialect": "", "before": None, "reset_spans": [], "restart_times": [], "seen": [],
    "gauge_weighted": {}, "gauge_seconds": {}, "anomalies": [None, None, None],
    "by_load": {}, "running": None}
# What version 3 added to a round part.
_ROUND_DEFAULTS: Mapping[str, Any] = {"by_load": {}, "running": None}


def migrate(db: sqlite3.Connection, path: object) -> None:
    """Bring the open database `db` (of the file at `path`) to `SCHEMA_VERSION`; `StoreError`
    if it was written by a newer version (which this one cannot read)."""
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"state database {path} has schema version {version}, newer than this exporter's "
            f"{SCHEMA_VERSION}: run the newer exporter, or set another state_db")
    with db:
        db.execute("BEGIN IMMEDIATE")
        windows = _migrate_windows(db, Path(str(path)).parent)
        accumulators = _migrate_accumulators(db)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    if windows or accumulators:
        log.warning("state database migrated path=%s from_version=%d to_version=%d windows=%d "
                    "accumulators=%d", path, version, SCHEMA_VERSION, windows, accumulators)


def _migrate_windows(db: sqlite3.Connection, output_dir: Path) -> int:
    """Window rows in the current form, their accumulators moved to rows of their own (where
    the table has none for that target yet), a stopped one's answer completed from its files
    in `output_dir`; the number rewritten."""
    have = set(db.execute("SELECT window_id, target FROM accumulators").fetchall())
    changed = 0
    for window_id, raw in db.execute("SELECT id, doc FROM windows").fetchall():
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or all(k in doc for k in _WINDOW_DEFAULTS) and (
                    not doc["accumulators"]) and not _untimed(doc):
                continue  # current already, or unreadable (said when it is read)
            accumulators = {t: _current(a) for t, a in (doc.get("accumulators") or {}).items()}
            window = Window.from_dict(dict(_WINDOW_DEFAULTS) | doc | {"accumulators": {}})
        except (TypeError, ValueError, KeyError, AttributeError, IndexError):
            continue
        if window.answer is not None and "results_dir" not in window.answer:
            window.answer = _with_files(window.answer, output_dir / window.id)
        for block in _untimed({"answer": window.answer}):
            block["timing"] = Timings().answer()
        db.executemany("INSERT INTO accumulators (window_id, target, doc) VALUES (?, ?, ?)",
                       [(window_id, t, text) for t, text in accumulators.items()
                        if (window_id, t) not in have and window.is_open])
        db.execute("UPDATE windows SET doc=? WHERE id=?",
                   (json.dumps(window.to_dict()), window_id))
        changed += 1
    return changed


def _untimed(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-request blocks of a window row (its open tallies, its stop answer's) that have
    no `timing` yet."""
    answer = doc.get("answer")
    stopped = answer.get("per_request") if isinstance(answer, Mapping) else None
    blocks = list((doc.get("per_request") or {}).values())
    if isinstance(stopped, Mapping):
        blocks += [*(stopped.get("targets") or {}).values(), stopped.get("aggregate")]
    return [b for b in blocks if isinstance(b, dict) and "buckets" in b and "timing" not in b]


def _with_files(answer: dict[str, Any], directory: Path) -> dict[str, Any]:
    """A version 1 stop answer with what its `window.json` in `directory` added, and where that
    is; as it was when there is no such file (written elsewhere, or removed)."""
    try:
        written = json.loads((directory / "window.json").read_bytes())
    except (OSError, ValueError):
        return answer
    if not isinstance(written, dict) or written.get("id") != answer.get("id"):
        return answer
    added = {k: written[k] for k in _SPLICED if k in written}
    return answer | added | {"results_dir": str(directory.resolve())}


def _migrate_accumulators(db: sqlite3.Connection) -> int:
    """Accumulator rows written whole by the current codec (a round part folded in); the
    number rewritten."""
    rounds = {(w, t): raw for w, t, raw in db.execute(
        "SELECT window_id, target, doc FROM accumulator_rounds").fetchall()}
    changed = 0
    for window_id, target, raw in db.execute(
            "SELECT window_id, target, doc FROM accumulators").fetchall():
        try:
            data = json.loads(raw)
            if (window_id, target) in rounds:
                data["round"] = json.loads(rounds[window_id, target])
            text = _current(data)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError):
            continue  # unreadable: said when it is read
        if text != raw:
            db.execute("UPDATE accumulators SET doc=? WHERE window_id=? AND target=?",
                       (text, window_id, target))
            changed += 1
    db.execute("DELETE FROM accumulator_rounds")
    return changed


def _current(data: dict[str, Any]) -> str:
    """An accumulator's row, of any form version 0 wrote, as the current codec writes it."""
    if "series" in data:  # a row per series: key, value, created, increase, seen
        rows = data.pop("series")
        data |= {"last": [[k, v, c] for k, v, c, _, _ in rows if v is not None],
                 "increase": [[k, inc] for k, _, _, inc, _ in rows if inc is not None],
                 "seen": [[k, t] for k, _, _, _, t in rows if t is not None]}
    banded = "by_load" in data
    if isinstance(data.get("round"), dict):
        data["round"] = dict(_ROUND_DEFAULTS) | data["round"]
    acc = Accumulator.from_dict(dict(_ACCUMULATOR_DEFAULTS) | data)
    if not banded and acc.scrapes > 1:  # its intervals so far, read before the gauge was
        acc.by_load = {UNKNOWN: (acc.scrapes - 1, acc.totals(cached=False))}
    return acc.to_json()
