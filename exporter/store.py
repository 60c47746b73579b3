"""Durable window state in SQLite, and result files written atomically."""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import tempfile
import time
from pathlib import Path

from exporter.errors import StoreError

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS windows (
    id TEXT PRIMARY KEY,
    open INTEGER NOT NULL,
    started_at REAL NOT NULL,
    doc TEXT NOT NULL
)
"""


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same directory and rename: never a half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def result_file_name(host_port: str) -> str:
    """`spec_decode_<host>_<port>.json`, host characters outside [A-Za-z0-9._-] made `_`."""
    host, _, port = host_port.rpartition(":")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)
    return f"spec_decode_{safe}_{port}.json"


def write_results(directory: Path, answer: dict) -> list[Path]:
    """`performances/spec_decode_<host>_<port>.json` per target and `window.json` with it all."""
    written = []
    try:
        for result in answer["results"].values():
            path = directory / "performances" / result_file_name(result["host_port"])
            atomic_write(path, _dumps(result))
            written.append(path)
        atomic_write(directory / "window.json", _dumps(answer))
        written.append(directory / "window.json")
    except OSError as exc:
        raise StoreError(f"cannot write results to {directory}: {exc.strerror or exc}") from exc
    return written


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
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            self.moved_aside = aside
            log.error("state database unreadable path=%s error=%s moved_to=%s", self.path, exc, aside)
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(_SCHEMA)
            db.execute("SELECT count(*) FROM windows").fetchone()
            db.execute("PRAGMA quick_check").fetchone()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def save(self, docs: list[dict]) -> None:
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

    def load_open(self) -> list[dict]:
        """Every window still open, oldest first."""
        rows = self._db.execute("SELECT doc FROM windows WHERE open=1 ORDER BY started_at")
        return [json.loads(doc) for (doc,) in rows]

    def load(self, window_id: str) -> dict | None:
        """One window by id, open or closed."""
        row = self._db.execute("SELECT doc FROM windows WHERE id=?", (window_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def recent_closed(self, limit: int) -> list[dict]:
        """The most recently started closed windows, newest first."""
        rows = self._db.execute(
            "SELECT doc FROM windows WHERE open=0 ORDER BY started_at DESC LIMIT ?", (limit,)
        )
        return [json.loads(doc) for (doc,) in rows]

    def close(self) -> None:
        """Close the database."""
        self._db.close()
