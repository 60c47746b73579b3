"""What a restart or a lost state database gets back: stored windows read with their errors
said, result files written again from the state, and a stopped window's state from its files."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.core.errors import StoreError
from exporter.core.kept import StoppedWindow
from exporter.core.window import TargetRef, Window
from exporter.state.answertext import AnswerTexts
from exporter.state.resultfiles import write_results
from exporter.state.store import StateStore

log = logging.getLogger(__name__)

# The stopped windows a restart looks at (`write_lost_results`), as many as memory lists.
RECENT_WINDOWS = 50
# Stops whose result files a restart checks: within this many seconds of the newest one.
LOST_FILES_SPAN = 300.0


def write_lost_results(store: StateStore, results_dir: Callable[[str], Path]) -> None:
    """Result files written again from the state database where window.json is missing or
    empty (a stop syncs only the database), for stops within `LOST_FILES_SPAN` of the newest:
    older ones were on the disk long before, and a folder removed by hand stays removed."""
    recent = store.recent_stopped_fields(RECENT_WINDOWS)
    newest = max((w["stopped_at"] for w in recent), default=0.0)
    for fields in recent:
        directory = results_dir(fields["id"])
        path = directory / "window.json"
        with contextlib.suppress(OSError):
            if fields["stopped_at"] < newest - LOST_FILES_SPAN or path.stat().st_size:
                continue
        doc = store.load(fields["id"], series=False)
        try:
            if doc is None or not isinstance(doc.get("answer"), dict):
                raise TypeError("no answer in the state database")
            write_results(directory, AnswerTexts.of(doc["answer"]))
        except (StoreError, KeyError, TypeError, AttributeError) as exc:
            log.error("result files not written again id=%s error=%r", fields["id"], exc)
            continue
        log.warning("result files written again from the state database id=%s dir=%s",
                    fields["id"], directory)


def doc_from_files(directory: Path, window: StoppedWindow) -> dict[str, Any] | None:
    """A stopped window's state as its `window.json` holds it (its answer), or None."""
    try:
        answer = json.loads((directory / "window.json").read_bytes())
        targets = {name: TargetRef(name, r["url"], r["host_port"])
                   for name, r in answer["results"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.error("stopped window not written back id=%s error=cannot read %s: %r",
                  window.id, directory / "window.json", exc)
        return None
    return Window(id=window.id, name=window.name, targets=targets, labels=dict(window.labels),
                  started_at=window.started_at, stopped_at=window.stopped_at,
                  answer=answer).to_dict()


def window_from(doc: dict[str, Any]) -> Window:
    """A stored window, or `StoreError` when its state does not have a window's shape."""
    try:
        return Window.from_dict(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoreError(f'window "{doc.get("id")}" state is unreadable: {exc!r}') from exc
