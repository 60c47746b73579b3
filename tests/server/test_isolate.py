"""isolate: work in a forked child, its bytes or its exception back; a thread where not."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import sqlite3
import struct
import termios
import threading
import time
from collections.abc import Iterator

import pytest

from bench.answer import open_window
from exporter.core.errors import StoreError
from exporter.server import isolate
from exporter.server.isolate import Child, ChildError, in_thread, leave_to_exit
from exporter.server.stop import END, FINAL, ResultCodec, read_stop, stop_work

PARENT = os.getpid()


@contextlib.asynccontextmanager
async def forked(work):
    """`Child(work)` started, and closed on the way out, as the book uses one."""
    child = Child(work)
    child.start()
    try:
        yield child
    finally:
        await child.close()


async def run_isolated(work, *, timeout: float = 300.0) -> bytes:
    """`work()` as the book runs a stop's: in a child, else in a thread of this process."""
    async with forked(lambda _inbox: work()) as child:
        data = await child.result(timeout=timeout)
    return data if data is not None else await in_thread(work)


def pid_text() -> bytes:
    return str(os.getpid()).encode()


class TestInChild:
    async def test_the_work_runs_in_another_process_and_its_bytes_come_back(self):
        assert isolate.forking()
        assert int(await run_isolated(pid_text)) != PARENT

    async def test_megabytes_come_back_whole(self):
        big = bytes(range(256)) * 40_000  # 10 MB: more than a pipe holds at once
        assert await run_isolated(lambda: big) == big

    async def test_what_it_changes_stays_in_the_child(self):
        seen: list[int] = []
        await run_isolated(lambda: seen.append(1) or b"")
        assert seen == []

    async def test_an_exception_comes_back_by_kind_and_message(self):
        def fails() -> bytes:
            raise StoreError("cannot write results to /x: No space left on device")

        with pytest.raises(ChildError, match="No space left") as caught:
            await run_isolated(fails)
        assert caught.value.kind == "StoreError"

    async def test_a_child_that_dies_without_an_answer_leaves_the_work_to_a_thread(self):
        def dies_in_the_child() -> bytes:
            if os.getpid() != PARENT:
                os.kill(os.getpid(), signal.SIGKILL)
            return pid_text()

        assert int(await run_isolated(dies_in_the_child)) == PARENT

    async def test_a_child_past_its_time_is_killed_and_a_thread_does_the_work(self):
        def hangs_in_the_child() -> bytes:
            if os.getpid() != PARENT:
                import time
                time.sleep(60)
            return pid_text()

        assert int(await run_isolated(hangs_in_the_child, timeout=0.5)) == PARENT

    async def test_the_loop_runs_while_the_child_works(self):
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        def slow() -> bytes:
            import time
            time.sleep(0.3)
            return b"done"

        ticker = asyncio.create_task(tick())
        try:
            assert await run_isolated(slow) == b"done"
        finally:
            ticker.cancel()
        assert ticks >= 10


class TestInThread:
    async def test_turned_off_by_the_environment(self, monkeypatch):
        monkeypatch.setenv(isolate.ENV, "0")
        assert not isolate.forking()
        assert int(await run_isolated(pid_text)) == PARENT

    async def test_an_exception_comes_back_the_same_way(self, monkeypatch):
        monkeypatch.setenv(isolate.ENV, "0")

        def fails() -> bytes:
            raise ValueError("bad")

        with pytest.raises(ChildError, match="bad") as caught:
            await run_isolated(fails)
        assert caught.value.kind == "ValueError"

    async def test_no_fork_to_be_had_is_a_thread(self, monkeypatch):
        def no_fork() -> int:
            raise OSError(11, "Resource temporarily unavailable")

        monkeypatch.setattr(os, "fork", no_fork)
        assert int(await run_isolated(pid_text)) == PARENT


class TestChildHoldsNothing:
    async def test_no_socket_of_the_parent_stays_open_in_the_child(self):
        import socket

        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        try:
            mine = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
            assert listener.fileno() in mine
            theirs = await run_isolated(lambda: " ".join(os.listdir("/proc/self/fd")).encode())
            open_in_child = {int(fd) for fd in theirs.split()}
            assert listener.fileno() not in open_in_child
            # Beyond stdin, stdout and stderr: the socket back, its inbox (`Child.send`), and
            # the listing's own.
            assert len(open_in_child - {0, 1, 2}) == 3 < len(set(mine) - {0, 1, 2})
        finally:
            listener.close()

    async def test_a_signal_to_the_child_is_not_the_parents(self):
        got: list[int] = []
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, lambda: got.append(1))
        try:
            def hup_myself() -> bytes:
                if os.getpid() != PARENT:
                    os.kill(os.getpid(), signal.SIGHUP)  # default action: the child ends
                return pid_text()

            # The child died of it (no answer: the work ran again in a thread) ...
            assert int(await run_isolated(hup_myself)) == PARENT
            await asyncio.sleep(0.1)
            assert got == []  # ... and the parent's handler never heard of it
        finally:
            loop.remove_signal_handler(signal.SIGHUP)


class TestCancelled:
    async def test_a_cancelled_wait_ends_the_child_and_leaks_no_descriptor(self):
        before = len(os.listdir("/proc/self/fd"))

        def sleeps_in_the_child() -> bytes:
            import time
            time.sleep(60)
            return b""

        task = asyncio.create_task(run_isolated(sleeps_in_the_child))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(os.listdir("/proc/self/fd")) == before
        assert zombies_of(os.getpid()) == []  # the child was reaped


class TestReaped:
    async def test_a_child_that_answered_is_reaped_as_it_goes(self):
        # Its answer is taken without waiting for it to be gone (`_reap_later`), and it is
        # still waited for: no zombie stays.
        for _ in range(3):
            pid = int(await run_isolated(lambda: str(os.getpid()).encode()))
            assert pid != PARENT
            assert await zombies_once_reaped(pid) == []


class TestLeftToExit:
    async def test_a_child_holds_what_it_leaves_to_its_exit_a_thread_does_not(self):
        # A stop's answer is millions of objects: a child frees them by exiting, not one by
        # one before its answer is read; where the work runs in a thread they are freed.
        def leaves() -> bytes:
            import weakref

            class Big:
                pass

            big = Big()
            seen = weakref.ref(big)
            leave_to_exit(big)
            del big
            return b"held" if seen() is not None else b"freed"

        assert await run_isolated(leaves) == b"held"
        assert await in_thread(leaves) == b"freed"


async def zombies_once_reaped(pid: int) -> list[int]:
    """`zombies_of(PARENT)` once the answered child `pid` is gone (it is waited for by a
    thread of its own, `_reap_later`, so not at once), or after 3 s if it is not."""
    for _ in range(300):
        if not os.path.exists(f"/proc/{pid}") and not zombies_of(PARENT):
            break
        await asyncio.sleep(0.01)
    return [*([pid] if os.path.exists(f"/proc/{pid}") else []), *zombies_of(PARENT)]


def zombies_of(parent: int) -> list[int]:
    """Children of `parent` that ended and were never waited for."""
    return children_of(parent, zombies_only=True)


def children_of(parent: int, *, zombies_only: bool = False) -> list[int]:
    """Processes whose parent is `parent` (only those that ended unwaited, `zombies_only`)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    stat = file.read()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == parent and (state == "Z" or not zombies_only):
                found.append(int(entry))
    return found


def summed(inbox) -> bytes:
    """The child's work in the streaming tests: its pid, then what its messages held."""
    total, count = 0, 0
    for number, padding in inbox:
        total, count = total * 31 % 1_000_003 + number, count + 1
        assert len(padding) == 1000
    return f"{os.getpid()} {count} {total}".encode()


def expected(numbers) -> str:
    total = 0
    for number in numbers:
        total = total * 31 % 1_000_003 + number
    return f"{len(numbers)} {total}"


class TestFedChild:
    """`Child.send`: messages to a child while it works, in order, never blocking the loop."""

    async def test_every_message_arrives_in_order(self):
        numbers = list(range(3000))  # 3 MB: far more than a pipe holds, sent without waiting
        async with forked(summed) as child:
            for number in numbers:
                child.send((number, b"x" * 1000))
            pid, rest = (await child.result() or b"").decode().split(" ", 1)
        assert int(pid) != PARENT and rest == expected(numbers)

    async def test_messages_sent_while_the_loop_runs_on(self):
        async with forked(summed) as child:
            for number in range(50):
                child.send((number, b"y" * 1000))
                await asyncio.sleep(0)
            assert (await child.result() or b"").decode().split(" ", 1)[1] == expected(range(50))

    async def test_a_child_dead_while_fed_gives_no_answer(self):
        def dies(inbox) -> bytes:
            next(inbox)
            os.kill(os.getpid(), signal.SIGKILL)
            return b""

        async with forked(dies) as child:
            for number in range(2000):
                child.send((number, b"z" * 1000))
                if number % 100 == 0:
                    await asyncio.sleep(0.01)
            assert await child.result() is None  # the caller does the work itself
        assert zombies_of(os.getpid()) == []

    async def test_a_child_that_stops_reading_is_killed_past_its_time(self):
        # Its inbox never drains: the wait for it ends at the timeout, the child with it.
        def never_reads(_inbox) -> bytes:
            time.sleep(60)
            return b""

        before = len(os.listdir("/proc/self/fd"))
        async with forked(never_reads) as child:
            for number in range(3000):  # 3 MB: more than the pipe holds
                child.send((number, b"w" * 1000))
            await asyncio.sleep(0)  # the first write fills the pipe
            assert await child.result(timeout=0.5) is None
        assert len(os.listdir("/proc/self/fd")) == before
        assert zombies_of(os.getpid()) == []

    async def test_no_child_drops_the_messages_and_gives_no_answer(self, monkeypatch):
        monkeypatch.setenv(isolate.ENV, "0")
        async with forked(summed) as child:
            child.send((1, b"x" * 1000))
            assert await child.result() is None

    async def test_leaving_without_the_result_ends_the_child(self):
        before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(RuntimeError, match="the stop failed"):
            async with forked(summed) as child:
                child.send((1, b"x" * 1000))
                raise RuntimeError("the stop failed")
        assert len(os.listdir("/proc/self/fd")) == before
        assert zombies_of(os.getpid()) == []


class TestFrame:
    """The child's answer is one length-prefixed frame: whatever its bytes, as they were."""

    @pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 65_537, 3_000_000])
    async def test_any_size_comes_back_whole(self, size):
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        before = set(children_of(PARENT))
        async with forked(lambda _inbox: data) as child:
            (pid,) = set(children_of(PARENT)) - before
            assert await child.result() == data
        assert await zombies_once_reaped(pid) == []


class TestSpareCores:
    """What decides whether a stop's child works beside the scrapes (`stop.streams_stops`)."""

    def test_the_cpus_this_process_may_run_on_less_one(self, tmp_path):
        cpus = len(os.sched_getaffinity(0))
        assert isolate.spare_cores(tmp_path / "no such file") == cpus - 1

    def test_a_container_quota_caps_them(self, tmp_path):
        limit = tmp_path / "cpu.max"
        limit.write_text("150000 100000\n")  # 1.5 CPUs
        assert isolate.spare_cores(limit) == min(len(os.sched_getaffinity(0)), 1.5) - 1
        limit.write_text("max 100000\n")  # no quota
        assert isolate.spare_cores(limit) == len(os.sched_getaffinity(0)) - 1
        limit.write_text("garbage")
        assert isolate.spare_cores(limit) == len(os.sched_getaffinity(0)) - 1


class TestForkSafety:
    """The child takes no lock a thread of the parent may hold at the fork, and dies with it."""

    async def test_the_child_finishes_while_threads_hold_logging_and_sqlite(self, tmp_path):
        with held_logging(), busy_sqlite(tmp_path / "busy.db"):
            answer = await run_isolated(lambda: b"done in " + pid_text(), timeout=60)
        # A child that had logged would wait forever on the stream's lock: killed past its
        # time, and the work done by a thread of this process instead.
        assert answer.startswith(b"done in ") and answer != b"done in " + pid_text()

    async def test_a_real_stop_is_answered_by_its_child_while_threads_hold_them(self, tmp_path):
        # The stop's own work, forked early and fed as a stop feeds it, while one thread is in
        # the middle of a log record and another writes in a SQLite transaction: the answer
        # comes from the child (a thread fallback is the book's, not `Child.result`'s).
        window, finals, stop = open_window(20)
        with held_logging(), busy_sqlite(tmp_path / "busy.db"):
            codec = ResultCodec()
            async with forked(stop_work(window, tmp_path / "w")) as child:
                for result in finals:
                    child.send((FINAL, codec.pack(result)))
                    await asyncio.sleep(0)
                child.send((END, stop, {}))
                data = await child.result(timeout=60)
        assert data is not None
        kept, row, answer = read_stop(data)
        assert kept["id"] == window.id and len(json.loads(answer)["results"]) == 20
        assert window.stopped_at is None  # the child's copy was stopped, not this one
        assert len(os.listdir(tmp_path / "w" / "performances")) == 20

    def test_a_child_dies_with_its_killed_parent(self, tmp_path):
        import subprocess
        import sys

        script = (
            "import asyncio, time\n"
            "from exporter.server.isolate import Child\n"
            "def work(inbox):\n"
            "    time.sleep(3600)\n"  # never reads its inbox: only its parent's death ends it
            "    return b''\n"
            "async def main():\n"
            "    child = Child(work)\n"
            "    child.start()\n"
            "    print(child._pid, flush=True)\n"
            "    await asyncio.sleep(3600)\n"
            "asyncio.run(main())\n"
        )
        parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                  text=True)
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert os.path.exists(f"/proc/{child}")
        parent.kill()
        parent.wait()
        parent.stdout.close()
        for _ in range(600):  # the kernel delivers the signal at once; reaped by init after
            if not os.path.exists(f"/proc/{child}") or _state(child) == "Z":
                break
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{child}") or _state(child) == "Z"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@contextlib.contextmanager
def held_logging() -> Iterator[None]:
    """A root handler whose lock, and whose stream's lock, a thread holds: it is writing a
    record to a pipe nobody reads (a stalled log collector). A record of a forked child comes
    to it; this process's own records pass it by (else the test's own logging would hang)."""
    read_end, write_end = os.pipe()
    handler = logging.StreamHandler(os.fdopen(write_end, "w"))
    handler.addFilter(lambda record: os.getpid() != PARENT or record.name == "held")
    logging.getLogger().addHandler(handler)
    writer = threading.Thread(target=logging.getLogger("held").error, args=("x" * 300_000,))
    writer.start()
    try:
        capacity = fcntl.fcntl(read_end, 1032)  # F_GETPIPE_SZ
        while _unread(read_end) < capacity:  # the writer is blocked in the middle of its write
            time.sleep(0.01)
        assert not handler.lock.acquire(blocking=False)  # the writer holds it
        yield
    finally:
        drain = threading.Thread(target=lambda: [None for _ in iter(
            lambda: os.read(read_end, 1 << 16), b"")])
        drain.start()
        writer.join()
        logging.getLogger().removeHandler(handler)
        handler.close()
        handler.stream.close()
        drain.join()
        os.close(read_end)


def _unread(fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


@contextlib.contextmanager
def busy_sqlite(path) -> Iterator[None]:
    """A thread holding a write transaction of a SQLite file open, writing in it as it goes."""
    begun, done = threading.Event(), threading.Event()

    def write() -> None:
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("CREATE TABLE t (x)")
        db.execute("BEGIN IMMEDIATE")
        begun.set()
        while not done.is_set():
            db.execute("INSERT INTO t VALUES (randomblob(1000))")
        db.execute("ROLLBACK")
        db.close()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        begun.wait()
        yield
    finally:
        done.set()
        thread.join()
