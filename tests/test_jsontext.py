"""The fast indented JSON writer gives json.dumps(indent=2)'s exact text, spliced or not."""

from __future__ import annotations

import collections
import enum
import json
import math
import random

import pytest
from randomjson import random_value

from exporter.jsontext import Encoded, pretty


def reference(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)


class Colour(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Row(list):
    pass


DEEP: list = [1.5, {"a": 1}]
for _ in range(40):  # deeper than the writer's table of indents
    DEEP = [DEEP]


ODD = [
    {}, [], "", 0, -0.0, 1e16, 1e-7, 0.1, 1.5, -2, 10**30, True, False, None,
    "é ü 中文 \u2028 \x00 \x1f \" \\ / \t \n", "🙂", {"a": {}}, {"a": []}, [[], {}],
    {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},
    (1, 2, (3,)), {"tuple": ()}, Colour.RED, {Colour.RED: Level.HIGH}, [Level.HIGH],
    {"nested": [{"a": [1, [2, [3, {"b": None}]]]}]},
    {"x": 1.0, "y": [0.30000000000000004, 123456789.123456789, 5e-324, 1.7976931348623157e308]},
    # Subclasses of dict and list take the long way (the C encoder gets exact types only).
    collections.OrderedDict([("b", 1), ("a", [1, {"c": 2.5}])]), Row([1, 2.5, "x"]),
    {"scalars": Row([True, None]), "deep": DEEP},
]


class TestPretty:
    @pytest.mark.parametrize("value", ODD, ids=[str(i) for i in range(len(ODD))])
    def test_odd_values(self, value):
        assert pretty(value) == reference(value)

    @pytest.mark.parametrize("seed", range(200))
    def test_random_documents(self, seed):
        value = random_value(random.Random(seed))
        assert pretty(value) == reference(value)

    @pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1, math.nan],
                                       {"a": {"b": math.inf}}])
    def test_non_finite_refused_like_json(self, value):
        with pytest.raises(ValueError, match="Out of range float"):
            reference(value)
        with pytest.raises(ValueError, match="Out of range float"):
            pretty(value)

    @pytest.mark.parametrize("value", [{1, 2}, object(), {"a": b"bytes"}, {(1, 2): "tuple key"}])
    def test_unserializable_refused_like_json(self, value):
        with pytest.raises(TypeError):
            reference(value)
        with pytest.raises(TypeError):
            pretty(value)


class TestSplice:
    @pytest.mark.parametrize("seed", range(50))
    def test_spliced_text_is_the_whole_documents_text(self, seed):
        rng = random.Random(seed)
        parts = {f"t{i}": random_value(rng) for i in range(rng.randrange(1, 6))}
        whole = {"id": "w", "results": parts, "aggregate": random_value(rng)}
        spliced = {**whole, "results": {k: Encoded(pretty(v)) for k, v in parts.items()}}
        assert pretty(spliced) == reference(whole)

    def test_splice_at_the_top(self):
        value = {"a": [1, {"b": "c"}]}
        assert pretty(Encoded(pretty(value))) == reference(value)


def _row(k: int, **extra) -> dict:
    return {"k": k, "length": 1.0 + k / 3, "estimate": k > 2,
            "speedup": {"0": 1.0 + k / 3, "0.05": 0.9 / k, "%s": float(k)}} | extra


RECORDS = [
    [_row(k) for k in range(1, 7)],  # the advisor's rows
    {"rows": [_row(k) for k in range(1, 4)], "deep": {"deeper": [_row(1), _row(2)]}},
    [{"é ü": 1, "n": None, "s": "x\n\"y\"", "d": {}}, {"é ü": 2, "n": True, "s": "", "d": {}}],
    [{"only": 1, "d": {"a": 1}}, {"only": 2.5, "d": {"a": "b"}}],  # one scalar key
    [_row(1), _row(2, more=1)],  # not alike: the long way
    [_row(1), {"length": 1.0, "k": 1, "estimate": False, "speedup": {}}],  # other key order
    [_row(1), _row(2) | {"speedup": {"0": 1.0}}],  # other inner keys
    [_row(1), _row(2) | {"speedup": [1.0]}],  # a list where a dict was
    [_row(1), _row(2) | {"k": Level.HIGH}],  # a subclass value: the long way
    [{"a": {"x": 1}, "b": 2}, {"a": {"x": 1}, "b": 3}],  # a dict before a scalar
    [{"a": 1}, {"a": 2}],  # scalars only: a list of flat dicts
    [_row(1), "not a dict"],
    [{1: "int key", "d": {"a": 1}}, {1: "int key", "d": {"a": 1}}],
    [{"a": 1, "d": {1: 2}}, {"a": 1, "d": {1: 2}}],  # an int key inside
]


class TestRecords:
    @pytest.mark.parametrize("value", RECORDS, ids=[str(i) for i in range(len(RECORDS))])
    def test_same_text_as_json(self, value):
        assert pretty(value) == reference(value)
        assert pretty(value) == reference(value)  # the template made once, used again

    def test_non_finite_refused_like_json(self):
        with pytest.raises(ValueError, match="Out of range float"):
            pretty([_row(1), _row(2) | {"length": math.nan}])
