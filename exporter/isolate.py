"""Short-lived bulk work in a forked child, so that its memory leaves with the child.

A stop over 1000 targets builds ~40 MB of short-lived objects (the answer's dicts, its JSON
texts) while the loop goes on scraping. Freed, that memory mostly stayed: Python's small-object
arenas return to the system only when wholly empty, and the scrapes' long-lived objects made
meanwhile pin them, so RSS grew with every stop (76 MB to 167 MB over 50 windows). A forked
child sees the parent's memory as it was at the fork (copy-on-write), does the work on the
other core, hands back bytes through a pipe and exits: its memory goes with it, and the
parent's event loop no longer shares the GIL with the encoding either.

Where there is no `fork` (Windows), `SPECDEC_STOP_IN_CHILD=0` is set, or the child dies
without an answer, the same function runs in a thread of this process instead.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import warnings
from collections.abc import Callable

log = logging.getLogger(__name__)

_OK, _RAISED = b"\x00", b"\x01"
_SIGNALS = [getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP")
            if hasattr(signal, name)]
_MAX_FD = 1 << 20  # os.closerange closes them in one call where Linux has close_range
ENV = "SPECDEC_STOP_IN_CHILD"


class ChildError(Exception):
    """The work raised in the child: its exception's class name and message, as text."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def forking() -> bool:
    """Whether work goes to a child here (a fork exists, and the environment allows it)."""
    return hasattr(os, "fork") and os.environ.get(ENV, "1") != "0"


async def run_isolated(work: Callable[[], bytes], *, timeout: float = 300.0) -> bytes:
    """`work()` in a forked child (else in a thread); its bytes, or `ChildError` if it raised.

    `work` must not take locks other threads may hold at the fork (logging, the import lock):
    it computes from the objects it was given and writes files.
    """
    if not forking():
        return await _in_thread(work)
    read_end, write_end = os.pipe()
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns of a fork in a process with threads (the loop's executor):
            # a lock another thread holds stays locked in the child. The child takes none:
            # it computes, writes files and a pipe, and leaves by os._exit.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        log.warning("no child process for a stop error=%s: working in a thread", exc)
        return await _in_thread(work)
    if pid == 0:  # pragma: no cover  (the child: coverage cannot follow os._exit)
        os.close(read_end)
        _child(work, write_end)
    os.close(write_end)
    reader = asyncio.ensure_future(asyncio.to_thread(_read_all, read_end))
    try:
        data = await asyncio.wait_for(asyncio.shield(reader), timeout)
    except TimeoutError:
        data = b""
    finally:
        if not reader.done():  # past its time, or this stop cancelled: the child goes
            os.kill(pid, signal.SIGKILL)
        # The reading thread sees the end once the child is gone; its descriptor is closed
        # only then (closed under it, the number could be another file's by its next read).
        await asyncio.wait([reader])
        os.close(read_end)
        status = (await asyncio.to_thread(os.waitpid, pid, 0))[1]
    if data[:1] == _OK:
        return data[1:]
    if data[:1] == _RAISED:
        kind, _, message = data[1:].decode(errors="replace").partition("\n")
        raise ChildError(kind, message)
    log.warning("stop's child process gave no answer status=%s: working in a thread", status)
    return await _in_thread(work)


async def _in_thread(work: Callable[[], bytes]) -> bytes:
    try:
        return await asyncio.to_thread(work)
    except Exception as exc:  # the same contract as the child's
        raise ChildError(type(exc).__name__, str(exc)) from exc


def _child(work: Callable[[], bytes], fd: int) -> None:  # pragma: no cover  (runs in the child)
    code = 0
    try:
        # Signals meant for the child stay the child's: the loop's handlers would write them
        # to the parent's wakeup socket (a SIGTERM to the child would stop the server).
        signal.set_wakeup_fd(-1)
        for number in _SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        # No socket, database or file of the parent held open: a server restarted while the
        # child still works must find its port free.
        os.closerange(3, fd)
        os.closerange(fd + 1, _MAX_FD)
        # A collection would walk (and so copy) every page of the parent's heap; the child
        # lives for a second and frees everything by exiting.
        gc.disable()
        try:
            data = _OK + work()
        except Exception as exc:  # no traceback printed: stderr's lock may be another thread's
            data = _RAISED + f"{type(exc).__name__}\n{exc}".encode(errors="replace")
        _write_all(fd, data)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
