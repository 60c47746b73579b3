"""Shards, pure: rendezvous ownership and the merged answers of a fanned-out window."""

from __future__ import annotations

import zlib

import pytest

from exporter.core.aisbench import NO_ACTIVITY
from exporter.core.shards import (
    Asked,
    ShardPart,
    merge_stop,
    merged_delete,
    merged_list,
    merged_start,
    merged_window,
    owner,
    split,
    vet_stop,
)

NAMES = [f"vllm-{i}.llm.svc:8000" for i in range(3000)]


class TestOwner:
    def test_stable_and_in_range(self):
        for shards in (1, 2, 3, 7):
            owners = [owner(n, shards) for n in NAMES[:200]]
            assert owners == [owner(n, shards) for n in NAMES[:200]]
            assert set(owners) == set(range(shards))

    def test_even_enough(self):
        counts = [0, 0, 0]
        for name in NAMES:
            counts[owner(name, 3)] += 1
        assert all(800 < c < 1200 for c in counts), counts

    @pytest.mark.parametrize("shards", [1, 2, 3, 4, 7])
    def test_n_to_n_plus_one_moves_about_one_in_n_plus_one(self, shards):
        moved = [n for n in NAMES if owner(n, shards) != owner(n, shards + 1)]
        share = len(moved) / len(NAMES)
        assert abs(share - 1 / (shards + 1)) < 0.03, share
        # Every target that moves goes to the new shard: none shuffles between old ones.
        assert {owner(n, shards + 1) for n in moved} == {shards}

    def test_modulo_would_move_most(self):
        """What rendezvous avoids: crc32 % N moves about N/(N+1) of them from 3 to 4 shards."""
        moved = sum(zlib.crc32(n.encode()) % 3 != zlib.crc32(n.encode()) % 4 for n in NAMES)
        assert moved / len(NAMES) > 0.6

    def test_split(self):
        shares = split(["a", "b", "c", "d"], 2)
        assert sorted(shares) == [0, 1]
        assert sorted(shares[0] + shares[1]) == ["a", "b", "c", "d"]
        assert all(owner(n, 2) == i for i, names in shares.items() for n in names)
        assert split([], 3) == {0: [], 1: [], 2: []}


def _ok(name: str, drafts: int, tokens: int, accepted: int, per_pos: list[int]) -> dict:
    increase = {"num_drafts": drafts, "num_draft_tokens": tokens,
                "num_accepted_tokens": accepted,
                "num_accepted_tokens_per_pos": dict(enumerate(per_pos))}
    zero = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
            "num_accepted_tokens_per_pos": dict.fromkeys(range(len(per_pos)), 0)}
    return {"status": "ok", "url": f"http://{name}/metrics", "error": None, "data": {},
            "raw": {"before": zero, "after": increase}, "increase": increase,
            "target": name, "host_port": name, "engines": 1, "resets": 0}


def _asked(shares: dict | None = None, fleet: dict | None = None) -> Asked:
    return Asked(2, fleet or {}, shares or {})


def _answer(results: dict, started: float = 10.0, stopped: float = 20.0) -> dict:
    return {"id": "w", "name": "w", "targets": list(results), "labels": {},
            "started_at": started, "stopped_at": stopped, "results": results,
            "aggregate": {"status": "ok"}}


class TestMergeStop:
    def test_aggregate_recomputed_from_counts_and_who_counted_what(self):
        a = _ok("a:1", 10, 30, 20, [9, 7, 4])
        b = _ok("b:1", 30, 60, 15, [10, 5])  # another k: positions 0-1 only
        parts = [ShardPart(0, "http://s0", _answer({"a": a}, 10.0, 20.0), 200),
                 ShardPart(1, "http://s1", _answer({"b": b}, 9.0, 21.0), 200)]
        merged = merge_stop(parts, _asked())
        data = merged["aggregate"]["data"]
        assert (data["num_drafts"], data["draft_tokens"], data["accepted_tokens"]) == (40, 90, 35)
        assert data["acceptance_rate"] == pytest.approx(100 * 35 / 90)
        assert data["acceptance_length"] == pytest.approx(1 + 35 / 40)
        assert merged["started_at"] == 9.0 and merged["stopped_at"] == 21.0
        assert {n: r["shard"] for n, r in merged["results"].items()} == {"a": 0, "b": 1}
        assert merged["shards"] == [
            {"shard": 0, "url": "http://s0", "targets": ["a"], "error": None},
            {"shard": 1, "url": "http://s1", "targets": ["b"], "error": None}]
        # A shard's advice covers its own targets: the web layer advises over the whole.
        assert "advice" not in merged

    def test_unreachable_shard_makes_its_targets_na_with_the_reason(self):
        a = _ok("a:1", 10, 30, 20, [9, 7, 4])
        dead = ShardPart(2, "http://s2", None, None, "Connection refused")
        asked = _asked({2: ["c", "d"]}, {"c": ("http://c:1/metrics", "c:1")})
        merged = merge_stop([ShardPart(0, "http://s0", _answer({"a": a}), 200), dead], asked)
        reason = "shard 2 at http://s2 unreachable: Connection refused"
        assert merged["results"]["c"]["status"] == "na"
        assert merged["results"]["c"]["error"] == reason
        assert merged["results"]["c"]["url"] == "http://c:1/metrics"
        assert merged["results"]["d"]["error"] == reason and merged["results"]["d"]["shard"] == 2
        assert merged["aggregate"]["targets"] == ["a"]
        assert merged["aggregate"]["data"]["num_drafts"] == 10
        assert merged["shards"][1] == {"shard": 2, "url": "http://s2", "targets": [],
                                       "error": reason}

    def test_a_shard_that_never_had_the_window(self):
        part = ShardPart(1, "http://s1", None, 404, 'unknown window "w"')
        merged = merge_stop([ShardPart(0, "http://s0", _answer({}), 200), part], _asked({1: ["b"]}))
        assert merged["results"]["b"]["error"] == (
            'shard 1 at http://s1 answered 404: unknown window "w"')
        assert merged["aggregate"]["status"] == "na"
        assert merged["aggregate"]["error"] == NO_ACTIVITY

    def test_a_target_that_moved_keeps_the_shard_that_counted_it(self):
        left = {"status": "na", "url": "http://a:1/metrics", "data": None, "raw": None,
                "error": "target moved to shard 1 of 2 at 15.000"}
        counted = _ok("a:1", 10, 30, 20, [9, 7, 4])
        for order in ([0, 1], [1, 0]):
            answers = {0: _answer({"a": counted}), 1: _answer({"a": left})}
            parts = [ShardPart(i, f"http://s{i}", answers[i], 200) for i in order]
            merged = merge_stop(parts, _asked())
            assert merged["results"]["a"]["status"] == "ok"
            assert merged["results"]["a"]["shard"] == 0
            assert merged["aggregate"]["data"]["num_drafts"] == 10  # counted once


class TestMergeStartAndOpen:
    def test_start_lists_every_target_and_who_could_not_start(self):
        started = {"id": "w", "name": "n", "targets": ["a"], "labels": {}, "started_at": 5.0}
        dead = ShardPart(1, "http://s1", None, None, "timeout")
        fleet = {n: (f"http://{n}/metrics", n) for n in "abc"}
        status, merged = merged_start([ShardPart(0, "http://s0", started, 201), dead],
                                      _asked({1: ["b", "c"]}, fleet))
        assert status == 201
        assert merged["id"] == "w" and merged["targets"] == ["a", "b", "c"]
        assert merged["errors"] == {"shard 1": "shard 1 at http://s1 unreachable: timeout"}

    def test_open_state_merges_scrapes_and_names_the_dead_shard(self):
        open0 = {"id": "w", "name": "w", "targets": ["a"], "labels": {}, "started_at": 1.0,
                 "stopped_at": None, "status": "open", "scrapes": {"a": 3}, "errors": {}}
        dead = ShardPart(1, "http://s1", None, None, "refused")
        fleet = {n: (f"http://{n}/metrics", n) for n in "ab"}
        status, merged = merged_window([ShardPart(0, "http://s0", open0, 200), dead],
                                       _asked({1: ["b"]}, fleet))
        assert status == 200
        assert merged["targets"] == ["a", "b"] and merged["scrapes"] == {"a": 3}
        assert merged["errors"] == {"b": "shard 1 at http://s1 unreachable: refused"}
        assert merged["status"] == "open"


class TestMergeDelete:
    def test_open_somewhere_is_a_409_naming_each_such_shard(self):
        parts = [ShardPart(0, "http://a", answer={"id": "w", "deleted": True}, status=200),
                 ShardPart(1, "http://b", status=409, error="open"),
                 ShardPart(2, "http://c", status=409, error="open")]
        status, body = merged_delete(parts, Asked(3, {}, {}, "w"))
        assert status == 409
        assert body["error"] == ("shard 1 at http://b answered 409: open; "
                                 "shard 2 at http://c answered 409: open")

    def test_a_shard_without_it_is_fine_an_unreachable_one_is_named(self):
        parts = [ShardPart(0, "http://a", answer={"id": "w", "deleted": True}, status=200),
                 ShardPart(1, "http://b", status=404, error="unknown window"),
                 ShardPart(2, "http://c", error="connection refused")]
        status, body = merged_delete(parts, Asked(3, {}, {}, "w"))
        assert status == 200
        reason = "shard 2 at http://c unreachable: connection refused"
        assert body == {"id": "w", "deleted": True, "errors": {"shard 2": reason}}


class TestVetAndList:
    def test_vet_stop_refuses_what_the_split_does_not_give(self):
        mine = next(n for n in NAMES if owner(n, 2) == 1)
        other = next(n for n in NAMES if owner(n, 2) == 0)
        part = ShardPart(1, "http://s1", _answer({mine: _ok(mine, 4, 8, 4, [4]),
                                                   other: _ok(other, 9, 9, 9, [9])}), 200)
        vet_stop(part, 2, [mine, other])
        assert part.answer is not None and list(part.answer["results"]) == [mine]
        assert part.answer["results"][mine]["data"]["num_drafts"] == 4
        assert part.refused == {
            other: "counted by shard 1, but the split gives it to shard 0"}

    def test_a_result_of_another_schema_distrusts_the_whole_answer(self):
        name = next(n for n in NAMES if owner(n, 2) == 1)
        bad = _ok(name, 4, 8, 4, [4]) | {"resets": -1}
        part = ShardPart(1, "http://s1", _answer({name: bad}), 200)
        vet_stop(part, 2, [name])
        assert part.answer is None
        merged = merge_stop([part], _asked({1: [name]}))
        assert merged["results"][name]["error"] == (
            f"shard 1 at http://s1 answered 200: its answer is malformed: its result for "
            f"{name!r} resets is not a count")

    @pytest.mark.parametrize("by_load, problem", [
        ([1], "by_load is not an object"),
        ({"1": {"increase": {}}}, "by_load.1 has no count of intervals"),
        ({"1": {"intervals": 2}}, "by_load.1 has no increase"),
        ({"1": {"intervals": 2, "increase": {"num_drafts": -3}}},
         "by_load.1.increase.num_drafts is not a count: -3"),
        ({"9": {"intervals": 2, "increase": {"num_drafts": 3}}},
         "cannot be read: not a load band: '9'"),
    ])
    def test_a_result_with_malformed_bands_by_load_is_refused(self, by_load, problem):
        name = next(n for n in NAMES if owner(n, 2) == 1)
        part = ShardPart(1, "http://s1", _answer({name: _ok(name, 4, 8, 4, [4]) | {
            "by_load": by_load}}), 200)
        vet_stop(part, 2, [name])
        assert part.answer is None
        assert merge_stop([part], _asked({1: [name]}))["results"][name]["error"].endswith(
            f"its result for {name!r} {problem}")

    def test_list_sums_each_shards_counts_then_divides(self):
        def item(drafts: int, tokens: int, accepted: int) -> dict:
            return {"id": "w", "state": "stopped", "targets": ["a"], "started_at": 1.0,
                    "stopped_at": 2.0, "aggregate": {
                        "status": "ok", "num_drafts": drafts, "draft_tokens": tokens,
                        "accepted_tokens": accepted, "acceptance_rate": 100 * accepted / tokens,
                        "acceptance_length": 1 + accepted / drafts}}
        parts = [ShardPart(0, "http://s0", {"windows": [item(10, 30, 20)]}, 200),
                 ShardPart(1, "http://s1", {"windows": [item(7, 21, 3)]}, 200)]
        status, body = merged_list(parts, Asked(2, {}, {}, query={"limit": "10"}))
        assert status == 200
        (merged,) = body["windows"]
        figures = merged["aggregate"]
        assert (figures["num_drafts"], figures["draft_tokens"], figures["accepted_tokens"]) == (
            17, 51, 23)
        assert figures["acceptance_rate"] == 100 * 23 / 51
        assert merged["targets"] == ["a", "a"]


class TestSettle:
    def test_a_shard_that_could_not_save_is_a_retry_for_a_window_not_for_a_list(self):
        from exporter.core.errors import StoreError
        from exporter.core.shards import settle

        def parts() -> list[ShardPart]:
            return [ShardPart(0, "http://s0", {"windows": []}, 200, local=True),
                    ShardPart(1, "http://s1", status=503, error="disk full")]

        fleet = {"a": ("http://a/metrics", "a:1"), "b": ("http://b/metrics", "b:1")}
        shares = {0: ["a"], 1: ["b"]}
        with pytest.raises(StoreError, match="shard 1 at http://s1 answered 503: disk full"):
            settle(parts(), Asked(2, fleet, shares, "w"))
        listed = parts()
        settle(listed, Asked(2, fleet, shares))
        assert merged_list(listed, Asked(2, fleet, shares))[1]["shards"][1]["error"] == (
            "shard 1 at http://s1 answered 503: disk full")
