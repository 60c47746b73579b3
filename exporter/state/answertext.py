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
import pickle
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from exporter.core.results import result_file_names
from exporter.core.stopped import PackedIncreases, brief_aggregate

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


class TextParts:
    """A stop answer's texts encoded target by target, as its RESULTs are made
    (`results.AnswerParts`): `texts` then splices the pieces into the texts of the whole answer
    instead of encoding it all again. The bytes are those of `AnswerTexts.of` (tests compare).
    """

    def __init__(self, file_names: Mapping[str, str] | None = None) -> None:
        # Target name -> its file's name (`result_file_names`), when known already.
        self._file_names = file_names or {}
        self._pieces: dict[str, _Piece] = {}
        # Stand-ins for the two spliced objects: a NUL and a random token, in no real text.
        token = secrets.token_hex(8)
        self._marks = (f"\x00{token}r", f"\x00{token}a")

    def target(self, name: str, result: Mapping[str, Any],
               advice: Mapping[str, Any] | None) -> _Piece:
        """One target's RESULT and advice encoded, again only if they are other objects than
        last time (its `file` is the text of its file)."""
        piece = self._pieces.get(name)
        if piece is None or piece.result is not result or piece.advice is not advice:
            piece = self._pieces[name] = _Piece.of(name, result, advice)
        return piece

    def texts(self, answer: Mapping[str, Any]) -> AnswerTexts:
        """`AnswerTexts.of(answer)`, its RESULTs and their advice from the pieces."""
        advice = answer["advice"]
        pieces = [self.target(name, body, advice["results"][name])
                  for name, body in answer["results"].items()]
        if any(p.compact is None for p in pieces):
            return AnswerTexts.of(answer)  # orjson refused one: the stdlib's encoder does all
        results, advice_results = self._marks
        skeleton = dict(answer) | {"results": results,
                                   "advice": dict(advice) | {"results": advice_results}}
        try:
            whole = _spliced(orjson.dumps(skeleton, option=_INDENTED), {
                results: ([p.indented for p in pieces], b"\n  "),
                advice_results: ([p.advice_indented for p in pieces], b"\n    ")})
            one_line = _spliced(orjson.dumps(skeleton), {
                results: ([p.compact or b"" for p in pieces], b""),
                advice_results: ([p.advice_compact for p in pieces], b"")})
        except orjson.JSONEncodeError:
            return AnswerTexts.of(answer)
        if whole is None or one_line is None:
            return AnswerTexts.of(answer)
        names = self._file_names
        if not names.keys() >= answer["results"].keys():
            names = result_file_names(answer["results"])
        return AnswerTexts(
            files={names[name]: p.file for name, p in zip(answer["results"], pieces, strict=True)},
            whole=whole, compact=one_line)


# Where the answer has its targets' RESULTs and their advice (`answer["results"]`, and
# `answer["advice"]["results"]`): how deep, so how far an indented member is moved right.
_RESULTS_PAD, _ADVICE_PAD = b"\n    ", b"\n      "


@dataclass(frozen=True)
class _Piece:
    """One target's RESULT and advice: the objects, and each as a member of its object in the
    answer's texts (`compact` None when orjson refused them: the stdlib's encoder then makes
    the whole answer's texts). Made as the RESULT is, so that `texts` only joins them."""

    result: Mapping[str, Any]
    advice: Mapping[str, Any] | None
    file: bytes  # the RESULT indented, with a newline: its file
    indented: bytes  # `"name": RESULT` as a member of the indented answer's `results`
    compact: bytes | None  # `"name":RESULT`, of the one-line answer's
    advice_indented: bytes
    advice_compact: bytes

    @classmethod
    def of(cls, name: str, result: Mapping[str, Any],
           advice: Mapping[str, Any] | None) -> _Piece:
        file = indented(result)
        key = orjson.dumps(name)
        try:
            one_line = key + b":" + orjson.dumps(result)
            advice_text = orjson.dumps(advice, option=orjson.OPT_INDENT_2)
            advice_line = key + b":" + orjson.dumps(advice)
        except orjson.JSONEncodeError:
            return cls(result, advice, file, b"", None, b"", b"")
        return cls(result, advice, file,
                   _RESULTS_PAD + key + b": " + file[:-1].replace(b"\n", _RESULTS_PAD),
                   one_line, _ADVICE_PAD + key + b": " + advice_text.replace(b"\n", _ADVICE_PAD),
                   advice_line)


def _spliced(text: bytes, objects: Mapping[str, tuple[list[bytes], bytes]]) -> bytes | None:
    """`text` with each stand-in string (as JSON) replaced by the JSON object of its members
    (each with its separator's whitespace before it; then what comes before the `}`: a
    newline and its indent), as orjson writes it. None when a stand-in is not there exactly
    once. One join: these texts are megabytes, and each copy of them costs milliseconds."""
    found = []
    for mark, (members, closing) in objects.items():
        at = orjson.dumps(mark)
        if text.count(at) != 1:
            return None
        found.append((text.index(at), len(at), members, closing))
    chunks, done = [], 0
    for start, size, members, closing in sorted(found, key=lambda f: f[0]):
        chunks.append(text[done:start])
        if members:
            chunks.append(b"{")
            chunks += [part for member in members for part in (b",", member)][1:]
            chunks += [closing, b"}"]
        else:
            chunks.append(b"{}")
        done = start + size
    chunks.append(text[done:])
    return b"".join(chunks)


@dataclass(frozen=True)
class StopTexts:
    """What a stop's work hands back from its child: the answer's compact text, what memory
    keeps of it, and the window's state row around the answer (`EncodedDoc`'s `before`
    and `after`); `parts` and `of_parts` are each other's inverse."""

    compact: bytes
    kept: dict[str, Any]  # the fields `StoppedWindow.of` and `LastWindow.of_kept` read
    row: tuple[bytes, bytes] = (b"", b"")

    def parts(self) -> list[bytes]:
        """The texts as the parts `Child.answer` hands over as they are (the answer's
        megabytes are not joined to anything)."""
        # Pickled, not JSON: the parent then makes only what it keeps (packed increases), where
        # JSON's dicts of each target's increase were ~15,000 objects at 1000 targets made
        # and dropped at once, a peak that memory kept (bench markers). The bytes come from
        # our own forked child, as its messages do (`isolate`).
        return [pickle.dumps(self.kept, protocol=pickle.HIGHEST_PROTOCOL), *self.row,
                self.compact]

    @staticmethod
    def kept_of(answer: Mapping[str, Any]) -> dict[str, Any]:
        """Of a stop answer, what `StoppedWindow.of` and `LastWindow.of_kept` read: its head,
        the aggregate's figures, each ok target's increase, packed (`PackedIncreases`)."""
        kept = {k: answer[k] for k in ("id", "name", "targets", "labels", "started_at",
                                       "stopped_at")}
        return kept | {
            "aggregate": brief_aggregate(answer["aggregate"]),
            "increases": PackedIncreases.of_results(answer["results"]),
        }

    @classmethod
    def of_parts(cls, parts: Sequence[bytes]) -> StopTexts:
        """The inverse of `parts`."""
        kept, before, after, text = parts
        return cls(compact=text, kept=pickle.loads(kept), row=(before, after))


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


@dataclass(frozen=True)
class EncodedDoc:
    """A window row's document as JSON around its `answer`'s value, which `text` puts in as
    is: a stop answer comes encoded already (megabytes, not decoded or encoded again here),
    and a stop encodes the rest while its child still makes the answer (`encode_doc`)."""

    id: str
    open: bool
    started_at: float
    before: bytes  # the JSON text up to the answer's value
    own: bytes  # the document's own answer, as JSON
    after: bytes  # from after it

    def text(self, answer: bytes | None = None) -> bytes:
        """The document's text, with this answer (already JSON) or its own."""
        return b"".join((self.before, self.own if answer is None else answer, self.after))


def encode_doc(doc: Mapping[str, Any]) -> EncodedDoc:
    """`json.dumps(doc)` (NaN as NaN, as the stdlib writes it), cut around its answer's value
    (a document without one gets it last)."""
    # A stand-in for the answer: NUL and a random token, in no real text.
    mark = f"\x00{secrets.token_hex(8)}"
    text = json.dumps(dict(doc) | {"answer": mark}).encode()
    before, _, after = text.partition(json.dumps(mark).encode())
    return EncodedDoc(doc["id"], doc["stopped_at"] is None, doc["started_at"], before,
                      json.dumps(doc.get("answer")).encode(), after)
