"""A stop's answer, made by one work function (`stop_work`) while or after its scrapes come in:
in a child forked as the stop begins (a core to spare), fed each stop scrape as it arrives, else
forked after them, else in a thread. The server's window takes them too: a failed stop reopens
it as it is."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from exporter.analysis.advise import result_advice, window_advice
from exporter.core.aisbench import result_file_names
from exporter.core.kept import kept_of
from exporter.core.snapshot import (
    Field,
    ScrapeResult,
    SeriesKey,
    Snapshot,
    pack_values,
    unpack_values,
)
from exporter.core.stopanswer import AnswerParts
from exporter.core.window import Window
from exporter.server.isolate import Child, leave_to_exit, spare_cores
from exporter.state.answertext import AnswerTexts, Pieces, stopped_row
from exporter.state.resultfiles import ResultFolder

# Message kinds (`Child.send`): a target's stop scrape, a scrape the window took meanwhile, a
# proxied request it took meanwhile, and the stop's end (its time, and the removed targets).
FINAL, FEED, RECORD, END = "final", "feed", "record", "end"


class Advice:
    """A stop answer's advice (`results.Advisor`), with the advisor's default draft costs."""

    def result(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        return result_advice(body)

    def window(self, answer: Mapping[str, Any],
               made: Mapping[str, dict[str, Any] | None]) -> dict[str, Any]:
        return window_advice(answer, made=made)


ADVICE = Advice()

_Packed = tuple[Any, ...]
_Shape = tuple[tuple[SeriesKey, ...], int]  # a page's keys in order, and their number


class ResultCodec:
    """Scrape results as plain tuples for a pipe: a page's values and `_created` times as
    packed doubles, against its keys in order (its shape), sent once then by number (pickling
    each `SeriesKey` would cost the loop more)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[SeriesKey, ...], int] = {}  # the packer's shapes
        # Per target, the shape of its last values and of its last `_created` times.
        self._last: tuple[dict[str, _Shape], dict[str, _Shape]] = ({}, {})
        self._shapes: list[tuple[SeriesKey, ...]] = []  # the unpacker's, by number

    def pack(self, result: ScrapeResult) -> _Packed:
        """`result` as tuples of strings, numbers and bytes (`unpack`s, in order)."""
        snapshot = result.snapshot
        if snapshot is None:
            return (result.target, result.at, result.duration, result.error, result.size, None)
        values, created = snapshot.values, snapshot.created
        return (result.target, result.at, result.duration, result.error, result.size,
                (self._shape(self._last[0], result.target, values), pack_values(values),
                 self._shape(self._last[1], result.target, created), pack_values(created),
                 dict(snapshot.gauges), snapshot.dialect, snapshot.duplicates, snapshot.read,
                 snapshot.running))

    def _shape(self, last: dict[str, _Shape], target: str, mapping: Mapping[SeriesKey, float]
               ) -> int | list[tuple[Any, ...]]:
        """The number of `mapping`'s shape; the first time, its keys' fields."""
        keys = tuple(mapping)
        held = last.get(target)
        if held is not None and held[0] == keys:  # the usual case: compared, not hashed
            return held[1]
        known = self._ids.get(keys)
        if known is not None:
            last[target] = (keys, known)
            return known
        last[target] = (keys, self._ids.setdefault(keys, len(self._ids)))
        return [(k.field.value, k.model_name, k.engine, k.position, k.extra) for k in keys]

    def unpack(self, packed: _Packed) -> ScrapeResult:
        target, at, duration, error, size, page = packed
        if page is None:
            return ScrapeResult(target, at, duration, None, error, size)
        values_shape, values, created_shape, created, gauges, dialect, duplicates, read, running = (
            page)
        snapshot = Snapshot(values=self._mapping(values_shape, values),
                            created=self._mapping(created_shape, created),
                            gauges=gauges, dialect=dialect, duplicates=duplicates, read=read,
                            running=running)
        return ScrapeResult(target, at, duration, snapshot, error, size)

    def _mapping(self, shape: int | list[tuple[Any, ...]], numbers: bytes
                 ) -> dict[SeriesKey, float]:
        if isinstance(shape, int):
            keys = self._shapes[shape]
        else:  # a new shape: the next number
            keys = tuple(SeriesKey(Field(name), model, engine, position,
                                   tuple(tuple(pair) for pair in extra))
                         for name, model, engine, position, extra in shape)
            self._shapes.append(keys)
        return unpack_values(keys, numbers)


class StopScrapes:
    """A stop's scrapes as they come in. With a child forked early (`forked`) it takes them:
    the server's window only marks each target final (it takes no later scrape of it) and
    holds the scrape, taken (`take_held`) only if no answer comes from the child. Else the
    window takes them (a child forked late copies it)."""

    def __init__(self, window: Window, child: Child, codec: ResultCodec):
        self.window, self.child, self.codec = window, child, codec
        self.forked = False
        self._held: list[tuple[ScrapeResult, bool]] = []  # and whether it counts

    def take(self, result: ScrapeResult) -> None:
        window = self.window
        if not self.forked:
            window.take_stop_scrape(result)
            return
        self._held.append((result, window.hold_stop_scrape(result.target)))
        self.child.send((FINAL, self.codec.pack(result)))

    def take_held(self) -> None:
        """The held scrapes into the window, as it would have taken them as they came."""
        for result, takes in self._held:
            self.window.take_stop_scrape(result, takes)
        self._held.clear()


def stop_work(window: Window, directory: Path) -> Callable[[Iterator[Any]], bytes]:
    """A stop's work (`Child(work)`, or `in_thread`): `work(inbox)` takes what `window` has not
    taken of the stop (`FINAL`, `FEED`, `RECORD`, `END`), writing each RESULT's file as it
    comes, then the whole answer (its `results_dir` the `directory`); its bytes are for
    `read_stop`. `StoreError` if the files cannot be written."""

    def work(inbox: Iterator[Any]) -> bytes:
        codec, parts, folder = ResultCodec(), AnswerParts(window, ADVICE), ResultFolder(directory)
        names = result_file_names({name: {"host_port": ref.host_port}
                                   for name, ref in window.targets.items()})
        pieces = Pieces()  # each RESULT and advice encoded as it is made
        try:
            ended = False
            for message in inbox:
                if message[0] == FINAL:
                    result = codec.unpack(message[1])
                    window.take_stop_scrape(result)
                    if (name := result.target) in window.targets:
                        _, body, advice = parts.target(name)
                        folder.write(names[name], pieces.result(name, body))
                        pieces.advice(name, advice)
                elif message[0] == FEED:
                    window.feed(codec.unpack(message[1]))
                elif message[0] == RECORD:
                    window.record(*message[1:])
                elif message[0] == END:
                    # What the server's window changed without a scrape: a reload's removals.
                    _, window.stopped_at, window.removed = message
                    ended = True
            if not ended:
                # The server died under the stop (kill -9): its window stays open in the state
                # database, and no half-made answer goes to the files.
                raise RuntimeError("the stop was cut short: no end of it came")
            answer = parts.answer() | {"results_dir": str(directory.resolve())}
            encoded = AnswerTexts.of(answer, pieces)
            # Not synced: the state database, synced next, holds the same answer.
            folder.finish(encoded, sync=False)
        except BaseException:
            folder.discard()
            raise
        leave_to_exit(parts, answer, encoded, codec, pieces)
        return work_bytes(window, answer, encoded.compact)

    return work


def work_bytes(window: Window, answer: Mapping[str, Any], text: bytes) -> bytes:
    """What a stop's (or a history window's) work answers: what memory keeps of `answer`, and
    the state row of `window` with `text`, the answer's compact text (`read_stop`)."""
    row, at = stopped_row(window.to_dict(), text)
    return pickle.dumps((kept_of(answer), row, at.start, at.stop), protocol=pickle.HIGHEST_PROTOCOL)


def read_stop(data: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    """`work_bytes` as what memory keeps, the state row and the answer's compact text."""
    # Pickled, so the parent makes only what it keeps; the bytes are our own child's.
    kept, row, start, stop = pickle.loads(data)
    return kept, row, row[start:stop]


def forks_early() -> bool:
    """Whether a stop's child is forked as the stop begins (a core to spare), or after its
    scrapes; `SPECDEC_STOP_STREAMED=1` or `0` says which."""
    said = os.environ.get("SPECDEC_STOP_STREAMED")
    if said in ("0", "1"):
        return said == "1"
    return spare_cores() >= 1
