"""Durable window state in SQLite, and result files written atomically."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import shutil
import sqlite3
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.state.answertext import AnswerTexts
from exporter.core.errors import StoreError

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS windows (
    id TEXT PRIMARY KEY,
    open INTEGER NOT NULL,
    started_at REAL NOT NULL,
    doc TEXT NOT NULL
)
"""
_ACC_SCHEMA = """
CREATE TABLE IF NOT EXISTS accumulators (
    window_id TEXT NOT NULL,
    target TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (window_id, target)
)
"""
# Per window x target, the round part (`Accumulator.encode`) written after its `accumulators`
# row, which it completes; a row of its own so that a round rewrites only these few hundred
# bytes. WITHOUT ROWID: one B-tree to update per row, not a table and its key's index.
_ROUND_SCHEMA = """
CREATE TABLE IF NOT EXISTS accumulator_rounds (
    window_id TEXT NOT NULL,
    target TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (window_id, target)
) WITHOUT ROWID
"""
_TABLES = {
    "windows": {"id", "open", "started_at", "doc"},
    "accumulators": {"window_id", "target", "doc"},
    "accumulator_rounds": {"window_id", "target", "doc"},
}


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Write via a temporary file in the same directory and rename: never a half file.

    `sync` also forces the bytes to disk before the rename (durable across a power cut);
    atomicity for readers does not need it. Plain `os` calls, not `tempfile.mkstemp` and a file
    object: a stop writes a file per target, and those took 0.14 ms of the 0.19 ms per file.
    """
    folder = os.fspath(path.parent)
    for attempt in range(_ATTEMPTS):
        # A name of our own (O_EXCL): another writer's, or a killed one's leftover, is not ours.
        tmp = os.path.join(folder, f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, _CREATE, 0o600)  # mkstemp's mode, as the files always had
            break
        except FileExistsError:
            continue
        except FileNotFoundError:
            if attempt == _ATTEMPTS - 1:
                raise
            os.makedirs(folder, exist_ok=True)
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", folder)
    try:
        try:
            _write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_ATTEMPTS = 100


def _write_all(fd: int, data: bytes) -> None:
    # os.write may write less than it was given (a signal, a full pipe): write the rest.
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


PREPARED = ".performances.prepared"  # a window's result files, made ahead of its stop


def prepare_results(directory: Path, names: Iterable[str]) -> None:
    """Create a window's result files, empty, in a hidden folder that its stop fills.

    Creating a file costs 0.6-0.9 ms on some disks (ext4 on this project's CI machine; 7 us on
    tmpfs), writing into one that exists 10 us: a stop over 1000 targets spent half a second
    creating its files. So they are made while the window is open, off the loop, and the stop
    fills them and renames the folder. Files there already (a restart) are kept.
    """
    folder = directory / PREPARED
    folder.mkdir(parents=True, exist_ok=True)
    have = set(os.listdir(folder))
    at = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for name in names:
            if name not in have:
                os.close(os.open(name, _CREATE, 0o600, dir_fd=at))
    finally:
        os.close(at)


class PreparedFiles:
    """A window's prepared folder (`prepare_results`), its files filled one by one while its
    stop's scrapes come in; `write_results(ahead=written)` then leaves those as they are."""

    def __init__(self, directory: Path):
        self.written: dict[str, bytes] = {}  # file name -> the text it holds
        try:
            self._at: int | None = os.open(directory / PREPARED,
                                           os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:  # none (made late, or not at all): `write_results` writes them all
            self._at = None

    def write(self, name: str, text: bytes) -> None:
        """Fill one file; if it cannot be, `write_results` tries again (and says why)."""
        if self._at is None or "/" in name:
            return
        try:
            _write_into(self._at, {name: text}, _FILL)
        except OSError:
            return
        self.written[name] = text

    def close(self) -> None:
        """Let go of the folder (the files stay)."""
        if self._at is not None:
            os.close(self._at)
            self._at = None


def write_results(directory: Path, texts: AnswerTexts,
                  ahead: Mapping[str, bytes] | None = None, *, sync: bool = True) -> list[Path]:
    """`performances/spec_decode_<host>_<port>.json` per target and `window.json` with it all.

    File names as `results.result_file_names` gives them (AISBench's, unless two collide).
    `ahead`: files of the prepared folder filled already (`PreparedFiles.written`), left
    as they are where they hold the same text object. `sync`: window.json and the folders
    forced to disk (a stop leaves that to the state database, which holds the same answer and
    is synced right after: `WindowBook.restore` writes lost files again from it).
    """
    # One fsync for window.json (which holds every result) and one per directory, not one per
    # target file: a stop over 1000 targets would otherwise spend a second in fsyncs.
    folder = directory / "performances"
    written = [folder / name for name in texts.files]
    try:
        if texts.files and not _fill_prepared(directory, texts.files, ahead or {}) and (
                not _new_folder(folder, texts.files)):
            for path, text in zip(written, texts.files.values(), strict=True):
                atomic_write(path, text, sync=False)
        atomic_write(directory / "window.json", texts.whole, sync=sync)
        written.append(directory / "window.json")
        for where in {p.parent for p in written} if sync else ():
            _fsync_dir(where)
    except OSError as exc:
        raise StoreError(f"cannot write results to {directory}: {exc.strerror or exc}") from exc
    # Left over when the folder was there already (a stop that wrote it and failed later).
    shutil.rmtree(directory / PREPARED, ignore_errors=True)
    return written


def _fill_prepared(directory: Path, files: Mapping[str, bytes], ahead: Mapping[str, bytes]
                   ) -> bool:
    """The prepared folder filled and renamed to `performances`: False (nothing done) when
    there is none, or a `performances` folder is there already.

    Readers see every file or none: the folder is hidden until its rename. Files it has beyond
    these (a window whose file names changed) leave; ones it lacks are made now.
    """
    prepared, folder = directory / PREPARED, directory / "performances"
    if not prepared.is_dir() or os.path.lexists(folder):
        return False
    at = os.open(prepared, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for name in set(os.listdir(at)) - set(files):
            os.unlink(name, dir_fd=at)
        _write_into(at, {name: text for name, text in files.items()
                         if ahead.get(name) is not text}, _FILL)
    finally:
        os.close(at)
    os.rename(prepared, folder)
    return True


def _write_into(at: int, files: Mapping[str, bytes], flags: int) -> None:
    """Each file written whole into the folder open as `at` (mode 0600, as mkstemp's).

    `_FILL`: a file there already is written over, and cut to its new text only if it held
    more. Not `O_TRUNC`: ext4 takes the truncation of a file to zero as a file being replaced
    and starts writing it to disk at its close (`auto_da_alloc`), even where it was empty (a
    prepared file): filling 1000 files took 41 ms, against 12 ms without (this machine)."""
    for name, text in files.items():
        fd = os.open(name, flags, 0o600, dir_fd=at)
        try:
            held = os.fstat(fd).st_size if flags == _FILL else 0
            _write_all(fd, text)
            if held > len(text):
                os.ftruncate(fd, len(text))
        finally:
            os.close(fd)


_FILL = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


def _new_folder(folder: Path, files: Mapping[str, bytes]) -> bool:
    """A folder that does not exist yet, made whole: False (nothing done) if it exists.

    Its files are written into a temporary folder beside it, which is then renamed: a reader
    sees every file or none, as with a rename per file, at half the directory operations (the
    first stop of a window; a folder there already gets a rename per file).
    """
    if os.path.lexists(folder):
        return False
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.{secrets.token_hex(4)}.tmp")
    os.mkdir(tmp)
    try:
        at = os.open(tmp, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            _write_into(at, files, _CREATE)
        finally:
            os.close(at)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


@dataclass(frozen=True)
class EncodedDoc:
    """A window row's document as JSON around its `answer`'s value, which `text` puts in as
    is: a stop answer comes encoded already (megabytes, not decoded or encoded again here),
    and a stop encodes the rest while its child still makes the answer (`encode_doc`)."""

    id: str
    open: bool
    started_at: float
    before: bytes  # the JSON text up to the answer's value
    own: bytes  # the document's own answer, as JSON
    after: bytes  # from after it

    def text(self, answer: bytes | None = None) -> bytes:
        """The document's text, with this answer (already JSON) or its own."""
        return b"".join((self.before, self.own if answer is None else answer, self.after))


def encode_doc(doc: Mapping[str, Any]) -> EncodedDoc:
    """`json.dumps(doc)` (NaN as NaN, as the stdlib writes it), cut around its answer's value
    (a document without one gets it last)."""
    # A stand-in for the answer: NUL and a random token, in no real text.
    mark = f"\x00{secrets.token_hex(8)}"
    text = json.dumps(dict(doc) | {"answer": mark}).encode()
    before, _, after = text.partition(json.dumps(mark).encode())
    return EncodedDoc(doc["id"], doc["stopped_at"] is None, doc["started_at"], before,
                      json.dumps(doc.get("answer")).encode(), after)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# The state database's page cache, KiB. SQLite's default (2 MiB) filled with the pages of the
# first stopped window's answer (~5 MB at 1000 targets, written once, read back rarely) and
# stayed full: 2 MiB of the server's growth over its first window. What is read and written
# again, round after round (the open windows' accumulator rows and the tables' inner pages),
# is far smaller; pages not cached are read from the system's file cache.
STATE_CACHE_KIB = 384
# Pages of 8 KiB (SQLite's default is 4): a stop's answer (~5 MB at 1000 targets) is stored
# as one row, a chain of overflow pages, each its own write to the WAL. Saving a stop's row
# took 53-65 ms with 4 KiB pages, 31-32 ms with 8 KiB (16 KiB: 35 ms; 64 KiB: 28 ms, but SQLite
# then held 2-4x the memory for the same cache size). A database made with other pages keeps
# them (WAL mode fixes the size).
STATE_PAGE_SIZE = 8192


def connect_state(path: Path) -> sqlite3.Connection:
    """The state database's connection, without a statement cache: SQLite keeps a prepared
    statement's last bound values until it runs again, so the cached window upsert held a
    copy of the last stop's answer (~5 MB at 1000 targets) until the next window row was
    written. Preparing a save's few statements again costs microseconds. Its page cache is
    `STATE_CACHE_KIB`."""
    db = sqlite3.connect(path, cached_statements=0)
    db.execute(f"PRAGMA cache_size=-{STATE_CACHE_KIB}")
    return db


class StateStore:
    """Open and recent windows in one SQLite file; a corrupt file is moved aside, not lost.

    A window's own row (`windows`) changes at its start, its stop and a few rare events; its
    per-target accumulators (`accumulators`, one row per window x target) change with every
    scrape and are written only when they did: whole when more than a round's part of them
    changed, else only that part (`accumulator_rounds`, read over the whole row). In WAL mode
    with `synchronous=NORMAL` a commit survives the death of our process (not a power cut);
    `sync=True` (a start, a stop) makes one survive a power cut too.

    `connect` opens the SQLite connection (every time the file is opened or reopened):
    `connect_state` by default; a test passes one that keeps the connection, to give it
    SQLite's own faults (a full database, one that refuses writes).
    """

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

    @classmethod
    def in_memory(cls) -> StateStore:
        """A store that lives as long as the process (`measure` has nothing to restore)."""
        return cls(Path(":memory:"))

    def _check_wal(self) -> None:
        # SQLite replays a write-ahead log up to its first bad frame and drops the rest without
        # a word: committed windows would vanish silently. Say so, and keep a copy.
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
            db.execute(_ACC_SCHEMA)
            db.execute(_ROUND_SCHEMA)
            # Every row must be readable, not just the page structure.
            db.execute("SELECT id, open, started_at, length(doc) FROM windows").fetchall()
            db.execute("SELECT window_id, target, length(doc) FROM accumulators").fetchall()
            db.execute("SELECT window_id, target, length(doc) FROM accumulator_rounds").fetchall()
        except sqlite3.DatabaseError:
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
        """True (logged, counted) when our files were deleted or replaced under us: a fresh
        database is open at the path, and the caller must write back what it holds."""
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
        docs: Iterable[Mapping[str, Any] | EncodedDoc] = (),
        accumulators: Iterable[tuple[str, str, str]] = (),
        *,
        rounds: Iterable[tuple[str, str, str]] = (),
        sync: bool = False,
        answers: Mapping[str, bytes] | None = None,
    ) -> None:
        """Upsert window rows (`to_dict` form, accumulators left out), whole accumulator rows
        and round parts (each window id, target, JSON) in one transaction; `sync` forces it
        to disk. A whole row replaces its round part: the two always belong together.

        `answers`: window id -> its stop answer already encoded (`AnswerTexts.compact`), which
        its row holds as is instead of encoding the document's `answer` again. A document may
        come encoded already (`encode_doc`).
        """
        answers = answers or {}
        encoded = [d if isinstance(d, EncodedDoc) else encode_doc(d) for d in docs]
        rows = [(d.id, int(d.open), d.started_at, d.text(answers.get(d.id))) for d in encoded]
        accs, parts = list(accumulators), list(rounds)
        if not rows and not accs and not parts:
            return
        try:
            if sync:
                self._db.execute("PRAGMA synchronous=FULL")
            try:
                with self._db:
                    self._db.execute("BEGIN")
                    # UTF-8 bytes stored as text: SQLite's JSON functions read it.
                    self._db.executemany(
                        "INSERT INTO windows (id, open, started_at, doc) "
                        "VALUES (?, ?, ?, CAST(? AS TEXT)) "
                        "ON CONFLICT(id) DO UPDATE SET open=excluded.open, doc=excluded.doc",
                        rows,
                    )
                    # A stopped window is its answer: its accumulators leave the database.
                    stopped = [(r[0],) for r in rows if not r[1]]
                    for table in _ACC_TABLES:
                        self._db.executemany(f"DELETE FROM {table} WHERE window_id=?", stopped)
                    self._db.executemany(
                        "INSERT OR REPLACE INTO accumulators (window_id, target, doc) "
                        "VALUES (?, ?, ?)", accs,
                    )
                    self._db.executemany(
                        "DELETE FROM accumulator_rounds WHERE window_id=? AND target=?",
                        [a[:2] for a in accs],
                    )
                    self._db.executemany(
                        "INSERT OR REPLACE INTO accumulator_rounds (window_id, target, doc) "
                        "VALUES (?, ?, ?)", parts,
                    )
            finally:
                if sync:
                    self._db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            self.errors_total += 1
            raise StoreError(f"cannot save window state to {self.path}: {exc}") from exc
        if self._identity[1] is None:
            self._identity = self._files()  # the first commit creates the WAL

    def copy_from(self, other: StateStore) -> None:
        """Every row of `other` into this database, in one transaction (a moved state path)."""
        windows = other._query("SELECT id, open, started_at, doc FROM windows")
        accs = {t: other._query(f"SELECT window_id, target, doc FROM {t}") for t in _ACC_TABLES}
        try:
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany("INSERT OR REPLACE INTO windows VALUES (?, ?, ?, ?)", windows)
                for table, rows in accs.items():
                    self._db.executemany(f"INSERT OR REPLACE INTO {table} VALUES (?, ?, ?)", rows)
        except sqlite3.Error as exc:
            self.errors_total += 1
            raise StoreError(f"cannot copy window state to {self.path}: {exc}") from exc
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
        try:
            with self._db:
                self._db.execute("BEGIN")
                for table in _ACC_TABLES:
                    self._db.executemany(f"DELETE FROM {table} WHERE window_id=?", ids)
                self._db.executemany("DELETE FROM windows WHERE id=?", ids)
        except sqlite3.Error as exc:
            self.errors_total += 1
            raise StoreError(f"cannot delete window state in {self.path}: {exc}") from exc

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
        """One window by id, open or closed; `StoreError` if its row is unreadable.

        `series=False` leaves a stopped window's per-scrape series out (an answer is a few MB
        at 1000 targets; an hour of series is ten times that), as SQLite's JSON functions can
        drop it before Python parses a byte of it.
        """
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
        # Rows win over what a window row of an older version carried inside its document;
        # a round part goes with its whole row, as its `round` (`Accumulator.from_dict`).
        rows = self._query("SELECT target, doc FROM accumulators WHERE window_id=?", (doc["id"],))
        if rows:
            parts = dict(self._query(
                "SELECT target, doc FROM accumulator_rounds WHERE window_id=?", (doc["id"],)))
            accs = dict(doc.get("accumulators") or {})
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

    def recent_closed(self, limit: int, *, series: bool = True) -> list[dict[str, Any]]:
        """The most recently started closed windows, newest first (unreadable rows skipped)."""
        rows = self._query(
            f"SELECT id, {_doc_column(series)} FROM windows WHERE open=0 "
            "ORDER BY started_at DESC LIMIT ?", (limit,)
        )
        docs = [doc for window_id, raw in rows if (doc := _readable(window_id, raw)) is not None]
        for doc in docs if not series else ():
            doc.pop("series", None)
        return docs

    def recent_stopped_fields(self, limit: int) -> list[dict[str, Any]]:
        """Of the most recently started closed windows, newest first, only what a list of them
        shows: id, name, targets, labels, started_at, stopped_at and `aggregate` (the answer's,
        its status and data only, or None). SQLite picks them out: Python never parses the
        answers. Unreadable rows are logged and skipped."""
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


# The tables of per-target rows, which go with their window.
_ACC_TABLES = ("accumulators", "accumulator_rounds")
_WAL_MAGIC = (0x377F0682, 0x377F0683)


def wal_checksum(data: bytes, big_endian: bool, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    """SQLite's WAL checksum (pairs of 32-bit words, cumulative), continued from (s0, s1)."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def wal_damage(wal: bytes) -> str | None:
    """Why a write-ahead log is damaged, or None when SQLite will replay all it committed.

    Frames of an older generation (other salts), an unfinished or torn last frame and frames
    after the last commit are normal leftovers of a kill mid-write; a frame whose checksum fails
    with commits of the same generation after it is damage: SQLite stops there, losing them.
    """
    if len(wal) < 32:
        return None
    magic, _, page_size, _, salt1, salt2, c0, c1 = struct.unpack(">8I", wal[:32])
    if magic not in _WAL_MAGIC:
        return "bad header magic"
    big = magic & 1 == 1
    if wal_checksum(wal[:24], big) != (c0, c1):
        return "header checksum mismatch"
    sums = (c0, c1)
    offset, frame = 32, 24 + page_size
    while offset + frame <= len(wal):
        head = wal[offset:offset + 24]
        _, _, f_salt1, f_salt2, f0, f1 = struct.unpack(">6I", head)
        if (f_salt1, f_salt2) != (salt1, salt2):
            return None  # an older generation's frame: the log ends before it
        sums = wal_checksum(head[:8], big, *sums)
        sums = wal_checksum(wal[offset + 24:offset + frame], big, *sums)
        if sums != (f0, f1):
            # A kill between a frame's header and its page leaves a torn last frame: harmless
            # unless a later frame of this generation ends a transaction (a commit lost).
            lost = sum(
                1 for at in range(offset + frame, len(wal) - frame + 1, frame)
                if struct.unpack(">6I", wal[at:at + 24])[1:4] != (0, salt1, salt2)
                and struct.unpack(">6I", wal[at:at + 24])[2:4] == (salt1, salt2)
            )
            if lost:
                index = (offset - 32) // frame
                return f"frame {index} checksum mismatch; {lost} committed transaction(s) after it"
            return None
        offset += frame
    return None


_REQUIRED = ("id", "name", "targets", "labels", "started_at", "stopped_at", "accumulators")
# What a list of stopped windows reads of each (key -> JSON path in its document).
_LIST_FIELDS = {
    "id": "id", "name": "name", "targets": "targets", "labels": "labels",
    "started_at": "started_at", "stopped_at": "stopped_at",
    "aggregate_status": "answer.aggregate.status", "aggregate_data": "answer.aggregate.data",
}
# Of the aggregate RESULT, only its status and data: its list of every target stays in SQLite.
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
