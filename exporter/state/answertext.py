"""A stop answer's texts, each encoded once: the result files, window.json, the API's JSON.
What orjson refuses (an integer beyond 64 bits, which a hostile page can send) takes the
stdlib's way. Pure: no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from exporter.core.aisbench import result_file_names

_INDENTED = orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE


@dataclass(frozen=True)
class AnswerTexts:
    """What a stopped window's answer is written and sent as (UTF-8)."""

    files: dict[str, bytes]  # file name (`result_file_names`) -> the RESULT file's text
    whole: bytes  # window.json: the answer indented
    compact: bytes  # the answer on one line: the HTTP answer's body and the state DB's `answer`

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> AnswerTexts:
        """Encode a stop answer (`stopanswer.AnswerParts`)."""
        names = result_file_names(answer["results"])
        return cls(files={names[name]: indented(result)
                          for name, result in answer["results"].items()},
                   whole=indented(answer), compact=compact(answer))


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


def stopped_row(doc: Mapping[str, Any], answer: bytes) -> tuple[bytes, slice]:
    """A stopped window's state row (`json.dumps` of `doc`, never empty) with `answer`, its
    compact text, put in as is as the last member; and where in the row that text lies."""
    head = json.dumps({k: v for k, v in doc.items() if k != "answer"}).encode()[:-1]
    row = b"".join((head, b', "answer": ', answer, b"}"))
    start = len(head) + len(b', "answer": ')
    return row, slice(start, start + len(answer))
