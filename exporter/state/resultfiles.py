"""Result files written atomically: a window's folder of `performances/` files and its
`window.json`, made ahead of its stop where they can be (`PREPARED`)."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from exporter.core.errors import StoreError
from exporter.state.answertext import AnswerTexts


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


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
