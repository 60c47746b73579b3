"""Reset-safe counter increases: one series, one target over scrapes, the live span."""

from __future__ import annotations

import json
import math

import pytest

from exporter.core.anomaly import Anomaly, AnomalyTally, find_anomaly
from exporter.core.counting import Accumulator, LiveTrack, counter_increase
from exporter.core.loadbands import UNKNOWN, reported
from exporter.core.snapshot import Counts, Field, SeriesKey, Snapshot, pack_counts

NAN = math.nan
INF = math.inf

D = Field.DRAFTS
T = Field.DRAFT_TOKENS
A = Field.ACCEPTED
P = Field.PER_POS


def key(fld: Field, engine: str = "0", position: int = -1, model: str = "m") -> SeriesKey:
    return SeriesKey(fld, model, engine, position)


def snap(values: dict, created: dict | None = None) -> Snapshot:
    return Snapshot(values=dict(values), created=dict(created or {}))


def engine_page(engine: str, drafts: float, tokens: float, per_pos: list[float]) -> dict:
    """One engine's series: drafts, draft tokens, accepted (sum of positions), per position."""
    values = {key(D, engine): drafts, key(T, engine): tokens, key(A, engine): sum(per_pos)}
    values |= {key(P, engine, pos): v for pos, v in enumerate(per_pos)}
    return values


def feed_all(acc: Accumulator, pages: list[Snapshot], start: float = 100.0) -> list[bool]:
    return [acc.feed(page, start + i) for i, page in enumerate(pages)]


class TestCounterIncrease:
    @pytest.mark.parametrize(
        "before,before_created,now,now_created,want",
        [
            (10, None, 15, None, (5, False)),
            (10, 1.0, 15, 1.0, (5, False)),
            (0, None, 0, None, (0, False)),
            (10, 1.0, 10, 1.0, (0, False)),
            (10.5, None, 12.25, None, (1.75, False)),
            (2.04363e06, None, 2.04364e06, None, (10, False)),
            # decrease: restarted, it grew from zero to `now`
            (10, None, 3, None, (3, True)),
            (10, 1.0, 3, 1.0, (3, True)),
            (10, 1.0, 0, 2.0, (0, True)),
            # a changed _created is a restart even when the value grew past the old one
            (10, 1.0, 15, 2.0, (15, True)),
            (10, 1.0, 10, 2.0, (10, True)),
            # _created missing on one side (multi API server): only a decrease tells
            (10, None, 15, 2.0, (5, False)),
            (10, 1.0, 15, None, (5, False)),
            (10, None, 3, 2.0, (3, True)),
            (10, 1.0, 3, None, (3, True)),
            # a NaN or infinite _created says nothing (NaN != NaN must not read as a restart)
            (10, NAN, 15, NAN, (5, False)),
            (10, 1.0, 15, NAN, (5, False)),
            (10, NAN, 15, 1.0, (5, False)),
            (10, INF, 15, INF, (5, False)),
        ],
    )
    def test_table(self, before, before_created, now, now_created, want):
        assert counter_increase(before, before_created, now, now_created) == pytest.approx(want)


class TestAccumulator:
    @pytest.mark.parametrize(
        "sequence,want,resets",
        [
            ([1, 2, 5], 4, 0),
            ([5, 5, 5], 0, 0),
            ([5], 0, 0),
            ([10, 20, 3, 8], 10 + 3 + 5, 1),  # restart between 20 and 3
            ([10, 20, 0, 4, 2, 6], 10 + 0 + 4 + 2 + 4, 2),
            ([10, NAN, 14], 4, 0),  # the NaN scrape not taken, bridged by the next one
            ([10, INF, 14], 4, 0),
            ([10, -3, 14], 4, 0),
            ([10, NAN, 7], 7, 1),
            # No usable baseline: the first usable scrape is the baseline, not zero (counting
            # from zero put a server's whole lifetime count into the window).
            ([NAN, 10, 14], 4, 0),
            ([NAN, -1, 10, 14], 4, 0),
            ([10, 14, NAN], 4, 0),
            ([0.5, 1.25, 2.0], 1.5, 0),
        ],
    )
    def test_one_series(self, sequence, want, resets):
        acc = Accumulator()
        feed_all(acc, [snap({key(D): v}) for v in sequence])
        assert acc.totals().drafts == pytest.approx(want)
        assert acc.resets == resets
        usable = [v for v in sequence if 0 <= v < INF]
        assert acc.scrapes == len(usable)
        anomalies = sum(t.count for t in (acc.anomalies_before, acc.anomalies_inside,
                                          acc.anomalies_after))
        assert anomalies == len(sequence) - len(usable)

    def test_anomalies_before_inside_and_after_the_span(self):
        acc = Accumulator()
        tokens = key(T)
        pages = [
            snap({key(D): NAN, tokens: 1.0}),  # 100: before the first usable scrape
            snap({key(D): 1.0, tokens: -2.0}),  # 101: before, too
            snap({key(D): 2.0, tokens: 6.0}),  # 102: baseline
            snap({key(D): INF, tokens: NAN}),  # 103: inside (bridged by 104)
            snap({key(D): 4.0, tokens: 12.0}),  # 104
            snap({key(D): NAN, tokens: 20.0}),  # 105: after the last usable scrape
        ]
        feed_all(acc, pages)
        assert (acc.first_at, acc.last_at, acc.scrapes) == (102.0, 104.0, 2)
        assert acc.totals() == Counts(2.0, 6.0, 0.0, {})
        before, inside, after = acc.anomalies_before, acc.anomalies_inside, acc.anomalies_after
        drafts = 'num_drafts{engine="0",model_name="m"}'
        tokens_text = 'num_draft_tokens{engine="0",model_name="m"}'
        assert before == AnomalyTally(2, Anomaly(100.0, drafts, "NaN"),
                                      Anomaly(101.0, tokens_text, "-2"))
        assert inside == AnomalyTally(1, Anomaly(103.0, tokens_text, "NaN", others=1),
                                      Anomaly(103.0, tokens_text, "NaN", others=1))
        last = Anomaly(105.0, drafts, "NaN")
        assert after == AnomalyTally(1, last, last)
        back = Accumulator.from_dict(json.loads(acc.to_json()))
        assert back == acc

    @pytest.mark.parametrize("value,text", [
        (NAN, "NaN"), (INF, "+Inf"), (-INF, "-Inf"), (-5.0, "-5"), (-0.25, "-0.25"),
    ])
    def test_anomaly_names_series_and_value(self, value, text):
        position = SeriesKey(P, "org/model", "1", 11, (("job", "vllm"),))
        found = find_anomaly(snap({position: value, key(D): 3.0}), 7.0)
        assert found == Anomaly(
            7.0, 'accepted_per_pos{engine="1",model_name="org/model",position="11",job="vllm"}',
            text,
        )

    def test_long_label_values_are_cut_in_the_anomaly(self):
        found = find_anomaly(snap({key(D, model="x" * 100_000): NAN}), 7.0)
        assert found is not None
        assert found.series == f'num_drafts{{engine="0",model_name="{"x" * 117}..."}}'

    def test_negative_zero_is_usable(self):
        assert find_anomaly(snap({key(D): -0.0}), 1.0) is None

    @pytest.mark.parametrize(
        "sequence,want,resets",
        [
            ([(10, 1.0), (15, 1.0), (20, 1.0)], 10, 0),
            ([(10, 1.0), (15, 2.0), (20, 2.0)], 15 + 5, 1),  # restart and grew past 10
            ([(10, 1.0), (15, None), (20, 2.0)], 5 + 5, 0),
            ([(10, NAN), (15, NAN), (20, NAN)], 10, 0),
        ],
    )
    def test_created(self, sequence, want, resets):
        acc = Accumulator()
        pages = [snap({key(D): v}, {key(D): c} if c is not None else {}) for v, c in sequence]
        feed_all(acc, pages)
        assert acc.totals().drafts == want
        assert acc.resets == resets

    def test_feed_says_whether_reset(self):
        acc = Accumulator()
        assert feed_all(acc, [snap({key(D): v}) for v in (5, 8, 2, 3)]) == [
            False, False, True, False
        ]

    def test_series_vanishing_and_reappearing(self):
        acc = Accumulator()
        pages = [
            snap(engine_page("0", 10, 30, [8, 4, 2]) | engine_page("1", 20, 60, [15, 9, 3])),
            snap(engine_page("0", 12, 36, [10, 5, 2])),  # engine 1 missing from this scrape
            snap({}),  # nothing at all (a page without spec-decode series)
            snap(engine_page("0", 14, 42, [11, 6, 3]) | engine_page("1", 25, 75, [19, 11, 4])),
        ]
        feed_all(acc, pages)
        totals = acc.totals()
        assert totals.drafts == (14 - 10) + (25 - 20)
        assert totals.draft_tokens == (42 - 30) + (75 - 60)
        assert totals.accepted == (20 - 14) + (34 - 27)
        assert dict(totals.per_position) == {0: 3 + 4, 1: 2 + 2, 2: 1 + 1}
        assert acc.resets == 0
        assert acc.engines == {"0", "1"}

    def test_the_last_page_is_held_not_copied(self):
        # The target's last scrape, its live track and every open window hold one page.
        first = snap(engine_page("0", 10, 30, [8, 4]), {key(D): 1.0})
        second = snap(engine_page("0", 12, 36, [9, 5]), {key(D): 1.0})
        window, live = Accumulator(), LiveTrack(span=60.0)
        for i, page in enumerate((first, second)):
            window.feed(page, 100.0 + i)
            live.feed(page, 100.0 + i)
        assert window.last is second.values and window.created is second.created
        assert live.accumulator.last is second.values
        assert not window.gone and window.has_series
        assert window.totals().drafts == 2

    def test_series_off_the_page_kept_apart_until_back(self):
        acc = Accumulator()
        both = engine_page("0", 10, 30, [8]) | engine_page("1", 20, 60, [15])
        feed_all(acc, [snap(both), snap(engine_page("0", 12, 36, [9]))])
        assert set(acc.gone) == set(engine_page("1", 0, 0, [0]))
        assert {t for _, _, t in acc.gone.values()} == {100.0}  # read at the first scrape
        assert acc.current().drafts == 12 + 20  # AISBench's `after`: as last read
        assert acc.model_names == ["m"] and acc.has_series
        acc.feed(snap(engine_page("0", 13, 39, [10]) | engine_page("1", 22, 66, [16])), 102.0)
        assert not acc.gone and acc.totals().drafts == 3 + 2

    def test_a_series_renamed_while_off_the_page_counts_from_its_value(self):
        # Engine "" drops off the page, then comes back labelled engine="0": the same series.
        acc = Accumulator()
        feed_all(acc, [snap(engine_page("", 10, 30, [8])), snap({}),
                       snap(engine_page("0", 15, 45, [11]))])
        totals = acc.totals()
        assert (totals.drafts, totals.draft_tokens, totals.accepted) == (5, 15, 3)
        assert acc.resets == 0 and not acc.gone

    def test_nothing_on_any_page_has_no_series(self):
        acc = Accumulator()
        feed_all(acc, [snap({}), snap({})])
        assert not acc.has_series and acc.scrapes == 2

    def test_series_reappearing_after_restart(self):
        acc = Accumulator()
        pages = [
            snap({key(D, "0"): 10, key(D, "1"): 50}, {key(D, "1"): 1.0}),
            snap({key(D, "0"): 12}),
            snap({key(D, "0"): 13, key(D, "1"): 60}, {key(D, "1"): 2.0}),  # restarted, 60 new
        ]
        assert feed_all(acc, pages) == [False, False, True]
        assert acc.totals().drafts == 3 + 60

    def test_new_engine_mid_window_counts_from_zero(self):
        acc = Accumulator()
        pages = [
            snap(engine_page("0", 10, 30, [8, 4, 2])),
            snap(engine_page("0", 12, 36, [9, 5, 2]) | engine_page("1", 3, 9, [3, 2, 1])),
            snap(engine_page("0", 14, 42, [10, 6, 2]) | engine_page("1", 5, 15, [5, 3, 1])),
        ]
        feed_all(acc, pages)
        totals = acc.totals()
        assert totals.drafts == 4 + 5
        assert totals.draft_tokens == 12 + 15
        assert dict(totals.per_position) == {0: 2 + 5, 1: 2 + 3, 2: 0 + 1}
        assert acc.resets == 0
        assert acc.before == Counts(10, 30, 14, {0: 8, 1: 4, 2: 2})
        assert acc.current() == Counts(19, 57, 27, {0: 15, 1: 9, 2: 3})

    def test_series_absent_at_baseline_and_zero_later(self):
        acc = Accumulator()
        feed_all(acc, [snap({}), snap({key(D): 0}), snap({key(D): 4})])
        assert acc.totals().drafts == 4

    def test_several_engines_with_one_restarting(self):
        acc = Accumulator()
        pages = [
            snap(engine_page("0", 100, 300, [90, 60, 30]) | engine_page("1", 200, 600, [1, 1, 1])),
            snap(engine_page("0", 110, 330, [99, 66, 33]) | engine_page("1", 5, 15, [4, 3, 2])),
            snap(engine_page("0", 120, 360, [108, 72, 36]) | engine_page("1", 9, 27, [7, 5, 3])),
        ]
        assert feed_all(acc, pages) == [False, True, False]
        totals = acc.totals()
        assert totals.drafts == 20 + 9
        assert totals.draft_tokens == 60 + 27
        assert dict(totals.per_position) == {0: 18 + 7, 1: 12 + 5, 2: 6 + 3}
        assert totals.accepted == sum(totals.per_position.values())
        assert acc.resets == 1

    def test_twelve_positions_and_models(self):
        acc = Accumulator()
        first = {
            key(P, e, pos, m): 10.0 * pos for e in "01" for m in ("a", "b") for pos in range(12)
        }
        second = {k: v + k.position + 1 for k, v in first.items()}
        feed_all(acc, [snap(first), snap(second)])
        per_pos = acc.totals().per_position
        assert dict(per_pos) == {pos: 4 * (pos + 1) for pos in range(12)}
        assert set(acc.by_model()) == {"a", "b"}
        assert acc.by_model()["a"].per_position[11] == 2 * 12
        assert acc.model_names == ["a", "b"]

    def test_nan_baseline_is_not_the_baseline(self):
        acc = Accumulator()
        feed_all(acc, [snap({key(D, "0"): 10, key(D, "1"): NAN}), snap({key(D, "0"): 12})])
        assert acc.before == Counts(drafts=12)
        assert acc.current().drafts == 12
        assert acc.scrapes == 1

    def test_times_and_dialect(self):
        acc = Accumulator()
        acc.feed(Snapshot({}, {}, dialect="vllm"), 5.0)
        acc.feed(Snapshot({key(D): 1.0}, {}, dialect="vllm-v0"), 7.5)
        acc.feed(Snapshot({}, {}, dialect="llamacpp"), 9.0)  # empty page keeps the dialect
        assert (acc.first_at, acc.last_at, acc.scrapes) == (5.0, 9.0, 3)
        assert acc.dialect == "vllm-v0"

    def test_round_trip(self):
        acc = Accumulator()
        extra = SeriesKey(D, "org/m x", "3", -1, (("instance", "a:1"), ("job", "vllm")))
        pages = [
            snap(engine_page("0", 10, 30, [8, 4, 2]) | {extra: 1.0}, {key(D): 1.0}),
            snap(engine_page("0", 12, 36, [9, 5, 2]) | {extra: 4.0}, {key(D): 1.0}),
            snap(engine_page("0", 2, 6, [1, 1, 0]) | engine_page("1", 3, 9, [3, 2, 1]),
                 {key(D): 2.0}),
        ]
        feed_all(acc, pages)
        back = Accumulator.from_dict(json.loads(acc.to_json()))
        assert back == acc
        assert back.totals() == acc.totals()
        assert back.to_json() == acc.to_json()
        # and it carries on the same as the original
        nxt = snap(engine_page("0", 4, 12, [2, 2, 1]) | engine_page("1", 6, 18, [5, 4, 2]))
        assert back.feed(nxt, 200.0) == acc.feed(nxt, 200.0)
        assert back == acc

    def test_round_trip_empty(self):
        acc = Accumulator()
        assert Accumulator.from_dict(json.loads(acc.to_json())) == acc

    def test_to_json_reads_back_in_every_state(self):
        # `to_json` is written by hand: it must read back in every state (restarts, anomalies,
        # gauges, non-finite values, two engines).
        acc = Accumulator()
        pages = [
            snap(engine_page("0", NAN, 30, [8, 4, 2])),  # an anomaly before the first usable
            snap(engine_page("0", 10, 30, [8, 4, 2]) | engine_page("1", 3, 9, [3, 2, 1])),
            snap(engine_page("0", 12, 36, [9, 5, 2]) | engine_page("1", 1, 3, [1, 1, 0])),
            snap(engine_page("0", 13, INF, [9, 5, 2])),  # an anomaly inside
            snap(engine_page("0", 14, 40, [10, 6, 2]) | engine_page("1", 2, 6, [2, 1, 0])),
        ]
        feed_all(acc, pages)
        acc.gauge_weighted, acc.gauge_seconds = {"acceptance": 1.5}, {"acceptance": 2.0}
        assert acc.resets and acc.anomalies_before.count and acc.anomalies_inside.count
        text = acc.to_json()
        assert Accumulator.from_dict(json.loads(text)) == acc
        # The baseline's text is kept between saves: a new baseline must show in the next one.
        acc.packed_before = pack_counts(Counts(1, 2, 3, {0: 3}))
        assert Accumulator.from_dict(json.loads(acc.to_json())) == acc
        assert json.loads(acc.to_json())["before"] != json.loads(text)["before"]
        # A series that appears later changes the key list the text was built from.
        acc.feed(snap(engine_page("0", 15, 43, [10, 6, 3, 1])), 300.0)
        assert Accumulator.from_dict(json.loads(acc.to_json())) == acc


def step(per_second: float, at: float) -> Snapshot:
    return snap({key(D): per_second * at, key(T): 3 * per_second * at, key(A): 2 * per_second * at})


class TestTotalsAndModels:
    """`totals()` is kept between feeds and follows each feed; `by_model` per model name."""

    def test_totals_follow_each_feed(self):
        acc = Accumulator()
        acc.feed(snap(engine_page("0", 10, 30, [5, 2])), 100.0)
        assert acc.totals().drafts == 0
        assert acc.totals() is acc.totals()  # kept, not summed again
        acc.feed(snap(engine_page("0", 14, 42, [7, 3])), 105.0)
        assert acc.totals() == Counts(4, 12, 3, {0: 2, 1: 1})
        acc.feed(snap(engine_page("0", NAN, 42, [7, 3])), 110.0)  # not taken
        acc.feed(snap(engine_page("0", 20, 60, [9, 4])), 115.0)
        assert acc.totals() == Counts(10, 30, 6, {0: 4, 1: 2})

    def test_restored_accumulator_sums_its_own_state(self):
        acc = Accumulator()
        feed_all(acc, [snap(engine_page("0", 10, 30, [5])), snap(engine_page("0", 12, 36, [6]))])
        acc.totals()
        back = Accumulator.from_dict(json.loads(acc.to_json()))
        assert back.totals() == acc.totals() == Counts(2, 6, 1, {0: 1})
        assert back == acc  # the kept totals are no part of the state

    def test_by_model_one_model_is_the_totals(self):
        acc = Accumulator()
        feed_all(acc, [snap(engine_page("0", 10, 30, [5])), snap(engine_page("0", 12, 36, [6]))])
        assert acc.by_model() == {"m": acc.totals()}

    def test_by_model_two_models(self):
        def page(scale: int) -> dict:
            values = {key(D, model="a"): 10.0 * scale, key(P, position=0, model="a"): 4.0 * scale}
            return values | {key(D, model="b"): 5.0 * scale, key(P, position=0, model="b"): scale}

        acc = Accumulator()
        feed_all(acc, [snap(page(1)), snap(page(2))])
        assert acc.by_model() == {"a": Counts(10, 0, 0, {0: 4}), "b": Counts(5, 0, 0, {0: 1})}
        assert acc.totals() == Counts(15, 0, 0, {0: 5})


class TestLiveTrack:
    def test_needs_two_points(self):
        live = LiveTrack(span=60)
        assert live.over_span(0) is None
        live.feed(step(1, 0), 0)
        assert live.over_span(0) is None
        live.feed(step(1, 5), 5)
        assert live.over_span(5).drafts == 5

    @pytest.mark.parametrize(
        "times,now,want",
        [
            (range(0, 200, 5), 195, 60),  # exactly the span
            (range(0, 200, 7), 196, 63),  # the point at or before now-span: 133, up to 196
            (range(0, 30, 5), 25, 25),  # younger than the span: everything there is
            (range(0, 200, 5), 230, 25),  # scrapes stopped: from 170 to the last one (195)
            (range(0, 200, 5), 400, None),  # all older than the span: nothing live
        ],
    )
    def test_over_span(self, times, now, want):
        live = LiveTrack(span=60)
        for at in times:
            live.feed(step(1, at), float(at))
        got = live.over_span(float(now))
        if want is None:
            assert got is None
        else:
            assert got.drafts == want
            assert got.draft_tokens == 3 * want
            assert got.accepted == 2 * want

    def test_rate_change_seen_within_span(self):
        live = LiveTrack(span=60)
        for at in range(0, 300):
            # 1 draft per second up to t=200, then 3 per second
            value = at if at < 200 else 200 + 3 * (at - 200)
            live.feed(snap({key(D): value}), float(at))
        assert live.over_span(299).drafts == 3 * 60

    def test_reset_inside_span(self):
        live = LiveTrack(span=60)
        values = [100, 110, 120, 5, 15]
        for i, v in enumerate(values):
            live.feed(snap({key(D): v}), float(i * 10))
        assert live.over_span(40).drafts == 10 + 10 + 5 + 10

    def test_pruning_keeps_memory_bounded(self):
        live = LiveTrack(span=60)
        for at in range(10_000):
            live.feed(step(2, at), float(at))
            assert len(live.points) <= 62
        assert live.over_span(9_999).drafts == 120
        assert live.points[0][0] <= 9_999 - 60


class TestLiveTrackSpacing:
    """Scrapes closer than `spacing` are thinned: the points follow the spacing, not the rate."""

    @staticmethod
    def times(rate_s: float, until: float) -> list[float]:
        return [i * rate_s for i in range(int(until / rate_s))]

    def test_points_bounded_by_span_over_spacing_whatever_the_rate(self):
        for rate_s in (0.05, 0.3, 1.0, 2.4):
            live = LiveTrack(span=20, spacing=2.5)
            for at in self.times(rate_s, 200):
                live.feed(step(1, at), at)
                assert len(live.points) < 20 / 2.5 + 4
            unthinned = LiveTrack(span=20)
            for at in self.times(rate_s, 200):
                unthinned.feed(step(1, at), at)
            # what the bound saves: the track without spacing holds a point per scrape
            assert len(unthinned.points) >= 20 / rate_s

    def test_regular_rhythm_is_not_thinned(self):
        jittered = [5.0 * i + (0.9 if i % 3 else -0.9) for i in range(1, 60)]
        live, unthinned = LiveTrack(span=60, spacing=2.5), LiveTrack(span=60)
        for at in jittered:
            live.feed(step(1, at), at)
            unthinned.feed(step(1, at), at)
            assert list(live.points) == list(unthinned.points)

    def test_newest_two_are_the_last_two_scrapes(self):
        live = LiveTrack(span=20, spacing=2.5)
        times = self.times(0.1, 50)
        for before, at in zip(times, times[1:], strict=False):
            live.feed(step(1, before), before)
            live.feed(step(1, at), at)
            assert [p[0] for p in list(live.points)[-2:]] == [before, at]

    def test_span_start_within_spacing_of_the_exact_one(self):
        # the regular 5 s rhythm plus window markers: a start and a stop scrape every 1.5 s
        scrapes = sorted({*range(0, 300, 5), *(m * 1.5 for m in range(200)),
                          *(m * 1.5 + 0.6 for m in range(200))})
        live = LiveTrack(span=20, spacing=2.5)
        for i, at in enumerate(scrapes):
            live.feed(step(1, at), float(at))
            later = scrapes[i + 1] if i + 1 < len(scrapes) else at + 5
            for now in (at, (at + later) / 2) if i else ():
                exact = max(t for t in scrapes[: i + 1] if t <= now - 20) if now >= 20 else None
                ends = live.span_ends(now)
                assert ends is not None and ends[1][0] == at
                if exact is None:
                    assert ends[0][0] == scrapes[0]
                else:
                    assert exact - 2.5 < ends[0][0] <= exact
                # the increase is the one between those two scrapes
                assert live.over_span(now).drafts == at - ends[0][0]

    def test_a_thinned_track_keeps_its_points_identity(self):
        # the exposition caches by the identity of `span_ends`' points: thinning moves none
        live = LiveTrack(span=20, spacing=2.5)
        for at in self.times(0.5, 30):
            before = list(live.points)
            live.feed(step(1, at), at)
            kept = set(map(id, live.points))
            assert not before or id(before[-1]) in kept, "the newest point was rebuilt"
            assert len(kept & set(map(id, before))) == len(live.points) - 1


class TestLiveTrackPacked:
    """Points are kept packed; `span_ends` hands out the very totals the track saw."""

    @staticmethod
    def pages(at: float) -> Snapshot:
        # two engines of different k (position 2 drafted by one only): uneven position drafts
        i = at + 1
        return snap(engine_page("0", 10 * i, 30 * i, [6 * i, 4 * i, 2 * i])
                    | engine_page("1", 5 * i, 10 * i, [3 * i, 1 * i]))

    def test_span_ends_are_the_totals_fed(self):
        live, reference, seen = LiveTrack(span=20, spacing=2.5), Accumulator(), {}
        for at in [i * 0.7 for i in range(120)]:
            live.feed(self.pages(at), at)
            reference.feed(self.pages(at), at)
            seen[at] = reference.totals()
            for now in (at, at + 3.0):
                ends = live.span_ends(now)
                if ends is None:
                    continue
                (start_at, start), (end_at, end) = ends
                assert end is live.accumulator.totals() and end_at == at
                assert start == seen[start_at]
                assert start.position_drafts  # the uneven drafts survive the packing
                assert live.over_span(now) == end - seen[start_at]
        assert not any(isinstance(item, Counts) for point in live.points for item in point)

    def test_the_same_pairs_until_an_end_moves(self):
        live = LiveTrack(span=20)
        for at in range(0, 30, 5):
            live.feed(step(1, at), float(at))
        first = live.span_ends(26.0)
        assert first is not None and live.span_ends(26.0)[0] is first[0]
        assert live.span_ends(26.0)[1] is first[1]
        assert live.span_ends(29.0)[0] is first[0]  # the start did not move: the same pair
        live.feed(step(1, 28), 28.0)
        moved = live.span_ends(28.0)
        assert moved[0] is first[0] and moved[1] is not first[1]  # only the end moved
        assert live.span_ends(31.0)[0] is not first[0]  # now the start moved on
        assert live.span_ends(31.0)[0][0] == 10.0


class TestRestartSeenLate:
    def test_series_skipped_across_a_restart_does_not_recount_its_engine(self):
        drafts, accepted = key(Field.DRAFTS), key(Field.ACCEPTED)
        acc = Accumulator()
        acc.feed(snap({drafts: 100.0, accepted: 50.0}), 1.0)  # baseline
        acc.feed(snap({drafts: 110.0, accepted: 55.0}), 2.0)  # +10, +5
        acc.feed(snap({drafts: 4.0}), 3.0)  # restart; accepted missing from this page
        acc.feed(snap({drafts: 9.0, accepted: 3.0}), 4.0)  # accepted shows it a scrape late
        totals = acc.totals()
        assert totals.drafts == 10 + 4 + 5  # not 10 + 4 + 9
        assert totals.accepted == 5 + 3
        assert acc.resets == 2  # both scrapes showed a restart of some series

    def test_restart_behind_an_unusable_scrape_counts_once(self):
        drafts, accepted = key(Field.DRAFTS), key(Field.ACCEPTED)
        acc = Accumulator()
        acc.feed(snap({drafts: 100.0, accepted: 50.0}), 1.0)  # baseline
        acc.feed(snap({drafts: 110.0, accepted: 55.0}), 2.0)  # +10, +5
        acc.feed(snap({drafts: 4.0, accepted: float("nan")}), 3.0)  # restart; scrape not taken
        acc.feed(snap({drafts: 9.0, accepted: 3.0}), 4.0)  # the restart, seen here
        totals = acc.totals()
        assert totals.drafts == 10 + 9
        assert totals.accepted == 5 + 3
        assert acc.resets == 1


class StoredRows:
    """What the store keeps of one accumulator: its whole row and the round part after it."""

    def __init__(self):
        self.whole: dict | None = None
        self.part: dict | None = None

    def save(self, acc: Accumulator, *, whole: bool = False, commit: bool = True) -> bool:
        """One save of `acc` (committed unless told); whether it wrote the whole row."""
        encoded = acc.encode(whole=whole)
        if commit:
            if encoded.whole:
                self.whole, self.part = json.loads(encoded.text), None
            else:
                self.part = json.loads(encoded.text)
            acc.saved(encoded)
        return encoded.whole

    def load(self) -> Accumulator:
        assert self.whole is not None
        return Accumulator.from_dict(self.whole | ({"round": self.part} if self.part else {}))


def two_engines(drafts: float, created: float = 1.0, *, second: bool = True, k: int = 3,
                gauges: dict | None = None) -> Snapshot:
    values = engine_page("0", drafts, 3 * drafts, [drafts - p for p in range(k)])
    if second:
        values |= engine_page("1", 2 * drafts, 6 * drafts, [drafts] * 3)
    return Snapshot(values=values, created={k: created for k in values if k.engine == "0"},
                    gauges=gauges or {})


class TestRoundPart:
    # (page, whether its save writes the whole row): only what a round cannot say goes whole.
    STEPS = [
        (two_engines(10), True),  # nothing saved yet
        (two_engines(12), False),
        (two_engines(15, gauges={"acceptance": 0.5}), False),  # gauges' sums: the round's
        (two_engines(17, second=False), False),  # engine 1 absent: its seen times stay behind
        (two_engines(19), False),
        (two_engines(4), True),  # a restart: restarts and their spans
        (two_engines(6), False),
        (two_engines(9, k=4), True),  # a new series
        (two_engines(NAN, k=4), True),  # an anomaly
        (two_engines(11, k=4), True),  # the anomaly moves inside the counted span
        (two_engines(13, k=4), False),
        (two_engines(14, created=2.0, k=4), True),  # a restart told by `_created` alone
        (two_engines(16, created=2.0, k=4), False),
    ]

    def test_every_save_reads_back_the_same(self):
        acc, stored = Accumulator(), StoredRows()
        for i, (page, whole) in enumerate(self.STEPS):
            acc.feed(page, 100.0 + i)
            assert stored.save(acc) == whole, i
            assert stored.load() == acc, i
            assert stored.load().totals() == acc.totals()
        assert acc.resets == 2 and acc.anomalies_inside.count == 1 and acc.gauge_seconds

    def test_a_series_off_the_page_keeps_its_seen_time(self):
        acc, stored = Accumulator(), StoredRows()
        for i, (page, _) in enumerate(self.STEPS[:4]):
            acc.feed(page, 100.0 + i)
            stored.save(acc)
        assert stored.part is not None
        at = {t for _, t in stored.part["seen"]}
        assert at == {102.0} and len(stored.part["seen"]) == 6  # engine 1's six series
        assert stored.load().gone == acc.gone

    def test_a_round_part_holds_no_time_per_series(self):
        acc, stored = Accumulator(), StoredRows()
        for i, (page, _) in enumerate(self.STEPS[:2]):
            acc.feed(page, 1_764_000_000.123456 + i)
            stored.save(acc)
        assert stored.part is not None and stored.part["seen"] == []
        whole = acc.to_json()
        part = acc.encode().text
        assert len(part) * 3 < len(whole)
        assert part.count("1764000001.123456") == 1  # the round's one time

    def test_an_uncommitted_whole_row_is_written_again(self):
        # A save that failed leaves the store with the older whole row: the next save must not
        # write a round part against a row the store does not have.
        acc, stored = Accumulator(), StoredRows()
        acc.feed(two_engines(10), 100.0)
        stored.save(acc)
        acc.feed(two_engines(12, k=4), 101.0)  # a new series: the whole row
        assert stored.save(acc, commit=False)
        acc.feed(two_engines(14, k=4), 102.0)
        assert stored.save(acc)
        assert stored.load() == acc
        acc.feed(two_engines(15, k=4), 103.0)
        assert not stored.save(acc)

    def test_whole_when_asked(self):
        acc, stored = Accumulator(), StoredRows()
        acc.feed(two_engines(10), 100.0)
        stored.save(acc)
        acc.feed(two_engines(12), 101.0)
        assert stored.save(acc, whole=True)
        assert stored.part is None and stored.load() == acc

    def test_series_with_an_increase_only_go_whole(self):
        # Series retired past MAX_ABSENT_SERIES keep their increase under one key with no
        # value: a round part (a value and an increase per series) cannot say them.
        acc, stored = Accumulator(), StoredRows()
        acc.feed(two_engines(10), 100.0)
        acc.increase[SeriesKey(D, "(series no longer on the page)", "", -1)] = 7.0
        assert stored.save(acc)
        acc.feed(two_engines(12), 101.0)
        assert stored.save(acc)
        assert stored.load() == acc

    def test_a_round_part_left_from_another_whole_row_is_not_read(self):
        # One whole row written since by a version that knows no round parts: the part that
        # was written against an older whole row is stale.
        acc, stored = Accumulator(), StoredRows()
        acc.feed(two_engines(10), 100.0)
        stored.save(acc)
        acc.feed(two_engines(12), 101.0)
        stored.save(acc)
        stale = stored.part
        acc.feed(two_engines(14), 102.0)
        newer = json.loads(acc.to_json())
        assert Accumulator.from_dict(newer | {"round": stale}) == acc

    def test_a_round_part_of_other_series_is_refused(self):
        acc, stored = Accumulator(), StoredRows()
        acc.feed(two_engines(10), 100.0)
        stored.save(acc)
        acc.feed(two_engines(12), 101.0)
        stored.save(acc)
        assert stored.whole is not None and stored.part is not None
        fewer = stored.whole | {"keys": stored.whole["keys"][1:],
                                "values": stored.whole["values"][4:]}
        with pytest.raises(ValueError, match=r"round part has 24 numbers for 11 series \(2 each\)"):
            Accumulator.from_dict(fewer | {"round": stored.part})


class TestWhatAnOpenWindowKeeps:
    """Each of an open window's targets keeps an accumulator: what it holds is shared or packed
    where it can be (memory flat across windows, issue 15)."""

    def test_an_unchanged_series_keeps_its_number(self):
        acc = Accumulator()
        feed_all(acc, [snap(engine_page("0", 10, 30, [8, 4])),
                       snap(engine_page("0", 12, 36, [9, 4]))])
        held = dict(acc.increase)
        acc.feed(snap(engine_page("0", 12, 36, [9, 4])), 200.0)  # nothing moved
        assert all(acc.increase[k] is held[k] for k in held)
        zeros = {id(v) for v in Accumulator().increase.values()}
        baseline = Accumulator()
        baseline.feed(snap(engine_page("0", 5, 15, [3, 2])), 1.0)
        assert len({id(v) for v in baseline.increase.values()} | zeros) == 1  # one 0.0

    def test_the_baseline_totals_are_packed(self):
        acc = Accumulator()
        acc.feed(snap(engine_page("0", 10, 30, [8, 4, 2])), 1.0)
        assert isinstance(acc.packed_before, tuple) and isinstance(acc.packed_before[0], bytes)
        assert acc.before == Counts(10, 30, 14, {0: 8, 1: 4, 2: 2})
        assert Accumulator().before is None

    def test_targets_alike_share_their_engines(self):
        accs = [Accumulator(), Accumulator()]
        for i, acc in enumerate(accs):
            acc.feed(snap(engine_page("0", 10 + i, 30, [8, 4])), 1.0)
            StoredRows().save(acc)
        assert accs[0].engines is accs[1].engines == {"0"}
        # A round part is still written against the saved keys (shared by targets alike).
        for acc in accs:
            acc.feed(snap(engine_page("0", 20, 60, [9, 5])), 2.0)
            assert not acc.encode().whole

    def test_what_most_never_hold_is_one_shared_empty_until_written(self):
        accs = [Accumulator(), Accumulator()]
        for acc in accs:
            feed_all(acc, [snap(engine_page("0", 10, 30, [8, 4])),
                           snap(engine_page("0", 12, 36, [9, 4]))])
        one, other = accs
        for name in ("gone", "gauge_weighted", "gauge_seconds", "reset_spans",
                     "anomalies_before", "anomalies_inside", "anomalies_after"):
            held = getattr(one, name)
            assert held is getattr(other, name), name
            assert (held.count if isinstance(held, AnomalyTally) else len(held)) == 0
        # Written by one (a series off the page, an interval gauge, a restart, an anomaly),
        # the other's stay empty.
        page = engine_page("0", 1, 3, [1])  # position 1 gone, every counter down: a restart
        one.feed(Snapshot(values=page, created={}, gauges={"sglang:spec_accept_rate": 0.5}),
                 300.0)
        one.feed(snap(engine_page("0", NAN, 3, [1])), 301.0)
        assert key(P, "0", 1) in one.gone and one.gauge_seconds and one.reset_spans
        assert one.anomalies_after.count == 1
        assert not other.gone and not other.gauge_seconds and not other.reset_spans
        assert not other.anomalies_after.count
        with pytest.raises(TypeError):
            other.gone[key(P)] = (1.0, None, 1.0)  # type: ignore[index]

    def test_the_shared_empty_survives_copies_and_the_store(self):
        import copy
        import pickle
        acc = Accumulator()
        acc.feed(snap(engine_page("0", 10, 30, [8, 4])), 1.0)
        for again in (copy.deepcopy(acc), pickle.loads(pickle.dumps(acc)),
                      Accumulator.from_dict(json.loads(acc.to_json()))):
            assert again.gone is acc.gone and again.gauge_weighted is acc.gauge_weighted
            assert again.anomalies_before == acc.anomalies_before  # pickled: an equal one
            again.feed(snap(engine_page("0", 12, 36, [9, 4])), 2.0)
            assert again.totals() == Counts(2, 6, 1, {0: 1, 1: 0})


def running_page(drafts: float, running: float | None, created: float = 1.0) -> Snapshot:
    """`two_engines`' page with a running-requests reading."""
    page = two_engines(drafts, created)
    return Snapshot(page.values, page.created, running=running)


class TestByLoad:
    """Each interval's increase in the band of its running-requests readings."""

    def test_bands_partition_the_increase_across_a_restart_and_a_bad_scrape(self):
        acc = Accumulator()
        nan_page = two_engines(1)
        nan_page = Snapshot({**nan_page.values, key(D): math.nan}, nan_page.created, running=9)
        pages = [running_page(10, 0), running_page(20, 1), running_page(40, 3),
                 nan_page,  # not taken: the next interval spans it, from the reading before
                 running_page(70, 5), running_page(5, 6, created=2.0),  # restarted
                 running_page(25, None, created=2.0), running_page(26, None, created=2.0)]
        feed_all(acc, pages)
        assert acc.resets == 1
        bands = acc.by_load
        assert {b: n for b, (n, _) in bands.items()} == {
            1: 1,  # 0 -> 1: mean 0.5, rounded up
            2: 1,  # 1 -> 3
            # 3 -> 5 (over the bad scrape); 5 -> 6 (the restart, counted from zero); 6 -> no
            # reading (the one there is)
            4: 3,
            UNKNOWN: 1}  # no reading at either end
        assert sum((c for _, c in bands.values()), Counts()) == acc.totals()
        assert bands[4][1].drafts == (70 - 40) * 3 + 5 * 3 + (25 - 5) * 3
        assert acc.running is None and acc.last_interval[0] == UNKNOWN

    def test_a_page_without_the_gauge_reports_no_band(self):
        acc = Accumulator()
        feed_all(acc, [two_engines(3), two_engines(4), two_engines(9)])
        assert acc.by_load == {UNKNOWN: (2, acc.totals())}
        assert not reported(acc.by_load)

    def test_rows_whole_and_round_keep_the_bands(self):
        acc, stored = Accumulator(), StoredRows()
        for i, (drafts, running) in enumerate([(3, 2), (4, 2), (9, 7)]):
            acc.feed(running_page(drafts, running), 100.0 + i)
            stored.save(acc)
        assert stored.part is not None  # the last rounds went as round parts
        for loaded in (stored.load(), Accumulator.from_dict(json.loads(acc.to_json()))):
            assert loaded.by_load == acc.by_load == {2: (1, loaded.by_load[2][1]),
                                                     4: (1, loaded.by_load[4][1])}
            assert loaded.running == 7
        # Fed on from the row, the next interval starts from the saved reading.
        loaded = stored.load()
        loaded.feed(running_page(12, 9), 103.0)
        assert loaded.last_interval[0] == 8

    def test_live_track_keeps_the_span_by_band(self):
        track = LiveTrack(span=10)
        for at, (drafts, running) in enumerate([(3, 1), (4, 1), (6, 4), (8, 4)]):
            track.feed(running_page(drafts, running), 100.0 + 5 * at)
        # The span 105..115 (one point at or before its start): the last two intervals.
        bands = track.span_bands(115.0)
        assert set(bands) == {2, 4}
        assert bands[2].drafts == (6 - 4) * 3 and bands[4].drafts == (8 - 6) * 3
        start, end = track.span_ends(115.0)
        assert sum(bands.values(), Counts()) == end[1] - start[1]
        assert track.accumulator.by_load == {}  # its span keeps them, not the whole track
