"""Result files written atomically: a window's `performances/` files, written one by one
into a hidden folder that then takes its place whole, and its `window.json`."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from exporter.core.errors import StoreError
from exporter.state.answertext import AnswerTexts


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Write via a temporary file in the same directory and rename: never a half file. `sync`
    forces the bytes to disk first (a power cut)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A name of our own (O_EXCL): another writer's, or a killed one's leftover, is not ours.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            _write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_all(fd: int, data: bytes) -> None:
    # os.write may write less than it was given (a signal, a full pipe): write the rest.
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_HIDDEN = ".performances."  # a folder of result files being written (then `performances`)


class ResultFolder:
    """A window's result files written as they are made, then put in place together
    (`finish`); `discard` forgets the ones written (a stop cut short)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._tmp = directory / f"{_HIDDEN}{secrets.token_hex(4)}.tmp"
        self._at: int | None = None
        self._written: dict[str, bytes] = {}  # file name -> the text object it holds

    def write(self, name: str, text: bytes) -> None:
        """One file written now (again with another text); `StoreError` if it cannot be."""
        try:
            self._write(name, text)
        except OSError as exc:
            self.discard()
            raise self._error(exc) from exc

    def _write(self, name: str, text: bytes) -> None:
        if self._written.get(name) is text:
            return
        if self._at is None:
            self._tmp.mkdir(parents=True)
            self._at = os.open(self._tmp, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        fd = os.open(name, _REWRITE, 0o600, dir_fd=self._at)  # mkstemp's mode, as always
        try:
            _write_all(fd, text)
        finally:
            os.close(fd)
        self._written[name] = text

    def finish(self, texts: AnswerTexts, *, sync: bool = True) -> None:
        """Every file of `texts` in `performances/` and `window.json`; `StoreError` if they
        cannot be. Without `sync` a restart writes lost files again from the state database."""
        folder = self.directory / "performances"
        try:
            for name, text in texts.files.items():
                self._write(name, text)
            for name in set(self._written) - set(texts.files):  # a name no longer the window's
                os.unlink(name, dir_fd=self._at)
            self._close()
            self._put_in_place(folder)
            atomic_write(self.directory / "window.json", texts.whole, sync=sync)
            if sync:
                for where in {folder, self.directory} if texts.files else {self.directory}:
                    _fsync_dir(where)
        except OSError as exc:
            self.discard()
            raise self._error(exc) from exc

    def _put_in_place(self, folder: Path) -> None:
        if not self._written:
            return
        if not os.path.lexists(folder):  # the first stop of the window: one rename
            os.rename(self._tmp, folder)
        else:  # a folder there already (a stop that failed later): a rename per file
            for name in self._written:
                os.replace(self._tmp / name, folder / name)
            os.rmdir(self._tmp)
        # Left by a stop whose process was killed in the middle of writing.
        for name in os.listdir(self.directory):
            if name.startswith(_HIDDEN) and name.endswith(".tmp"):
                shutil.rmtree(self.directory / name, ignore_errors=True)

    def _error(self, exc: OSError) -> StoreError:
        return StoreError(f"cannot write results to {self.directory}: {exc.strerror or exc}")

    def discard(self) -> None:
        self._close()
        self._written.clear()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _close(self) -> None:
        if self._at is not None:
            os.close(self._at)
            self._at = None


def write_results(directory: Path, texts: AnswerTexts) -> None:
    """`performances/` and `window.json`, synced: one fsync for window.json, which holds every
    result, and one per directory, not one per target file."""
    ResultFolder(directory).finish(texts)


_REWRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
