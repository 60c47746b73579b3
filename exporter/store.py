"""Durable window state in SQLite, and result files written atomically."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from exporter.errors import StoreError
from exporter.results import result_file_names

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS windows (
    id TEXT PRIMARY KEY,
    open INTEGER NOT NULL,
    started_at REAL NOT NULL,
    doc TEXT NOT NULL
)
"""
_COLUMNS = {"id", "open", "started_at", "doc"}


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Write via a temporary file in the same directory and rename: never a half file.

    `sync` also forces the bytes to disk before the rename (durable across a power cut);
    atomicity for readers does not need it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_results(directory: Path, answer: dict[str, Any]) -> list[Path]:
    """`performances/spec_decode_<host>_<port>.json` per target and `window.json` with it all.

    File names as `results.result_file_names` gives them (AISBench's, unless two collide).
    """
    # One fsync for window.json (which holds every result) and one per directory, not one per
    # target file: a stop over 1000 targets would otherwise spend a second in fsyncs.
    written = []
    try:
        names = result_file_names(answer["results"])
        for target, result in answer["results"].items():
            path = directory / "performances" / names[target]
            atomic_write(path, _dumps(result), sync=False)
            written.append(path)
        atomic_write(directory / "window.json", _dumps(answer))
        written.append(directory / "window.json")
        for folder in {p.parent for p in written}:
            _fsync_dir(folder)
    except OSError as exc:
        raise StoreError(f"cannot write results to {directory}: {exc.strerror or exc}") from exc
    return written


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _dumps(value: object) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


class StateStore:
    """Open and recent windows in one SQLite file; a corrupt file is moved aside, not lost."""

    def __init__(self, path: Path):
        self.path = path
        self.moved_aside: Path | None = None
        self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.path.parent}: {exc.strerror or exc}") from exc
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            aside = self._move_aside()
            log.error(
                "state database unreadable path=%s error=%s moved_to=%s: open windows it held "
                "are not restored; the file is kept for inspection", self.path, exc, aside,
            )
            try:
                return self._connect()
            except sqlite3.DatabaseError as again:
                raise StoreError(f"cannot open state database {self.path}: {again}") from again

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
        self.moved_aside = aside
        return aside

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            # Check before writing anything, so a file moved aside is exactly what we found.
            (check,) = db.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
            columns = {row[1] for row in db.execute("PRAGMA table_info(windows)")}
            if columns and columns != _COLUMNS:
                raise sqlite3.DatabaseError(
                    f"table windows has columns {sorted(columns)}, expected {sorted(_COLUMNS)}"
                )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(_SCHEMA)
            # Every row must be readable, not just the page structure.
            db.execute("SELECT id, open, started_at, length(doc) FROM windows").fetchall()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def save(self, docs: list[dict[str, Any]]) -> None:
        """Upsert windows (their `to_dict` form) in one transaction."""
        if not docs:
            return
        rows = [
            (d["id"], int(d["stopped_at"] is None), d["started_at"], json.dumps(d)) for d in docs
        ]
        try:
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(
                    "INSERT INTO windows (id, open, started_at, doc) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(id) DO UPDATE SET open=excluded.open, doc=excluded.doc",
                    rows,
                )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot save window state to {self.path}: {exc}") from exc

    def load_open(self) -> list[dict[str, Any]]:
        """Every window still open, oldest first; unreadable rows are logged and skipped."""
        rows = self._query("SELECT id, doc FROM windows WHERE open=1 ORDER BY started_at")
        return [doc for window_id, raw in rows if (doc := _readable(window_id, raw)) is not None]

    def load(self, window_id: str) -> dict[str, Any] | None:
        """One window by id, open or closed; `StoreError` if its row is unreadable."""
        row = self._query("SELECT doc FROM windows WHERE id=?", (window_id,))
        if not row:
            return None
        doc = _readable(window_id, row[0][0])
        if doc is None:
            raise StoreError(f'window "{window_id}" state is unreadable in {self.path}')
        return doc

    def recent_closed(self, limit: int) -> list[dict[str, Any]]:
        """The most recently started closed windows, newest first (unreadable rows skipped)."""
        rows = self._query(
            "SELECT id, doc FROM windows WHERE open=0 ORDER BY started_at DESC LIMIT ?", (limit,)
        )
        return [doc for window_id, raw in rows if (doc := _readable(window_id, raw)) is not None]

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read window state from {self.path}: {exc}") from exc

    def close(self) -> None:
        """Close the database (again is harmless)."""
        self._db.close()


_REQUIRED = ("id", "name", "targets", "labels", "started_at", "stopped_at", "accumulators")


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
