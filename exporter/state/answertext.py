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
    def of(cls, answer: Mapping[str, Any], pieces: Pieces | None = None) -> AnswerTexts:
        """Encode a stop answer (`stopanswer.AnswerParts`), with the RESULTs and advice
        `pieces` holds encoded already."""
        pieces = pieces or Pieces()
        names = result_file_names(answer["results"])
        files = {names[name]: pieces.result(name, result)
                 for name, result in answer["results"].items()}
        whole, one_line = pieces.framed(answer)
        try:
            return cls(files=files, whole=orjson.dumps(whole, option=_INDENTED),
                       compact=orjson.dumps(one_line))
        except orjson.JSONEncodeError:  # the stdlib's way takes no fragment: the plain answer
            return cls(files=files, whole=indented(answer), compact=compact(answer))


class Pieces:
    """A stop answer's RESULTs and their advice, each encoded once as it is made (a stop's
    child has a core to spare while its scrapes come in, not after them): a RESULT's file text,
    and each one's part of the answer's whole and compact texts (`AnswerTexts.of`)."""

    def __init__(self) -> None:
        # name -> (the RESULT, its file text, its part indented in the whole, compact)
        self._results: dict[str, tuple[Any, bytes, orjson.Fragment, orjson.Fragment]] = {}
        self._advice: dict[str, tuple[Any, orjson.Fragment, orjson.Fragment]] = {}

    def result(self, name: str, body: Mapping[str, Any]) -> bytes:
        """The file text of target `name`'s RESULT `body`, encoded again only for another
        object than the last one."""
        held = self._results.get(name)
        if held is None or held[0] is not body:
            text = indented(body)
            held = self._results[name] = (body, text, _nested(text, _RESULT_DEPTH),
                                          orjson.Fragment(compact(body)))
        return held[1]

    def advice(self, name: str, advice: Mapping[str, Any] | None) -> None:
        """Target `name`'s advice (`advise.result_advice`), encoded now."""
        held = self._advice.get(name)
        if held is None or held[0] is not advice:
            self._advice[name] = (advice, _nested(indented(advice), _ADVICE_DEPTH),
                                  orjson.Fragment(compact(advice)))

    def framed(self, answer: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """`answer` twice, for its whole and its compact text: each RESULT and advice held
        here (the same object) replaced by its encoded part."""
        whole, one_line = dict(answer), dict(answer)
        whole["results"], one_line["results"] = _parts(answer["results"], self._results)
        advice = answer.get("advice")
        if isinstance(advice, Mapping) and isinstance(advice.get("results"), Mapping):
            indented_parts, compact_parts = _parts(advice["results"], self._advice)
            whole["advice"] = {**advice, "results": indented_parts}
            one_line["advice"] = {**advice, "results": compact_parts}
        return whole, one_line


def _parts(values: Mapping[str, Any], held: Mapping[str, tuple[Any, ...]]
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """`values` (per target, a RESULT or advice) with each one held as the same object in
    `held` replaced by its indented part, then by its compact part."""
    indented_parts, compact_parts = {}, {}
    for name, value in values.items():
        piece = held.get(name)
        if piece is not None and piece[0] is value:
            indented_parts[name], compact_parts[name] = piece[-2], piece[-1]
        else:
            indented_parts[name] = compact_parts[name] = value
    return indented_parts, compact_parts


# How deep a RESULT (answer["results"][name]) and its advice (answer["advice"]["results"]
# [name]) sit in the answer: their indented text, made alone, is shifted by two spaces a level.
_RESULT_DEPTH, _ADVICE_DEPTH = 2, 3


def _nested(text: bytes, depth: int) -> orjson.Fragment:
    """`indented` text of a value, as it reads `depth` levels down in an indented document
    (a JSON text has no raw newline in a string: each is a line break)."""
    return orjson.Fragment(text.removesuffix(b"\n").replace(b"\n", b"\n" + b"  " * depth))


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
