"""exporter/core/kept.py: what memory keeps of stopped windows (list items, last gauges)."""

from __future__ import annotations

import pickle
import sys
import tracemalloc

from exporter.core.kept import LastWindow, PackedIncreases, StoppedWindow
from exporter.core.snapshot import Counts


def counts(i: int, k: int = 8) -> Counts:
    per_pos = {pos: float(100 - 10 * pos + i) for pos in range(k)}
    return Counts(1000.0 + i, 1000.0 * k + i, sum(per_pos.values()), per_pos)


def answer(n: int) -> dict:
    results = {f"t{i}": {"status": "ok", "increase": counts(i).as_raw()} for i in range(n)}
    results["down"] = {"status": "N/A", "increase": None}
    results["idle"] = {"status": "ok", "increase": None}
    return {"id": "w", "name": "n", "stopped_at": 10.0, "results": results}


class TestLastWindow:
    def test_ok_targets_with_an_increase_read_back_the_same(self):
        last = LastWindow.of(answer(3))
        assert list(last.increases) == ["t0", "t1", "t2"] and len(last.increases) == 3
        assert dict(last.increases) == {f"t{i}": counts(i) for i in range(3)}
        assert last.increases == {f"t{i}": counts(i) for i in range(3)}

    def test_uneven_drafts_and_differing_positions_survive(self):
        uneven = Counts(10.0, 40.0, 9.0, {0: 5.0, 1: 4.0}, {1: 6.0})
        short = Counts(3.0, 3.0, 1.0, {0: 1.0})
        packed = PackedIncreases([("a", uneven), ("b", short), ("c", counts(0))])
        assert packed["a"] == uneven and packed["a"].drafts_at(1) == 6.0
        assert packed["b"] == short and packed["c"] == counts(0)

    def test_sent_by_a_stop_child_it_reads_the_same_its_names_shared(self):
        # A stop's work sends them pickled (`stop.read_stop`): the parent makes only
        # what it keeps, its names one copy with the window list's (interned).
        sent = PackedIncreases.of_results(answer(3)["results"])
        back = pickle.loads(pickle.dumps(sent))
        assert back == sent == {f"t{i}": counts(i) for i in range(3)}
        assert all(name is sys.intern("".join(["t", str(i)])) for i, name in enumerate(back))
        kept = {"id": "w", "name": "n", "stopped_at": None, "increases": back}
        assert LastWindow.of_kept(kept) == LastWindow("w", "n", 0.0, sent)

    def test_a_quarter_of_the_counts_it_replaces(self):
        # Kept from one stop to the next: ~0.76 KB a target as `Counts` (targets alike share
        # one tuple of positions).
        items = [(f"t{i}", counts(i)) for i in range(1000)]
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            plain = {name: Counts.from_raw(c.as_raw()) for name, c in items}
            as_counts = tracemalloc.get_traced_memory()[0] - before
            before = tracemalloc.get_traced_memory()[0]
            packed = PackedIncreases((name, c) for name, c in items)
            as_packed = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert dict(packed) == plain
        assert as_packed < 0.35 * as_counts, (as_packed, as_counts)


class TestStoppedWindow:
    def test_windows_over_the_same_targets_share_their_names(self):
        one, two = (StoppedWindow.of(answer(3) | {"id": i, "labels": {},
                                                   "started_at": 1.0, "targets": ["t0", "t1"]})
                    for i in ("a", "b"))
        assert one.targets is two.targets and one.targets == ("t0", "t1")
        assert (one.id, two.id) == ("a", "b")
