"""One exporter per state directory: an exclusive lock held for the life of the process (two
would each restore the same open windows, and write their stop answers into one folder)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from exporter.core.errors import ExporterError

LOCK_NAME = "exporter.lock"


class StateDirInUse(ExporterError):
    """Another live process holds the lock of this state directory."""


def hold_state_dir(directory: Path) -> int:
    """Lock `directory` for this process; the descriptor returned keeps it (closing frees it).
    The kernel drops the lock when the holder dies, even by SIGKILL: nothing to clean up."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StateDirInUse(f"{directory} is in use by another exporter (pid {holder}); "
                                "stop it, or give this one another output_dir") from None
        # A holder that left unlinked the file it locked: the one at the path now is to lock.
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), path.stat()):
                break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def release_state_dir(fd: int, directory: Path, *, remove_directory: bool = False) -> None:
    """Let go of `hold_state_dir`'s lock, its file removed while still held (no dead pid left
    behind); `remove_directory` also removes the directory when nothing else is in it."""
    with contextlib.suppress(OSError):
        os.unlink(directory / LOCK_NAME)
    os.close(fd)
    if remove_directory:
        with contextlib.suppress(OSError):
            directory.rmdir()

