"""A log message `event key=%s ...` split into its event and typed fields (JSON logs' keys)."""

from __future__ import annotations

import pytest

from exporter.core.logfields import message_fields


class TestMessageFields:
    @pytest.mark.parametrize(("fmt", "args", "event", "fields"), [
        ("scrape failed target=%s error=%s", ("a", "connection refused x=1"), "scrape failed",
         {"target": "a", "error": "connection refused x=1"}),
        ("listening host=%s port=%d fd_limit=%d ", ("h", 9400, 4), "listening",
         {"host": "h", "port": 9400, "fd_limit": 4}),
        ("target up target=%s after=%s", ("a", 1.5), "target up", {"target": "a", "after": 1.5}),
        ("x id=%s error=%s (row kept)", ("w", "bad"), "x", {"id": "w", "error": "bad (row kept)"}),
        ("gauges id=%s error=unreadable: %r", ("w", ValueError("v")), "gauges",
         {"id": "w", "error": "unreadable: ValueError('v')"}),
        ("auth off: set %s to require a token", ("T",), "auth off: set T to require a token", {}),
        ("auth on: needs token_env=%s", ("T",), "auth on: needs", {"token_env": "T"}),
        ("100%% done n=%d", (3,), "100% done", {"n": 3}),
        ("flag=%s", (True,), "", {"flag": "True"}),
        ("plain words", None, "plain words", {}),
        ("too few %s %s", ("a",), "too few %s %s", {}),
        ("too many %s", ("a", "b"), "too many %s", {}),
        ("mapping %(a)s", {"a": 1}, "mapping 1", {}),
    ])
    def test_split(self, fmt, args, event, fields):
        assert message_fields(fmt, args) == (event, fields)
