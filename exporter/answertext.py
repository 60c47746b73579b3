"""A stop answer's texts, each part encoded once: the result files, window.json, the API's JSON.

A stop over 1000 targets used to encode its answer four times over (each result file,
window.json, the state database's row, the HTTP answer): now each RESULT is indented once (its
file's text is also its part of window.json) and the answer is encoded compact once, for the
state database and the HTTP answer alike. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.jsontext import Encoded, pretty
from exporter.results import result_file_names


@dataclass(frozen=True)
class AnswerTexts:
    """What a stopped window's answer is written and sent as."""

    files: dict[str, str]  # file name (`result_file_names`) -> the RESULT file's text
    whole: str  # window.json: the answer indented, each RESULT as in its file
    compact: str  # `json.dumps(answer)`: the HTTP answer's body and the state DB's `answer`

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> AnswerTexts:
        """Encode a stop answer (`results.window_answer`)."""
        names = result_file_names(answer["results"])
        results = {name: pretty(result) for name, result in answer["results"].items()}
        spliced = {name: Encoded(text) for name, text in results.items()}
        whole = pretty(dict(answer) | {"results": spliced})
        return cls(files={names[name]: text + "\n" for name, text in results.items()},
                   whole=whole + "\n", compact=compact_of(whole, answer))


def with_key(compact: str, key: str, value: Any) -> str:
    """`json.dumps(answer | {key: value})` from `compact` = `json.dumps(answer)`, `key` new.

    The stop answer adds `results_dir` (where this exporter wrote the files) to the text
    encoded once at the stop, instead of encoding megabytes again.
    """
    if not compact.startswith("{") or not compact.endswith("}"):
        raise ValueError("not the text of a JSON object")
    tail = f"{json.dumps(key)}: {json.dumps(value)}}}"
    return compact[:-1] + (", " if compact != "{}" else "") + tail


_ITEM_BREAK = re.compile(r",\n *")
_BREAK = re.compile(r"\n *")


def compact_of(indented: str, value: Any) -> str:
    """`json.dumps(value)` from `indented` = `jsontext.pretty(value)`, at regex speed.

    Indented text has line breaks only between items and inside brackets (a string's are
    escaped): `,` + break + indent becomes `, `, any other break + indent goes. The indented
    text keeps non-ASCII characters as they are, `json.dumps` escapes them: such a text is
    encoded again instead.
    """
    if not indented.isascii():
        return json.dumps(value)
    return _BREAK.sub("", _ITEM_BREAK.sub(", ", indented))
