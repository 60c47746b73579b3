"""exporter/state/answertext.py: a stop answer's texts, and a stopped window's state row."""

from __future__ import annotations

import collections
import enum
import json
import math
import random
import sqlite3

import pytest
from jsonlayout import assert_indented
from randomjson import random_value

from exporter.state.answertext import AnswerTexts, compact, indented, stopped_row
from exporter.state.store import StateStore


class Colour(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Row(list):
    pass


DEEP: list = [1.5, {"a": 1}]
for _ in range(40):
    DEEP = [DEEP]

ODD = [
    {}, [], "", 0, -0.0, 1e16, 1e-7, 0.1, 1.5, -2, 10**30, True, False, None,
    "é ü 中文 \u2028 \x00 \x1f \" \\ / \t \n", "🙂", {"a": {}}, {"a": []}, [[], {}],
    {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},
    (1, 2, (3,)), {"tuple": ()}, Colour.RED, {Colour.RED: Level.HIGH}, [Level.HIGH],
    {"nested": [{"a": [1, [2, [3, {"b": None}]]]}]},
    {"x": 1.0, "y": [0.30000000000000004, 123456789.123456789, 5e-324, 1.7976931348623157e308]},
    collections.OrderedDict([("b", 1), ("a", [1, {"c": 2.5}])]), Row([1, 2.5, "x"]),
    {"scalars": Row([True, None]), "deep": DEEP, "big": [2**64, -(2**63) - 1]},
]


class TestEncodings:
    @pytest.mark.parametrize("seed", range(300))
    def test_indented_and_compact_are_the_values_in_json_dumps_layout(self, seed):
        value = random_value(random.Random(seed))
        assert_indented(indented(value), value)
        assert json.loads(compact(value)) == json.loads(json.dumps(value))
        assert b"\n" not in compact(value)

    @pytest.mark.parametrize("value", ODD, ids=range(len(ODD)))
    def test_odd_values(self, value):
        # Keys that are no strings and ints beyond 64 bits: orjson refuses, the stdlib writes.
        assert_indented(indented(value), value)
        assert json.loads(compact(value)) == json.loads(json.dumps(value))

    def test_nan_is_null_not_invalid_json(self):
        assert json.loads(indented({"x": math.nan})) == {"x": None}
        assert compact([math.inf]) == b"[null]"

    def test_window_json_holds_each_result_file(self):
        answer = {"id": "w", "results": {"a": {"status": "ok", "data": {"x": 1.5}},
                                         "b:1": {"status": "na", "data": None}},
                  "aggregate": {"status": "ok"}, "advice": {"results": {"a": None}}}
        texts = AnswerTexts.of(answer)
        assert_indented(texts.whole, answer)
        assert json.loads(texts.compact) == answer
        assert sorted(texts.files) == ["spec_decode_a.json", "spec_decode_b_1.json"]
        assert_indented(texts.files["spec_decode_b_1.json"], answer["results"]["b:1"])




class TestStoppedRow:
    DOC = {"id": "w", "name": "w", "targets": {}, "labels": {"é": "ü"}, "started_at": 1.0,
           "stopped_at": 2.0, "accumulators": {}, "late_baselines": {"a": "x"},
           "series": {"a": [[1.0, 2.0, math.nan, 4.0]]}}

    @pytest.mark.parametrize("answer", [{}, {"id": "w", "results": {"a": {"x": [1, 2.5, None]}},
                                             "labels": {"é": "🙂"}}])
    def test_the_row_is_the_document_with_that_answer_last(self, answer):
        doc = self.DOC | {"answer": {"stale": True}}
        row, at = stopped_row(doc, compact(answer))
        assert row[at] == compact(answer)
        assert json.loads(row) == json.loads(json.dumps(doc | {"answer": answer}))
        assert list(json.loads(row))[-1] == "answer"

    def test_the_store_saves_and_reads_it(self, tmp_path):
        store = StateStore(tmp_path / "state.sqlite")
        answer = {"id": "w", "results": {"a": {"x": [1, 2.5, None]}}}
        row, _ = stopped_row(self.DOC, compact(answer))
        store.save(stopped=[("w", 1.0, row)], sync=True)
        assert store.load("w", series=False)["answer"] == answer
        assert [d["id"] for d in store.recent_closed(5)] == ["w"]
        assert store.recent_stopped_fields(5)[0]["id"] == "w"
        store.close()
        with sqlite3.connect(tmp_path / "state.sqlite") as db:
            assert db.execute("SELECT open, typeof(doc) FROM windows").fetchall() == [(0, "text")]
