"""A stop answer's texts, each encoded once: the result files, window.json, the API's JSON.

orjson encodes them: a 1000-target answer (~5 MB) in ~15 ms, where the stdlib's indented
encoder (pure Python generators before 3.14) took 0.3-0.7 s of the stop. The layout is
`json.dumps(indent=2, ensure_ascii=False)`'s, values bit for bit; only a float under 1e-4 or
from 1e16 is spelt differently (`0.00002151407774822478`, `1e16`: the same double, as any JSON
reader reads it). A value orjson refuses (an integer beyond 64 bits, which a hostile page can
send) takes the stdlib's way instead: slower, never wrong. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from exporter.results import result_file_names
from exporter.stopped import brief_aggregate

_INDENTED = orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE


@dataclass(frozen=True)
class AnswerTexts:
    """What a stopped window's answer is written and sent as (UTF-8)."""

    files: dict[str, bytes]  # file name (`result_file_names`) -> the RESULT file's text
    whole: bytes  # window.json: the answer indented
    compact: bytes  # the answer on one line: the HTTP answer's body and the state DB's `answer`

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> AnswerTexts:
        """Encode a stop answer (`results.window_answer`)."""
        names = result_file_names(answer["results"])
        return cls(files={names[name]: indented(result)
                          for name, result in answer["results"].items()},
                   whole=indented(answer), compact=compact(answer))


@dataclass(frozen=True)
class StopTexts:
    """What a stop's work hands back through a pipe: the answer's compact text, and what
    memory keeps of it; `encode` and `parse` are each other's inverse."""

    compact: bytes
    kept: dict[str, Any]  # the fields `StoppedWindow.of` and `LastWindow.of` read

    def encode(self) -> bytes:
        kept = compact(self.kept)
        return len(kept).to_bytes(8, "big") + kept + self.compact

    @staticmethod
    def kept_of(answer: Mapping[str, Any]) -> dict[str, Any]:
        """Of a stop answer, what `StoppedWindow.of` and `LastWindow.of` read: its head, the
        aggregate's figures, each ok target's increase (~1 MB of 5 at 1000 targets)."""
        kept = {k: answer[k] for k in ("id", "name", "targets", "labels", "started_at",
                                       "stopped_at")}
        return kept | {
            "aggregate": brief_aggregate(answer["aggregate"]),
            "results": {name: {"status": r["status"], "increase": r["increase"]}
                        for name, r in answer["results"].items()
                        if r["status"] == "ok" and r.get("increase")},
        }

    @classmethod
    def parse(cls, data: bytes) -> StopTexts:
        size = int.from_bytes(data[:8], "big")
        return cls(compact=data[8 + size:], kept=json.loads(data[8:8 + size]))


def indented(value: Any) -> bytes:
    """`json.dumps(value, indent=2, ensure_ascii=False) + "\\n"`, UTF-8, as orjson writes it."""
    try:
        return orjson.dumps(value, option=_INDENTED)
    except orjson.JSONEncodeError:  # a TypeError: an int beyond 64 bits, say
        return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()


def compact(value: Any) -> bytes:
    """`value` as JSON on one line, UTF-8, as orjson writes it."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def with_key(text: bytes, key: str, value: Any) -> bytes:
    """The text of `answer | {key: value}` from `text`, the compact text of `answer`; `key` new.

    The stop answer adds `results_dir` (where this exporter wrote the files) to the text
    encoded once at the stop, instead of encoding megabytes again.
    """
    if not text.startswith(b"{") or not text.endswith(b"}"):
        raise ValueError("not the text of a JSON object")
    tail = compact({key: value})[1:]
    return text[:-1] + (b"," if text != b"{}" else b"") + tail
