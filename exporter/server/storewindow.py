"""A window counted from a store's raw samples, made off the loop as a stop's answer is: read,
counted, its files written and its state row made by one work function in a forked child
(`isolate.Child`, else a thread); the book commits it as it commits a stop (`WindowBook.made`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from exporter.core.storecount import CountError, history_answer
from exporter.core.window import TargetRef, Window
from exporter.scrape.storequery import (
    CHUNK_SECONDS,
    HistoryError,
    HistoryQuery,
    StoreStatusError,
    fetch_series,
    selectors,
)
from exporter.server.isolate import leave_to_exit
from exporter.server.stop import work_bytes
from exporter.state.answertext import AnswerTexts
from exporter.state.resultfiles import ResultFolder

# What a failed read raises (by class name, as a child reports it): the store's fault, not ours.
STORE_FAULTS = frozenset(e.__name__ for e in (HistoryError, StoreStatusError, CountError))


def read_budget(query: HistoryQuery) -> float:
    """Seconds a read may take at most: every query it plans at its own timeout, and a minute."""
    queries = len(selectors(query.match)) * (math.ceil((query.to - query.frm) / CHUNK_SECONDS)
                                             + 1)
    return 60.0 + queries * query.timeout


def history_work(query: HistoryQuery, window: Window, by: Sequence[str],
                 directory: Path) -> Callable[[Iterator[Any]], bytes]:
    """The work (`Child(work)`, or `in_thread`) of `window` (its id, name and range) counted
    from the store: its bytes are `stop.read_stop`'s, as a stop's are."""

    def work(inbox: Iterator[Any]) -> bytes:
        read = fetch_series(query)
        answer = history_answer(read.series, query.frm, query.to, query_url=query.url, by=by,
                                name=window.name, window_id=window.id, notes=read.notes,
                                scraped=read.scraped) | {"results_dir": str(directory.resolve())}
        made = Window(id=window.id, name=window.name, labels={}, started_at=query.frm,
                      stopped_at=query.to,
                      targets={t: TargetRef(t, t, t) for t in answer["results"]})
        encoded = AnswerTexts.of(answer)
        # Not synced: the state database, synced at the commit, holds the same answer.
        ResultFolder(directory).finish(encoded, sync=False)
        leave_to_exit(read, answer, encoded)
        return work_bytes(made, answer, encoded.compact)

    return work
