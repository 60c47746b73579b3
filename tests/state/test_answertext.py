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

from exporter.state.answertext import AnswerTexts, Pieces, compact, indented, stopped_row
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


def _answer(rng: random.Random, targets: int) -> dict:
    """An answer of random RESULTs and advice, with the keys a stop answer has around them."""
    names = [f"t{i}" for i in range(targets)]
    return {"id": "w", "results": {n: {"status": "ok", "host_port": n, "x": random_value(rng)}
                                   for n in names},
            "aggregate": {"data": random_value(rng)},
            "advice": {"draft_costs": [0.0, 0.05],
                       "results": {n: rng.choice([None, {"k": 3, "rows": random_value(rng)}])
                                   for n in names},
                       "aggregate": None},
            "results_dir": "/tmp/é"}


class TestPieces:
    """A stop's child encodes each RESULT and advice as it comes; the answer's texts made from
    those pieces must be the ones made from the answer at once, byte for byte."""

    @pytest.mark.parametrize("seed", range(60))
    def test_texts_from_pieces_are_the_texts_of_the_whole(self, seed):
        rng = random.Random(seed)
        answer = _answer(rng, rng.randint(0, 6))
        pieces = Pieces()
        for name, body in answer["results"].items():
            pieces.result(name, body)
            pieces.advice(name, answer["advice"]["results"][name])
        assert AnswerTexts.of(answer, pieces) == AnswerTexts.of(answer)

    def test_a_piece_of_another_object_is_not_used(self):
        # A RESULT made again (a partial one at the stop time) is another object: its new text.
        answer = _answer(random.Random(1), 3)
        pieces = Pieces()
        for name in answer["results"]:
            pieces.result(name, {"status": "old"})
            pieces.advice(name, {"k": 99})
        texts = AnswerTexts.of(answer, pieces)
        assert texts == AnswerTexts.of(answer)
        assert b"old" not in texts.whole + texts.compact and b"99" not in texts.compact

    def test_what_orjson_refuses_outside_the_pieces_takes_the_plain_way(self):
        answer = _answer(random.Random(2), 2) | {"big": 2**70}
        pieces = Pieces()
        for name, body in answer["results"].items():
            pieces.result(name, body)
        texts = AnswerTexts.of(answer, pieces)
        assert texts == AnswerTexts.of(answer)
        assert json.loads(texts.compact)["big"] == 2**70

    def test_some_targets_without_pieces(self):
        answer = _answer(random.Random(3), 4)
        pieces = Pieces()
        pieces.result("t0", answer["results"]["t0"])
        pieces.advice("t3", answer["advice"]["results"]["t3"])
        assert AnswerTexts.of(answer, pieces) == AnswerTexts.of(answer)




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
