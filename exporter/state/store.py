"""Durable window state in SQLite."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from exporter.core.errors import StoreError
from exporter.state.schema import migrate
from exporter.state.wal import wal_damage

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS windows (
    id TEXT PRIMARY KEY,
    open INTEGER NOT NULL,
    started_at REAL NOT NULL,
    doc TEXT NOT NULL
)
"""
# Per window x target: `accumulators`, and `accumulator_rounds` (a row's round part, so that a
# round rewrites only those bytes; WITHOUT ROWID: one B-tree per row to update, not two).
_ACC_SCHEMA = """
CREATE TABLE IF NOT EXISTS {} (
    window_id TEXT NOT NULL,
    target TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (window_id, target)
){}
"""
_TABLES = {
    "windows": {"id", "open", "started_at", "doc"},
    "accumulators": {"window_id", "target", "doc"},
    "accumulator_rounds": {"window_id", "target", "doc"},
}
_ACC_TABLES = ("accumulators", "accumulator_rounds")  # per-target rows, which go with their window


# The page cache, KiB: what a round reads and writes fits; a stop's big answer is not kept.
STATE_CACHE_KIB = 384
# A stop's answer is a chain of overflow pages, each its own write to the WAL: fewer when big.
STATE_PAGE_SIZE = 8192


def connect_state(path: Path) -> sqlite3.Connection:
    """The state database's connection, without a statement cache: a cached statement keeps
    its last bound values (the last stop's megabytes of answer) until it runs again."""
    db = sqlite3.connect(path, cached_statements=0)
    db.execute(f"PRAGMA cache_size=-{STATE_CACHE_KIB}")
    return db


class StateStore:
    """Open and recent windows in one SQLite file; a corrupt file is moved aside, not lost.
    A commit survives the death of our process; with `sync=True` (a start, a stop) a power cut."""

    def __init__(self, path: Path, *,
                 connect: Callable[[Path], sqlite3.Connection] = connect_state):
        self.path = path
        self.connect = connect
        self.errors_total = 0  # failed writes and damage found: specdec_state_write_errors_total
        self._identity: tuple[tuple[int, int] | None, ...] = (None, None)
        self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.path.parent}: {exc.strerror or exc}") from exc
        self._check_wal()
        try:
            db = self._connect()
        except sqlite3.DatabaseError as exc:
            self.errors_total += 1
            aside = self._move_aside()
            log.error(
                "state database unreadable path=%s error=%s moved_to=%s: open windows it held "
                "are not restored; the file is kept for inspection", self.path, exc, aside,
            )
            try:
                db = self._connect()
            except sqlite3.DatabaseError as again:
                raise StoreError(f"cannot open state database {self.path}: {again}") from again
        self._identity = self._files()
        return db

    def _check_wal(self) -> None:
        # SQLite drops a log's frames after a bad one without a word: say so, and keep a copy.
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            damage = wal_damage(wal.read_bytes()) if wal.exists() else None
        except OSError as exc:
            damage = f"cannot read it: {exc.strerror or exc}"
        if damage is None:
            return
        self.errors_total += 1
        copy = wal.with_name(f"{wal.name}.damaged-{int(time.time() * 1000)}")
        with contextlib.suppress(OSError):
            shutil.copyfile(wal, copy)
        log.error(
            "state write-ahead log damaged path=%s error=%s copy=%s: what was committed after "
            "the damage is lost; windows it held restart from their last readable state",
            wal, damage, copy,
        )

    def _move_aside(self) -> Path:
        # The -wal and -shm files belong to the old file: a new database must not replay them.
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time() * 1000)}")
        try:
            for suffix in ("", "-wal", "-shm"):
                source = self.path.with_name(self.path.name + suffix)
                if source.exists():
                    os.replace(source, aside.with_name(aside.name + suffix))
        except OSError as exc:
            raise StoreError(
                f"state database {self.path} is unreadable and cannot be moved aside: "
                f"{exc.strerror or exc}"
            ) from exc
        return aside

    def _connect(self) -> sqlite3.Connection:
        db = self.connect(self.path)
        db.isolation_level = None  # autocommit: save() opens its own transactions
        try:
            # Check before writing anything, so a file moved aside is exactly what we found.
            (check,) = db.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
            for table, expected in _TABLES.items():
                columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if columns and columns != expected:
                    raise sqlite3.DatabaseError(
                        f"table {table} has columns {sorted(columns)}, expected {sorted(expected)}"
                    )
            db.execute(f"PRAGMA page_size={STATE_PAGE_SIZE}")  # a new, empty file only
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(_SCHEMA)
            db.execute(_ACC_SCHEMA.format("accumulators", ""))
            db.execute(_ACC_SCHEMA.format("accumulator_rounds", " WITHOUT ROWID"))
            for table, columns in _TABLES.items():  # every row readable, not just the pages
                keys = ", ".join(sorted(columns - {"doc"}))
                db.execute(f"SELECT {keys}, length(doc) FROM {table}").fetchall()
            migrate(db, self.path)
        except (sqlite3.DatabaseError, StoreError):
            db.close()
            raise
        return db

    def _files(self) -> tuple[tuple[int, int] | None, ...]:
        def ident(path: Path) -> tuple[int, int] | None:
            try:
                st = os.stat(path)
            except OSError:
                return None
            return st.st_dev, st.st_ino

        return ident(self.path), ident(self.path.with_name(self.path.name + "-wal"))

    def reopened(self) -> bool:
        """True (logged, counted) when our files were replaced under us: a fresh database is
        open, and the caller must write back what it holds."""
        now = self._files()
        db_gone = now[0] != self._identity[0]
        # Our WAL exists while we hold the database open; one gone or replaced loses commits.
        wal_gone = self._identity[1] is not None and now[1] != self._identity[1]
        if not db_gone and not wal_gone:
            return False
        self.errors_total += 1
        log.error(
            "state database deleted or replaced under the running exporter path=%s: "
            "opening a fresh one and writing back every window held in memory", self.path,
        )
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        self._db = self._open()
        return True

    def save(
        self,
        docs: Iterable[Mapping[str, Any]] = (),
        accumulators: Iterable[tuple[str, str, str]] = (),
        *,
        rounds: Iterable[tuple[str, str, str]] = (),
        sync: bool = False,
        stopped: Iterable[tuple[str, float, bytes]] = (),
    ) -> None:
        """Upsert window rows, whole accumulator rows and round parts in one transaction;
        `stopped`: stopped windows' rows encoded already (`answertext.stopped_row`)."""
        rows: list[tuple[str, int, float, str | bytes]] = [
            (d["id"], int(d["stopped_at"] is None), d["started_at"], json.dumps(d)) for d in docs]
        rows += [(window_id, 0, started_at, text) for window_id, started_at, text in stopped]
        accs, parts = list(accumulators), list(rounds)
        if not rows and not accs and not parts:
            return
        with self._transaction("save window state to", sync=sync) as db:
            # UTF-8 bytes stored as text: SQLite's JSON functions read it.
            db.executemany(
                "INSERT INTO windows (id, open, started_at, doc) "
                "VALUES (?, ?, ?, CAST(? AS TEXT)) "
                "ON CONFLICT(id) DO UPDATE SET open=excluded.open, doc=excluded.doc",
                rows,
            )
            # A stopped window is its answer: its accumulators leave the database.
            ended = [(r[0],) for r in rows if not r[1]]
            for table in _ACC_TABLES:
                db.executemany(f"DELETE FROM {table} WHERE window_id=?", ended)
            db.executemany(
                "INSERT OR REPLACE INTO accumulators (window_id, target, doc) VALUES (?, ?, ?)",
                accs,
            )
            db.executemany("DELETE FROM accumulator_rounds WHERE window_id=? AND target=?",
                           [a[:2] for a in accs])
            db.executemany(
                "INSERT OR REPLACE INTO accumulator_rounds (window_id, target, doc) "
                "VALUES (?, ?, ?)", parts,
            )
        if self._identity[1] is None:
            self._identity = self._files()  # the first commit creates the WAL

    def copy_from(self, other: StateStore) -> None:
        """Every row of `other` into this database, in one transaction (a moved state path)."""
        windows = other._query("SELECT id, open, started_at, doc FROM windows")
        accs = {t: other._query(f"SELECT window_id, target, doc FROM {t}") for t in _ACC_TABLES}
        with self._transaction("copy window state to") as db:
            db.executemany("INSERT OR REPLACE INTO windows VALUES (?, ?, ?, ?)", windows)
            for table, rows in accs.items():
                db.executemany(f"INSERT OR REPLACE INTO {table} VALUES (?, ?, ?)", rows)
        self.errors_total += other.errors_total

    def remove_files(self) -> None:
        """Close and delete this database's files (after `copy_from` moved its rows)."""
        self.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path.with_name(self.path.name + suffix))

    def delete(self, window_ids: Iterable[str]) -> None:
        """Forget windows (their rows only; result files are not ours to remove)."""
        ids = [(i,) for i in window_ids]
        with self._transaction("delete window state in") as db:
            for table in _ACC_TABLES:
                db.executemany(f"DELETE FROM {table} WHERE window_id=?", ids)
            db.executemany("DELETE FROM windows WHERE id=?", ids)

    def stopped_before(self, started_before: float) -> list[str]:
        """Ids of stopped windows started before that time (retention)."""
        rows = self._query(
            "SELECT id FROM windows WHERE open=0 AND started_at < ?", (started_before,)
        )
        return [r[0] for r in rows]

    def load_open(self) -> list[dict[str, Any]]:
        """Every window still open, oldest first; unreadable rows are logged and skipped."""
        rows = self._query("SELECT id, doc FROM windows WHERE open=1 ORDER BY started_at")
        docs = [doc for window_id, raw in rows if (doc := _readable(window_id, raw)) is not None]
        return [self._with_accumulators(doc) for doc in docs]

    def load(self, window_id: str, *, series: bool = True) -> dict[str, Any] | None:
        """One window by id, open or closed, with its series unless `series=False`; `StoreError`
        if its row is unreadable."""
        row = self._query(f"SELECT {_doc_column(series)} FROM windows WHERE id=?", (window_id,))
        if not row:
            return None
        doc = _readable(window_id, row[0][0])
        if doc is None:
            raise StoreError(f'window "{window_id}" state is unreadable in {self.path}')
        if not series:
            doc.pop("series", None)  # a document SQLite could not read (NaN) still had it
        return self._with_accumulators(doc)

    def _with_accumulators(self, doc: dict[str, Any]) -> dict[str, Any]:
        # A round part goes with its whole row, as its `round` (`Accumulator.from_dict`).
        rows = self._query("SELECT target, doc FROM accumulators WHERE window_id=?", (doc["id"],))
        if rows:
            parts = dict(self._query(
                "SELECT target, doc FROM accumulator_rounds WHERE window_id=?", (doc["id"],)))
            accs: dict[str, Any] = {}
            for target, raw in rows:
                try:
                    accs[target] = json.loads(raw)
                    if target in parts:
                        accs[target]["round"] = json.loads(parts[target])
                except (TypeError, ValueError) as exc:
                    log.error("accumulator state unreadable id=%s target=%s error=%s",
                              doc["id"], target, exc)
            doc["accumulators"] = accs
        return doc

    def recent_closed(self, limit: int) -> list[dict[str, Any]]:
        """The most recently started closed windows, newest first, without their series."""
        rows = self._query(
            f"SELECT id, {_doc_column(False)} FROM windows WHERE open=0 "
            "ORDER BY started_at DESC LIMIT ?", (limit,)
        )
        docs = [doc for window_id, raw in rows if (doc := _readable(window_id, raw)) is not None]
        for doc in docs:
            doc.pop("series", None)
        return docs

    def recent_stopped_fields(self, limit: int) -> list[dict[str, Any]]:
        """Of the most recently started closed windows, newest first, only what a list shows
        (`_LIST_FIELDS`), picked out by SQLite; unreadable rows are logged and skipped."""
        paths = ", ".join(f"'$.{path}'" for path in _LIST_FIELDS.values())
        rows = self._query(
            f"SELECT id, CASE WHEN {_JSON_TEXT} THEN json_extract(doc, {paths}) END "
            "FROM windows WHERE open=0 ORDER BY started_at DESC LIMIT ?", (limit,)
        )
        picked = []
        for window_id, raw in rows:
            if raw is not None:
                fields = dict(zip(_LIST_FIELDS, json.loads(raw), strict=True))
            else:  # not JSON to SQLite (NaN is JSON to Python only): read it whole
                doc = _readable(window_id, self._query(
                    "SELECT doc FROM windows WHERE id=?", (window_id,))[0][0])
                if doc is None:
                    continue  # logged
                fields = _list_fields(doc)
            if fields["id"] != window_id or not _list_shaped(fields):
                log.error("window state unreadable id=%s error=not a stopped window's shape "
                          "(row kept in the database)", window_id)
                continue
            status, data = fields.pop("aggregate_status"), fields.pop("aggregate_data")
            fields["aggregate"] = {"status": status, "data": data} if status is not None else None
            picked.append(fields)
        return picked

    @contextlib.contextmanager
    def _transaction(self, what: str, *, sync: bool = False) -> Iterator[sqlite3.Connection]:
        """One transaction, forced to disk with `sync`; a failure counted, a `StoreError`."""
        try:
            if sync:
                self._db.execute("PRAGMA synchronous=FULL")
            try:
                with self._db:
                    self._db.execute("BEGIN")
                    yield self._db
            finally:
                if sync:
                    self._db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            self.errors_total += 1
            raise StoreError(f"cannot {what} {self.path}: {exc}") from exc

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read window state from {self.path}: {exc}") from exc

    def close(self) -> None:
        """Fold the log into the database file and close it (again is harmless)."""
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._db.close()


_REQUIRED = ("id", "name", "targets", "labels", "started_at", "stopped_at", "accumulators")
# What a list of stopped windows reads of each (key -> JSON path in its document).
_LIST_FIELDS = {
    "id": "id", "name": "name", "targets": "targets", "labels": "labels",
    "started_at": "started_at", "stopped_at": "stopped_at",
    "aggregate_status": "answer.aggregate.status", "aggregate_data": "answer.aggregate.data",
}
# A document SQLite's JSON functions can read (text: a BLOB or a number is not a window's).
_JSON_TEXT = "typeof(doc) = 'text' AND json_valid(doc)"


def _doc_column(series: bool) -> str:
    """The `doc` column, or SQL giving it without its `series` where SQLite can read it."""
    if series:
        return "doc"
    return f"CASE WHEN {_JSON_TEXT} THEN json_remove(doc, '$.series') ELSE doc END"


def _list_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """`_LIST_FIELDS` of a document Python parsed."""
    aggregate = (doc.get("answer") or {}).get("aggregate") or {}
    return {k: doc.get(k) for k in _LIST_FIELDS if not k.startswith("aggregate")} | {
        "aggregate_status": aggregate.get("status"), "aggregate_data": aggregate.get("data")}


def _list_shaped(fields: dict[str, Any]) -> bool:
    return (isinstance(fields["id"], str) and isinstance(fields["name"], str)
            and isinstance(fields["targets"], dict) and isinstance(fields["labels"], dict)
            and isinstance(fields["started_at"], int | float)
            and isinstance(fields["stopped_at"], int | float)
            and isinstance(fields["aggregate_data"], dict | None))


def _readable(window_id: str, raw: Any) -> dict[str, Any] | None:
    """A row's document if it is a window's state, else None, logged (the row is kept)."""
    # `raw` is whatever the column holds (any SQLite value): json.loads refuses a non-text one.
    try:
        doc = json.loads(raw)
    except (TypeError, ValueError) as exc:
        log.error("window state unreadable id=%s error=%s (row kept in the database)",
                  window_id, exc)
        return None
    missing = [k for k in _REQUIRED if k not in doc] if isinstance(doc, dict) else ["(object)"]
    if not isinstance(doc, dict) or missing or doc["id"] != window_id:
        log.error("window state unreadable id=%s error=missing or wrong keys %s "
                  "(row kept in the database)", window_id, ", ".join(missing) or "id")
        return None
    return doc
