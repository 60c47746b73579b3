"""Random JSON-able values for the encoders' property tests (`answertext`)."""

from __future__ import annotations

import random
from typing import Any

# Strings an encoder gets wrong first: escapes, a newline and indent inside a string (what an
# indentation-stripping regex must not touch), non-ASCII, astral plane.
STRINGS = ["", "a", "ß", "x\ny", '"q"', "\\", ", \n  ", "\u00a0", "é", "🙂"]


def random_value(rng: random.Random, depth: int = 0, *,
                 key_marks: tuple[str, ...] = ("", ",", " ", "é")) -> Any:
    """A nested value of strings, ints, floats (wide and integral), bools, None, lists, tuples
    and dicts whose keys end in one of `key_marks`."""
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice(STRINGS) * rng.randrange(3)
    if kind == 1:
        return rng.randrange(-10**6, 10**6)
    if kind == 2:
        return rng.uniform(-1e6, 1e6) * 10 ** rng.randrange(-12, 12)
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return rng.random()
    if kind == 5:
        return float(rng.randrange(100))
    if kind == 6:
        return [random_value(rng, depth + 1, key_marks=key_marks)
                for _ in range(rng.randrange(4))]
    if kind == 7:
        return tuple(random_value(rng, depth + 1, key_marks=key_marks)
                     for _ in range(rng.randrange(3)))
    return {f"k{rng.randrange(50)}{rng.choice(key_marks)}":
            random_value(rng, depth + 1, key_marks=key_marks) for _ in range(rng.randrange(5))}
