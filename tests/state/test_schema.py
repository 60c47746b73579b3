"""exporter/state/schema.py: a database of the forms version 0 wrote is migrated once, so that it
loads as the windows it held; a newer one is refused, not moved aside."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace

import pytest

from exporter.core.counting import Accumulator
from exporter.core.errors import StoreError
from exporter.core.loadbands import UNKNOWN
from exporter.core.snapshot import Counts, Field, SeriesKey, Snapshot
from exporter.core.window import AccumulatorRows, TargetRef, Window
from exporter.state.schema import SCHEMA_VERSION
from exporter.state.store import StateStore
from state.test_store import loaded

KEYS = [SeriesKey(Field.DRAFTS, "m", "0", -1), SeriesKey(Field.DRAFT_TOKENS, "m", "0", -1),
        SeriesKey(Field.ACCEPTED, "m", "0", -1), SeriesKey(Field.PER_POS, "m", "0", 0)]


def page(drafts: float, created: float = 1.0) -> Snapshot:
    values = dict(zip(KEYS, (drafts, 3 * drafts, drafts, drafts), strict=True))
    return Snapshot(values=values, created=dict.fromkeys(values, created),
                    gauges={"g": drafts}, dialect="vllm")


def counted() -> Accumulator:
    """An accumulator through a restart (restart times, a reset span) with gauges."""
    acc = Accumulator()
    for at, (drafts, created) in enumerate([(10, 1.0), (14, 1.0), (3, 50.0), (9, 50.0)]):
        acc.feed(page(drafts, created), 100.0 + at)
    return acc


def old_form(acc: Accumulator) -> dict:
    """An accumulator as version 0 wrote it inside its window row: a list per field."""
    data = json.loads(acc.to_json())
    keys, values = data.pop("keys"), data.pop("values")
    rows = [(k, *values[4 * i:4 * i + 4]) for i, k in enumerate(keys)]
    return data | {"last": [[k, v, c] for k, v, c, _, _ in rows if v is not None],
                   "increase": [[k, inc] for k, _, _, inc, _ in rows if inc is not None],
                   "seen": [[k, t] for k, _, _, _, t in rows if t is not None]}


def window_doc(acc: Accumulator | None = None, **drop: bool) -> dict:
    window = Window(id="w", name="w", labels={"run": "r"}, started_at=100.0,
                    targets={"a": TargetRef("a", "http://a:1/metrics", "a:1")})
    doc = window.to_dict()
    if acc is not None:
        doc["accumulators"] = {"a": old_form(acc)}
    return {k: v for k, v in doc.items() if not drop.get(k)}


def series_form(acc: Accumulator) -> dict:
    """The row-per-series form of an accumulator: [key, value, created, increase, seen]."""
    data = old_form(acc)
    increase = {json.dumps(k): v for k, v in data["increase"]}
    seen = {json.dumps(k): t for k, t in data["seen"]}
    old = {k: v for k, v in data.items() if k not in ("last", "increase", "seen")}
    old["series"] = [[k, v, c, increase.get(json.dumps(k)), seen.get(json.dumps(k))]
                     for k, v, c in data["last"]]
    return old


def version_0(path, doc: dict, accumulators: dict[str, str] | None = None) -> None:
    """A database as version 0 left it: no user_version, the tables of its time."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE windows (id TEXT PRIMARY KEY, open INTEGER NOT NULL, "
                   "started_at REAL NOT NULL, doc TEXT NOT NULL)")
        db.execute("CREATE TABLE accumulators (window_id TEXT NOT NULL, target TEXT NOT "
                   "NULL, doc TEXT NOT NULL, PRIMARY KEY (window_id, target))")
        db.execute("INSERT INTO windows VALUES (?, 1, 100.0, ?)", (doc["id"], json.dumps(doc)))
        for target, text in (accumulators or {}).items():
            db.execute("INSERT INTO accumulators VALUES (?, ?, ?)", (doc["id"], target, text))
    db.close()


def saved_in_rounds(path) -> Accumulator:
    """Window w's accumulator for target a, fed three pages and saved after each (its whole row
    and a round part), in a store at `path` left closed; the accumulator."""
    store = StateStore(path)
    window = Window.from_dict(window_doc())
    acc = window.accumulators["a"] = Accumulator()
    for at, drafts in enumerate([10, 12, 15]):
        acc.feed(page(drafts), 100.0 + at)
        rows = AccumulatorRows().add(window)
        store.save([window.to_dict()], rows.whole, rounds=rows.rounds)
        rows.committed()
    store.close()
    return acc


def user_version(path) -> int:
    with sqlite3.connect(path) as db:
        (version,) = db.execute("PRAGMA user_version").fetchone()
    db.close()
    return version


class TestVersion0:
    @pytest.mark.parametrize("form", ["keys", "series"])
    def test_an_accumulator_row_of_either_form_loads_as_it_was(self, tmp_path, form):
        acc = counted()
        text = acc.to_json() if form == "keys" else json.dumps(series_form(acc))
        version_0(tmp_path / "s.sqlite", window_doc(), {"a": text})
        back = loaded(tmp_path / "s.sqlite")
        assert back.accumulators == {"a": acc}
        assert back.accumulators["a"].restart_times == acc.restart_times != ()
        assert user_version(tmp_path / "s.sqlite") == SCHEMA_VERSION

    def test_accumulators_inside_the_window_row_get_rows_of_their_own(self, tmp_path):
        acc = counted()
        version_0(tmp_path / "s.sqlite", window_doc(acc))
        back = loaded(tmp_path / "s.sqlite")
        assert back.accumulators == {"a": acc}
        with sqlite3.connect(tmp_path / "s.sqlite") as db:
            (doc,) = db.execute("SELECT doc FROM windows").fetchone()
            rows = db.execute("SELECT target, doc FROM accumulators").fetchall()
        db.close()
        assert json.loads(doc)["accumulators"] == {}
        assert [(t, json.loads(d)) for t, d in rows] == [("a", json.loads(acc.to_json()))]

    def test_a_row_of_its_own_wins_over_the_copy_inside_the_window_row(self, tmp_path):
        newer, older = counted(), Accumulator()
        older.feed(page(10), 100.0)
        version_0(tmp_path / "s.sqlite", window_doc(older), {"a": newer.to_json()})
        assert loaded(tmp_path / "s.sqlite").accumulators == {"a": newer}

    @pytest.mark.parametrize("key", ["downtimes", "late_baselines", "series"])
    def test_keys_added_since_are_filled_in(self, tmp_path, key):
        version_0(tmp_path / "s.sqlite", window_doc(**{key: True}))
        back = loaded(tmp_path / "s.sqlite")
        assert back.id == "w" and back.labels == {"run": "r"}
        assert (back.downtimes, back.late_baselines, back.series) == ([], {}, {})
        with sqlite3.connect(tmp_path / "s.sqlite") as db:
            (doc,) = db.execute("SELECT doc FROM windows").fetchone()
        db.close()
        assert key in json.loads(doc)  # rewritten whole

    @pytest.mark.parametrize("missing", ["gauge_weighted", "restart_times", "dialect",
                                         "reset_spans", "anomalies"])
    def test_accumulator_fields_added_since_load_as_unknown(self, tmp_path, missing):
        acc = counted()
        data = old_form(acc)
        del data[missing]
        if missing == "gauge_weighted":
            del data["gauge_seconds"]
        version_0(tmp_path / "s.sqlite", window_doc(), {"a": json.dumps(data)})
        back = loaded(tmp_path / "s.sqlite").accumulators["a"]
        assert back.totals() == acc.totals()
        if missing == "restart_times":
            assert back.restart_times == ()
        if missing == "gauge_weighted":
            assert back.gauge_means() == {}

    def test_a_round_part_is_folded_into_its_whole_row(self, tmp_path):
        path = tmp_path / "s.sqlite"
        acc = saved_in_rounds(path)
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM accumulator_rounds").fetchone() == (1,)
            db.execute("PRAGMA user_version=0")  # as every database before versions
        db.close()
        assert loaded(path).accumulators == {"a": acc}
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM accumulator_rounds").fetchone() == (0,)
        db.close()

    def test_an_unreadable_row_is_left_as_it_is(self, tmp_path, caplog):
        version_0(tmp_path / "s.sqlite", window_doc(), {"a": "{not json"})
        store = StateStore(tmp_path / "s.sqlite")
        (doc,) = store.load_open()
        store.close()
        assert doc["accumulators"] == {}
        assert "accumulator state unreadable id=w target=a" in caplog.text


class TestVersions:
    def test_a_new_database_is_the_current_version(self, tmp_path):
        StateStore(tmp_path / "s.sqlite").close()
        assert user_version(tmp_path / "s.sqlite") == SCHEMA_VERSION

    def test_a_newer_database_is_refused_and_kept_where_it_is(self, tmp_path):
        path = tmp_path / "s.sqlite"
        StateStore(path).close()
        with sqlite3.connect(path) as db:
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        db.close()
        with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
            StateStore(path)
        assert path.exists() and not list(tmp_path.glob("*.corrupt-*"))


def version_1_stopped(path, window_id: str) -> dict:
    """A database as version 1 left it with one stopped window (its row without the blocks
    the handler added to `window.json` only); the answer in the row."""
    answer = {"id": window_id, "name": "w", "targets": ["a"], "results": {}, "aggregate": None}
    window = Window(id=window_id, name="w", labels={}, started_at=100.0, stopped_at=110.0,
                    targets={"a": TargetRef("a", "http://a:1/metrics", "a:1")}, answer=answer)
    doc = {k: v for k, v in window.to_dict().items() if k not in ("per_request", "edges")}
    store = StateStore(path)
    store.save([doc])
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version=1")
    db.close()
    return answer


class TestVersion1:
    def test_a_stopped_answer_takes_the_blocks_its_window_json_was_given(self, tmp_path):
        answer = version_1_stopped(tmp_path / "state.sqlite", "w")
        blocks = {"per_request": {"targets": {}, "aggregate": {"requests": 3}},
                  "edges": {"edges": "traffic", "skipped": 1}}
        (tmp_path / "w").mkdir()
        (tmp_path / "w" / "window.json").write_text(json.dumps(answer | blocks))
        store = StateStore(tmp_path / "state.sqlite")
        doc = store.load("w")
        store.close()
        assert doc is not None
        assert doc["answer"] == answer | blocks | {"results_dir": str(tmp_path / "w")}
        assert (doc["per_request"], doc["edges"]) == ({}, None)
        assert user_version(tmp_path / "state.sqlite") == SCHEMA_VERSION

    def test_without_its_files_a_stopped_answer_stays_as_it_was(self, tmp_path):
        answer = version_1_stopped(tmp_path / "state.sqlite", "gone")
        store = StateStore(tmp_path / "state.sqlite")
        doc = store.load("gone")
        store.close()
        assert doc is not None and doc["answer"] == answer


def _untimed(block: dict) -> dict:
    return {k: v for k, v in block.items() if k != "timing"}


class TestVersion2:
    def test_per_request_blocks_get_an_empty_timing_once(self, tmp_path):
        from exporter.core.perrequest import PerRequest, RequestStats
        from exporter.core.timing import Timings

        tally = PerRequest()
        for _ in range(2):  # answers without figures: counted, in their segments too
            tally.record(RequestStats("r", "m", None, None, None))
        open_window = Window(id="o", name="o", labels={}, started_at=100.0,
                             targets={"a": TargetRef("a", "http://a:1/metrics", "a:1")},
                             per_request={"a": tally})
        block = _untimed(tally.answer())
        answer = {"id": "s", "name": "s", "targets": ["a"], "results": {}, "aggregate": None,
                  "results_dir": str(tmp_path / "s"),
                  "per_request": {"targets": {"a": block}, "aggregate": block}}
        stopped = Window(id="s", name="s", labels={}, started_at=100.0, stopped_at=110.0,
                         targets={"a": TargetRef("a", "http://a:1/metrics", "a:1")},
                         answer=answer)
        docs = [open_window.to_dict(), stopped.to_dict()]
        docs[0]["per_request"]["a"] = _untimed(docs[0]["per_request"]["a"])
        path = tmp_path / "state.sqlite"
        store = StateStore(path)
        store.save(docs)
        store.close()
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA user_version=2")
        db.close()
        store = StateStore(path)
        opened, done = store.load("o"), store.load("s")
        store.close()
        empty = Timings().answer()
        assert opened is not None and opened["per_request"]["a"]["timing"] == empty
        assert done is not None
        blocks = done["answer"]["per_request"]
        assert blocks["targets"]["a"]["timing"] == blocks["aggregate"]["timing"] == empty
        assert user_version(path) == SCHEMA_VERSION


class TestVersion3:
    def test_what_a_row_counted_before_the_bands_is_in_the_unknown_band(self, tmp_path):
        path = tmp_path / "s.sqlite"
        acc = saved_in_rounds(path)
        with sqlite3.connect(path) as db:  # the rows as version 3 wrote them
            for table in ("accumulators", "accumulator_rounds"):
                (doc,) = db.execute(f"SELECT doc FROM {table}").fetchone()
                old = {k: v for k, v in json.loads(doc).items() if k not in ("by_load", "running")}
                db.execute(f"UPDATE {table} SET doc=?", (json.dumps(old),))
            db.execute("PRAGMA user_version=3")
        db.close()
        back = loaded(path).accumulators["a"]
        assert back.by_load == {UNKNOWN: (2, acc.totals())} and back.running is None
        assert back.totals() == acc.totals() and back.scrapes == 3
        # Counted on: the later intervals in their bands, the sums still the whole increase.
        back.feed(replace(page(20), running=3.0), 103.0)
        assert set(back.by_load) == {UNKNOWN, 2}
        assert sum((c for _, c in back.by_load.values()), Counts()) == back.totals()
        assert user_version(path) == SCHEMA_VERSION
