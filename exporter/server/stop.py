"""A stop's answer made by a child process while the stop's scrapes still come in.

A stop over 1000 targets scrapes every target and then made its answer (the RESULTs, their
advice, the texts and files: about as long again). Where the server has a core to spare, a
child forked as the stop begins takes each target's stop scrape as it arrives (`Child.send`)
and makes that target's RESULT, advice, texts and file on that core meanwhile; once the last
scrape is in, only the aggregate and the splicing of the texts are left (`streamed_answer`);
the files are written once the parent has the answer, while it saves it.

The server's own window then only marks each stop scrape taken, and takes them itself where
the child gives no answer or the stop fails (`book`). Forked after the scrapes (no core to
spare), or with no child at all, the answer is made in one go from a window that took them
(`whole_answer`); tests compare the ways.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from exporter.analysis.advise import result_advice, window_advice
from exporter.core.results import AnswerParts, window_answer
from exporter.server.isolate import Staged, leave_to_exit, spare_cores
from exporter.state.answertext import AnswerTexts, StopTexts, TextParts
from exporter.core.snapshot import (
    Field,
    ScrapeResult,
    SeriesKey,
    Snapshot,
    pack_values,
    unpack_values,
)
from exporter.state.store import PreparedFiles, encode_doc, prepare_results, write_results
from exporter.core.window import Window

log = logging.getLogger(__name__)

# Message kinds (`Child.send`): a target's stop scrape, a scrape of the window taken while the
# stop is under way (before that target's stop scrape), and the stop's end (its time, and the
# window's removed targets).
FINAL, FEED, END = "final", "feed", "end"


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
    packed doubles, against its keys in order (its shape), sent once by number. Pickling a
    `SeriesKey` (a named tuple with an enum) took 80 us a result; a pair per series, 5-15 us
    to pack and to unpack; the doubles, a few."""

    def __init__(self) -> None:
        self._ids: dict[tuple[SeriesKey, ...], int] = {}  # the packer's shapes
        # Per target, the shape of its last values and of its last `_created` times.
        self._last: tuple[dict[str, _Shape], dict[str, _Shape]] = ({}, {})
        self._shapes: list[tuple[SeriesKey, ...]] = []  # the unpacker's, by number

    def pack(self, result: ScrapeResult) -> _Packed:
        """`result` as tuples of strings, numbers and bytes (`unpack` on the other side, in
        order)."""
        snapshot = result.snapshot
        if snapshot is None:
            return (result.target, result.at, result.duration, result.error, result.size, None)
        values, created = snapshot.values, snapshot.created
        return (result.target, result.at, result.duration, result.error, result.size,
                (self._shape(self._last[0], result.target, values), pack_values(values),
                 self._shape(self._last[1], result.target, created), pack_values(created),
                 dict(snapshot.gauges), snapshot.dialect, snapshot.duplicates))

    def _shape(self, last: dict[str, _Shape], target: str, mapping: Mapping[SeriesKey, float]
               ) -> int | list[tuple[Any, ...]]:
        """The number of `mapping`'s shape; the first time, its keys' fields (numbered in
        the order they are sent)."""
        keys = tuple(mapping)
        held = last.get(target)
        if held is not None and held[0] == keys:  # the usual case: compared, not hashed
            return held[1]
        known = self._ids.get(keys)
        new = known is None
        if known is None:
            known = self._ids[keys] = len(self._ids)
        last[target] = (keys, known)
        if new:
            return [(k.field.value, k.model_name, k.engine, k.position, k.extra) for k in keys]
        return known

    def unpack(self, packed: _Packed) -> ScrapeResult:
        """The result `pack` was given."""
        target, at, duration, error, size, page = packed
        if page is None:
            return ScrapeResult(target, at, duration, None, error, size)
        values_shape, values, created_shape, created, gauges, dialect, duplicates = page
        snapshot = Snapshot(values=self._mapping(values_shape, values),
                            created=self._mapping(created_shape, created),
                            gauges=gauges, dialect=dialect, duplicates=duplicates)
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


def streamed_answer(window: Window, directory: Path, file_names: Mapping[str, str]
                    ) -> Callable[[Iterator[Any]], Staged]:
    """The child's work (`Child(work)`): the messages in, the answer made and encoded, then
    written (`Staged`: the parent saves the answer while the files are written).

    `window` is the child's copy, as it was at the fork; the messages bring it up to the
    parent's. Runs in a forked child: no logging, no locks.
    """

    def work(inbox: Iterator[Any]) -> Staged:
        codec, parts, texts = ResultCodec(), AnswerParts(window, ADVICE), TextParts(file_names)
        files = PreparedFiles(directory)
        try:
            ended = False
            for message in inbox:
                kind = message[0]
                if kind == FINAL:
                    result = codec.unpack(message[1])
                    window.take_stop_scrape(result)
                    name = result.target
                    if name in window.targets:
                        _, body, advice = parts.target(name)
                        piece = texts.target(name, body, advice)
                        if name in file_names:
                            files.write(file_names[name], piece.file)
                elif kind == FEED:
                    window.feed(codec.unpack(message[1]))
                elif kind == END:
                    # What the server's window changed without a scrape: a reload's removals.
                    _, window.stopped_at, window.removed = message
                    ended = True
            if not ended:
                # The inbox ended without the stop's end: the server died under the stop
                # (kill -9). Its window is still open in the state database, and it will be
                # stopped again; no half-made answer goes to the files meanwhile.
                raise RuntimeError("the stop was cut short: no end of it came")
            answer = parts.answer()
            encoded = texts.texts(answer)
            done = _stop_texts(window, answer, encoded.compact)
        except BaseException:
            files.close()
            raise

        def write() -> None:
            try:
                # Not synced: the state database, synced meanwhile, holds the same answer.
                write_results(directory, encoded, ahead=files.written, sync=False)
            finally:
                files.close()
                leave_to_exit(parts, texts, answer, encoded, codec)

        return Staged(done, write)

    return work


def whole_answer(window: Window, directory: Path) -> Staged:
    """A stopped window's answer made, written and encoded in one go (the parent's window,
    every scrape in): where there is no child. `StoreError` if its files cannot be written."""
    answer = window_answer(window, ADVICE)
    texts = AnswerTexts.of(answer)
    write_results(directory, texts, sync=False)
    done = _stop_texts(window, answer, texts.compact)
    leave_to_exit(answer, texts)
    return Staged(done)


def _stop_texts(window: Window, answer: Mapping[str, Any], text: bytes) -> list[bytes]:
    """`StopTexts` as parts: with the window's state row (the child's window is the one fed
    the stop's scrapes: the parent's is not, `book`)."""
    row = encode_doc(window.to_dict(accumulators=False))
    return StopTexts(text, StopTexts.kept_of(answer), (row.before, row.after)).parts()


STREAMED_ENV = "SPECDEC_STOP_STREAMED"


def streams_stops() -> bool:
    """Whether a stop's child is fed its scrapes as they come (a core to spare for it), or
    forked after them; `SPECDEC_STOP_STREAMED=1` or `0` says which (tests, the bench)."""
    said = os.environ.get(STREAMED_ENV)
    if said in ("0", "1"):
        return said == "1"
    return spare_cores() >= 1


def take_stop_scrapes(window: Window, results: list[ScrapeResult]) -> None:
    """The stop's scrapes taken by the parent's window (the child's took them as they came
    in), once: `results` is emptied."""
    window.take_stop_scrapes_late(results)
    results.clear()


def prepare_quietly(directory: Path, names: list[str]) -> None:
    # A speed-up only: if the files cannot be made ahead, the stop makes them (and says why).
    try:
        prepare_results(directory, names)
    except OSError as exc:
        log.warning("result files not made ahead dir=%s error=%s", directory, exc)
