"""Short-lived bulk work in a forked child, so that its memory leaves with the child (freed
in the parent, long-lived objects made meanwhile pin Python's arenas). Without `fork`, with
`SPECDEC_STOP_IN_CHILD=0`, or when the child dies unanswered, the caller runs it in a thread.
The child leaves by `os._exit`: no atexit handler, no flush of a buffer shared with the parent."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import pickle
import signal
import socket
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)

# The child's answer frame starts with its kind: the work's bytes, or the exception it raised.
_OK, _RAISED = b"\x00", b"\x01"
_SIZE = 8  # bytes of a frame's size
_T = TypeVar("_T")
_SIGNALS = [getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP")
            if hasattr(signal, name)]
_MAX_FD = 1 << 20  # os.closerange closes them in one call where Linux has close_range
ENV = "SPECDEC_STOP_IN_CHILD"


# Linux's prctl, looked up now: in the child, dlsym would take the loader's lock, which a
# thread of the parent may hold at the fork.
_PRCTL: Callable[..., int] | None
try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:  # pragma: no cover  (runs in the child)
    """The kernel kills the child when its parent dies (a SIGKILL of the server mid-stop):
    no orphan keeps working, or holds its copy of the parent's memory."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


class ChildError(Exception):
    """The work raised in the child: its exception's class name and message, as text."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def spare_cores(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> float:
    """CPUs this process may use beside the one its event loop runs on: those it may run on,
    capped by its cgroup's CPU quota (`cpu_max`, cgroup v2: a container's limit), less one."""
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity here (macOS)
        cpus = float(os.cpu_count() or 1)
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, int(quota) / int(period))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota: the CPUs are the limit
    return cpus - 1


def forking() -> bool:
    """Whether work goes to a child here (a fork exists, and the environment allows it)."""
    return hasattr(os, "fork") and os.environ.get(ENV, "1") != "0"


class Child:
    """`work(inbox)` in a forked child, its inbox yielding what `send` is given, in order.
    `work` must take no lock another thread may hold at the fork. Without a child (or with a
    dead one) `send` drops messages and `result` is None: the caller then works `in_thread`."""

    def __init__(self, work: Callable[[Iterator[Any]], bytes]):
        self._work = work
        self._pid: int | None = None
        self._to_child: int | None = None  # non-blocking: `send` never waits on the child
        # A socket, not a pipe: `recv(size, MSG_WAITALL)` reads megabytes in one piece.
        self._from_child: socket.socket | None = None
        self._pending = bytearray()  # sent, not yet taken by the pipe
        self._drained: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()

    def start(self) -> bool:
        """Fork the child if there is none yet; whether a child works (until its answer is
        read): else the caller works in a thread."""
        if forking() and self._pid is None:
            self._fork()
        return self._pid is not None

    async def close(self) -> None:
        if self._pid is not None:
            os.kill(self._pid, signal.SIGKILL)
            self._close_input()
            if self._from_child is not None:
                self._from_child.close()
                self._from_child = None
            pid, self._pid = self._pid, None
            await asyncio.to_thread(os.waitpid, pid, 0)

    def _fork(self) -> None:
        inbox_r, inbox_w = os.pipe()
        answer_r, answer_w = socket.socketpair()
        try:
            with warnings.catch_warnings():
                # 3.12+ warns of a fork with threads: the child takes none of their locks.
                warnings.simplefilter("ignore", DeprecationWarning)
                parent = os.getpid()
                pid = os.fork()
        except OSError as exc:
            for fd in (inbox_r, inbox_w):
                os.close(fd)
            answer_r.close()
            answer_w.close()
            log.warning("no child process for a stop error=%s: working in a thread", exc)
            return
        if pid == 0:  # pragma: no cover  (the child: coverage cannot follow os._exit)
            _die_with_parent(parent)
            os.close(inbox_w)
            answer_r.close()
            work = self._work
            _child(lambda: work(_messages(inbox_r)), answer_w, inbox_r)
        os.close(inbox_r)
        answer_w.close()
        os.set_blocking(inbox_w, False)
        self._pid, self._to_child, self._from_child = pid, inbox_w, answer_r

    def send(self, message: Any) -> None:
        """Hand the child a message (pickled): dropped when there is no child."""
        if self._to_child is None:
            return
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if not self._pending:
            # One write per turn of the loop, not one per message (each wakes the child).
            self._loop.call_soon(self._flush)
        self._pending += len(data).to_bytes(_SIZE, "big") + data

    def _flush(self) -> None:
        fd = self._to_child
        if fd is None:
            return
        try:
            while self._pending:
                del self._pending[:os.write(fd, self._pending)]
        except BlockingIOError:  # the pipe is full: the rest once the child has read some
            self._loop.add_writer(fd, self._flush)
            return
        except OSError:  # the child is gone: `result` sees it has no answer
            self._pending.clear()
        self._loop.remove_writer(fd)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _close_input(self) -> None:
        if self._to_child is not None:
            self._loop.remove_writer(self._to_child)
            os.close(self._to_child)
            self._to_child = None

    async def result(self, *, timeout: float = 300.0) -> bytes | None:
        """The child's bytes once it has every message, or `ChildError` if its work raised;
        None without a child, or one that gave no answer (dead, or past `timeout` seconds)."""
        if self._pid is None or self._from_child is None:
            return None
        try:
            if self._pending:
                self._drained = self._loop.create_future()
                await asyncio.wait_for(asyncio.shield(self._drained), timeout)
        except TimeoutError:
            timeout = 0.0  # it is past its time: ended, and said so
        frame = await self._answer_frame(timeout)
        if frame is None:
            return None
        if frame[:1] == _RAISED:
            name, _, message = frame[1:].decode(errors="replace").partition("\n")
            raise ChildError(name, message)
        return frame[1:]

    async def _answer_frame(self, timeout: float) -> bytes | None:
        """The child's answer frame; None if it ended without one or is killed past `timeout`."""
        assert self._pid is not None and self._from_child is not None
        pid, channel = self._pid, self._from_child
        self._close_input()  # the inbox ends: the child finishes its work
        reader = asyncio.ensure_future(asyncio.to_thread(_read_frame, channel))
        frame: bytes | None = None
        try:
            frame = await asyncio.wait_for(asyncio.shield(reader), timeout)
        except TimeoutError:
            pass
        finally:
            if not reader.done():  # past its time, or this stop cancelled: the child goes
                os.kill(pid, signal.SIGKILL)
            # Closed only once the reader is done: closed under it, the number could be reused.
            await asyncio.wait([reader])
            channel.close()
            self._pid = self._from_child = None
            if frame is not None:
                # Its answer is in: the stop does not wait while the child's memory is freed.
                _reap_later(pid)
            else:
                status = (await asyncio.to_thread(os.waitpid, pid, 0))[1]
                log.warning("child process ended without answering status=%s", status)
        return frame


def _reap_later(pid: int) -> None:
    """Reap `pid` in a thread of its own (no zombie, whatever becomes of the loop)."""
    with contextlib.suppress(ChildProcessError):
        if not os.waitpid(pid, os.WNOHANG)[0]:
            threading.Thread(target=_wait_quietly, args=(pid,), daemon=True,
                             name=f"reap-{pid}").start()


def _wait_quietly(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _messages(fd: int) -> Iterator[Any]:  # pragma: no cover  (runs in the child)
    """What `Child.send` wrote to `fd`, unpickled, until the parent closes it."""
    buffer = bytearray()
    while chunk := os.read(fd, 1 << 20):
        buffer += chunk
        done = 0
        while len(buffer) - done >= _SIZE:
            size = int.from_bytes(buffer[done:done + _SIZE], "big")
            if len(buffer) - done - _SIZE < size:
                break
            yield pickle.loads(buffer[done + _SIZE:done + _SIZE + size])
            done += _SIZE + size
        del buffer[:done]
    os.close(fd)


async def in_thread(work: Callable[[], _T]) -> _T:
    """`work()` in a thread, raising as a child's work would (`ChildError`)."""
    try:
        return await asyncio.to_thread(work)
    except Exception as exc:
        raise ChildError(type(exc).__name__, str(exc)) from exc


_LEFT_TO_EXIT: list[tuple[Any, ...]] = []
_in_child = False


def leave_to_exit(*objects: Any) -> None:
    """In a forked child, hold `objects` until it exits: freeing millions of them one by one
    would delay its answer. In a thread, nothing is held."""
    if _in_child:
        _LEFT_TO_EXIT.append(objects)


def _child(work: Callable[[], bytes], channel: socket.socket, inbox: int
           ) -> None:  # pragma: no cover  (runs in the child)
    global _in_child
    _in_child = True
    code = 0
    try:
        # Signals meant for the child stay the child's: the loop's handlers would write them
        # to the parent's wakeup socket (a SIGTERM to the child would stop the server).
        signal.set_wakeup_fd(-1)
        for number in _SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        # No socket, database or file of the parent held open: a server restarted while the
        # child still works must find its port free, and no write reaches the parent's files.
        kept = sorted({channel.fileno(), inbox})
        for low, high in zip([2, *kept], [*kept, _MAX_FD], strict=True):
            os.closerange(low + 1, high)
        # No record reaches a handler: its lock, or its stream's, may be a thread's.
        logging.disable(logging.CRITICAL)
        # A collection would copy every page of the parent's heap; exiting frees everything.
        gc.disable()
        try:
            _send_frame(channel, _OK + work())
        except Exception as exc:  # no traceback printed: stderr's lock may be another thread's
            _send_frame(channel, _RAISED + f"{type(exc).__name__}\n{exc}".encode(errors="replace"))
        # Closed now: exit frees the memory first, which the parent would wait for.
        channel.close()
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _send_frame(channel: socket.socket, payload: bytes
                ) -> None:  # pragma: no cover  (runs in the child)
    """One frame (`_read_frame`): its size, then the payload as it is (no copy of megabytes)."""
    channel.sendall(len(payload).to_bytes(_SIZE, "big"))
    channel.sendall(payload)


def _read_frame(channel: socket.socket) -> bytes | None:
    """One frame of the child's; None if the child ended before it was whole."""
    head = _receive(channel, _SIZE)
    return None if head is None else _receive(channel, int.from_bytes(head, "big"))


def _receive(channel: socket.socket, size: int) -> bytes | None:
    """`size` bytes, received into the bytes object they are kept as; None at an early end."""
    chunks: list[bytes] = []
    got = 0
    while got < size:  # more than once if a signal cut the wait short
        chunk = channel.recv(size - got, socket.MSG_WAITALL)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
