"""The layout every JSON file of ours has: `json.dump(indent=2)`'s, as AISBench writes it."""

from __future__ import annotations

import json
import re


def reference(value) -> str:
    """AISBench's json.dump layout, as the files have always been written."""
    return json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)


_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def spelt_alike(text: bytes) -> bytes:
    """`text` with each number spelt as Python's repr of its float: orjson writes 6.1e-06 as
    6.1e-6 and 1e-05 as 0.00001, the same double."""
    return _NUMBER.sub(lambda m: repr(float(m.group())).encode(), text)


def assert_indented(text: bytes, value) -> None:
    """`text` is json.dumps(value, indent=2)'s layout, the same values bit for bit."""
    assert text.endswith(b"\n")
    assert spelt_alike(text) == spelt_alike(reference(value).encode() + b"\n")
    assert json.loads(text) == json.loads(reference(value))
