"""A stop answer encoded once: the files, window.json, the state DB row and the HTTP answer."""

from __future__ import annotations

import asyncio
import collections
import enum
import json
import math
import os
import pickle
import random
import re
import secrets
import sqlite3
import stat

import pytest
from randomjson import random_value

from exporter.server import isolate
from exporter.state.answertext import AnswerTexts, StopTexts, TextParts, compact, indented, with_key
from exporter.core.errors import StoreError
from exporter.core.isotime import with_iso_times
from exporter.core.stopped import LastWindow, StoppedWindow
from exporter.state.store import (
    PREPARED,
    PreparedFiles,
    StateStore,
    atomic_write,
    prepare_results,
    write_results,
)


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


def second_write_fails(monkeypatch) -> None:
    """The disk fills up at the second `os.write` (`monkeypatch.undo()` ends it)."""
    real, calls = os.write, []

    def second_fails(fd, data):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", second_fails)


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

    def test_with_key_adds_the_key_last(self):
        for value in ({}, {"a": [1, {"b": None}]}, {"x": "é"}):
            text = with_key(compact(value), "results_dir", "/out/w ü")
            assert json.loads(text) == value | {"results_dir": "/out/w ü"}
            assert list(json.loads(text))[-1] == "results_dir"

    def test_with_key_refuses_what_is_no_object(self):
        with pytest.raises(ValueError, match="JSON object"):
            with_key(b"[1, 2]", "k", 1)


class TestStopAnswerTexts:
    async def _stopped(self, fake_vllm, exporter, unused_tcp_port):
        ok, partial = await fake_vllm(k=3), await fake_vllm(k=2, engines=2)
        exp = await exporter({"targets": [
            {"name": "ok", "url": ok.url},
            {"name": "partial", "url": partial.url},
            {"name": "down", "url": f"http://127.0.0.1:{unused_tcp_port}/metrics"},
        ]})
        await exp.start(id="texts", labels={"team": "équipe 🙂", "run_at": "noon"})
        ok.server.add(0, 10, 30, [7, 4, 1])
        partial.server.add(1, 5, 10, [3, 1])
        await exp.round()
        ok.server.add(0, 2, 6, [1, 1, 0])
        await partial.stop()
        response = await exp.client.post("/api/v1/windows/texts/stop")
        assert response.status == 200
        return exp, await response.text()

    @pytest.mark.parametrize("where", ["child", "thread"])
    async def test_every_text_is_the_answer_in_json_dumps_layout(
            self, fake_vllm, exporter, unused_tcp_port, tmp_path, monkeypatch, where):
        # The stop's work runs in a forked child, or in a thread where there is no fork.
        monkeypatch.setenv(isolate.ENV, "1" if where == "child" else "0")
        exp, body = await self._stopped(fake_vllm, exporter, unused_tcp_port)
        answer = json.loads(body)
        assert {r["status"] for r in answer["results"].values()} == {"ok", "na"}
        assert answer["results"]["partial"]["coverage"] == "partial"
        # The HTTP answer: every ISO time already beside its time (key order included:
        # nothing walks the answer after the stop any more), on one line.
        assert list(answer) == list(with_iso_times(answer))
        assert answer == with_iso_times(answer)
        assert "\n" not in body
        assert answer["results"]["ok"]["last_scrape_at_iso"] is not None
        folder = tmp_path / "out" / "texts"
        without_dir = {k: v for k, v in answer.items() if k != "results_dir"}
        assert_indented((folder / "window.json").read_bytes(), without_dir)
        files = sorted((folder / "performances").iterdir())
        assert len(files) == 3
        by_url = {r["url"]: r for r in answer["results"].values()}
        for path in files:
            result = json.loads(path.read_text())
            assert_indented(path.read_bytes(), by_url[result["url"]])
            assert stat.S_IMODE(path.stat().st_mode) == 0o600  # as mkstemp made them
        assert not [p for p in folder.rglob("*") if p.name.endswith(".tmp")]
        # The state DB holds the same answer; a second stop and a GET answer the same body.
        assert exp.service.book.store.load("texts")["answer"] == without_dir
        again = await exp.client.post("/api/v1/windows/texts/stop")
        assert await again.text() == body
        assert again.content_type == "application/json"
        got = await exp.client.get("/api/v1/windows/texts")
        assert json.loads(await got.text()) == answer

    async def test_second_stop_without_the_text_at_hand_answers_the_same(
            self, fake_vllm, exporter, unused_tcp_port):
        exp, body = await self._stopped(fake_vllm, exporter, unused_tcp_port)
        # The stop's HTTP answer took its text: memory keeps none. A second stop encodes the
        # answer again from the store, to the same bytes.
        assert exp.service.take_answer_text("texts") is None
        again = await exp.client.post("/api/v1/windows/texts/stop")
        assert await again.text() == body

    async def test_the_text_is_taken_once_and_deleting_drops_it(
            self, fake_vllm, exporter, unused_tcp_port):
        a = await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "a", "url": a.url}]})
        await exp.start(id="w")
        window = await exp.service.stop_window("w", answer=False)
        assert window.answer is None  # the dicts were never built here: the text has it all
        text = exp.service.take_answer_text("w")
        assert json.loads(text)["id"] == "w"
        assert exp.service.take_answer_text("w") is None
        await exp.start(id="v")
        await exp.service.stop_window("v", answer=False)
        assert (await exp.client.delete("/api/v1/windows/v")).status == 200
        assert exp.service.take_answer_text("v") is None

    def test_window_json_holds_each_result_file(self):
        answer = {"id": "w", "results": {"a": {"status": "ok", "data": {"x": 1.5}},
                                         "b:1": {"status": "na", "data": None}},
                  "aggregate": {"status": "ok"}, "advice": {"results": {"a": None}}}
        texts = AnswerTexts.of(answer)
        assert_indented(texts.whole, answer)
        assert json.loads(texts.compact) == answer
        assert sorted(texts.files) == ["spec_decode_a.json", "spec_decode_b_1.json"]
        assert_indented(texts.files["spec_decode_b_1.json"], answer["results"]["b:1"])


class TestStopTexts:
    async def test_what_memory_keeps_reads_as_the_whole_answer_does(
            self, fake_vllm, exporter, unused_tcp_port):
        exp, body = await TestStopAnswerTexts()._stopped(fake_vllm, exporter, unused_tcp_port)
        answer = json.loads(body)
        kept = StopTexts.of_parts(StopTexts(b"", StopTexts.kept_of(answer)).parts()).kept
        assert StoppedWindow.of(kept) == StoppedWindow.of(answer)
        assert LastWindow.of_kept(kept) == LastWindow.of(answer)
        assert LastWindow.of_kept(kept).increases  # "ok" had traffic: its increase is kept
        assert len(pickle.dumps(kept)) < len(body) / 2

    @pytest.mark.parametrize("kept", [{}, {"id": "w", "labels": {"é": "🙂"}}])
    @pytest.mark.parametrize("text", [b"", b"{}", b'{"a":[1,2.5]}', bytes(range(256)) * 9])
    def test_of_parts_undoes_parts(self, kept, text):
        back = StopTexts.of_parts(StopTexts(text, kept).parts())
        assert back == StopTexts(text, kept)


class TestStateRow:
    @pytest.mark.parametrize("where", ["first", "middle", "last"])
    def test_the_row_is_the_document_with_that_answer(self, tmp_path, where):
        store = StateStore(tmp_path / "state.sqlite")
        answer = {"id": "w", "results": {"a": {"x": [1, 2.5, None]}}, "labels": {"é": "ü"}}
        head = {"id": "w", "name": "w", "targets": {}, "labels": {}, "started_at": 1.0,
                "stopped_at": 2.0, "accumulators": {}}
        tail = {"late_baselines": {"a": "x"}}
        stale = {"answer": {"stale": True}}
        doc = {"first": stale | head | tail, "middle": head | stale | tail,
               "last": head | tail | stale}[where]
        store.save([doc], sync=True, answers={"w": compact(answer)})
        assert store.load("w")["answer"] == answer
        store.close()
        with sqlite3.connect(tmp_path / "state.sqlite") as db:
            (row,) = db.execute("SELECT doc FROM windows WHERE id='w'").fetchone()
        assert json.loads(row) == doc | {"answer": answer}
        assert list(json.loads(row)) == list(doc)  # the answer where the document had it


class TestAtomicWrite:
    def test_creates_folders_and_leaves_no_temporary_file(self, tmp_path):
        path = tmp_path / "a" / "b" / "f.json"
        atomic_write(path, b"one")
        atomic_write(path, b"two", sync=False)
        assert path.read_bytes() == b"two"
        assert os.listdir(path.parent) == ["f.json"]

    def test_a_failed_write_leaves_the_old_file_and_no_temporary(self, tmp_path, monkeypatch):
        path = tmp_path / "f.json"
        atomic_write(path, b"old")

        def full(fd, data):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "write", full)
        with pytest.raises(OSError, match="No space"):
            atomic_write(path, b"new")
        monkeypatch.undo()
        assert path.read_bytes() == b"old"
        assert os.listdir(tmp_path) == ["f.json"]

    def test_a_file_where_the_folder_goes_is_an_error(self, tmp_path):
        (tmp_path / "a").write_text("not a folder")
        with pytest.raises(OSError):
            atomic_write(tmp_path / "a" / "f.json", b"x")


class TestWriteResults:
    ANSWER = {"id": "w", "results": {"a": {"status": "ok", "host_port": "h:1"},
                                     "b": {"status": "na", "host_port": "h:2"}},
              "aggregate": {"status": "ok"}, "advice": {}}

    def test_a_new_folder_appears_whole(self, tmp_path):
        texts = AnswerTexts.of(self.ANSWER)
        write_results(tmp_path / "w", texts)
        folder = tmp_path / "w" / "performances"
        assert sorted(os.listdir(folder)) == ["spec_decode_h_1.json", "spec_decode_h_2.json"]
        assert sorted(os.listdir(tmp_path / "w")) == ["performances", "window.json"]
        assert_indented((folder / "spec_decode_h_2.json").read_bytes(), self.ANSWER["results"]["b"])
        assert stat.S_IMODE((folder / "spec_decode_h_1.json").stat().st_mode) == 0o600

    def test_a_folder_there_already_gets_each_file_replaced(self, tmp_path):
        folder = tmp_path / "w" / "performances"
        folder.mkdir(parents=True)
        (folder / "spec_decode_h_1.json").write_text("old")
        (folder / "mine.txt").write_text("the user's")
        write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER))
        assert json.loads((folder / "spec_decode_h_1.json").read_text())["status"] == "ok"
        assert sorted(os.listdir(folder)) == [
            "mine.txt", "spec_decode_h_1.json", "spec_decode_h_2.json"]

    def test_a_failed_write_leaves_no_half_folder(self, tmp_path, monkeypatch):
        second_write_fails(monkeypatch)
        with pytest.raises(StoreError, match="No space"):
            write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER))
        monkeypatch.undo()
        assert os.listdir(tmp_path / "w") == []

    def test_no_results_no_folder(self, tmp_path):
        write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER | {"results": {}}))
        assert os.listdir(tmp_path / "w") == ["window.json"]


class TestPreparedFiles:
    """A window's result files made ahead of its stop, which only fills them."""

    ANSWER = TestWriteResults.ANSWER
    NAMES = ["spec_decode_h_1.json", "spec_decode_h_2.json"]

    def test_the_stop_fills_the_prepared_files_and_publishes_the_folder(self, tmp_path):
        prepare_results(tmp_path / "w", self.NAMES)
        prepared = tmp_path / "w" / PREPARED
        assert sorted(os.listdir(prepared)) == self.NAMES
        assert all((prepared / n).stat().st_size == 0 for n in self.NAMES)
        assert stat.S_IMODE((prepared / self.NAMES[0]).stat().st_mode) == 0o600
        inode = (prepared / self.NAMES[0]).stat().st_ino
        write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER))
        folder = tmp_path / "w" / "performances"
        assert sorted(os.listdir(tmp_path / "w")) == ["performances", "window.json"]
        assert (folder / self.NAMES[0]).stat().st_ino == inode  # filled, not made again
        assert_indented((folder / self.NAMES[1]).read_bytes(), self.ANSWER["results"]["b"])

    def test_preparing_again_keeps_what_is_there(self, tmp_path):
        prepare_results(tmp_path / "w", self.NAMES[:1])
        prepare_results(tmp_path / "w", self.NAMES)  # a restart: the window is prepared again
        assert sorted(os.listdir(tmp_path / "w" / PREPARED)) == self.NAMES

    def test_names_that_changed_are_made_or_dropped(self, tmp_path):
        prepare_results(tmp_path / "w", [self.NAMES[0], "spec_decode_gone_1.json"])
        (tmp_path / "w" / PREPARED / self.NAMES[0]).write_text("half written by a killed stop")
        write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER))
        folder = tmp_path / "w" / "performances"
        assert sorted(os.listdir(folder)) == self.NAMES
        assert json.loads((folder / self.NAMES[0]).read_text())["status"] == "ok"

    def test_a_file_holding_more_than_its_new_text_is_cut_to_it(self, tmp_path):
        # Filled without O_TRUNC (ext4 writes a truncated file out at its close): a file a
        # killed stop filled with more keeps none of it.
        prepare_results(tmp_path / "w", self.NAMES)
        longer = b"x" * 100_000
        for name in self.NAMES:
            (tmp_path / "w" / PREPARED / name).write_bytes(longer)
        texts = AnswerTexts.of(self.ANSWER)
        ahead = PreparedFiles(tmp_path / "w")
        ahead.write(self.NAMES[0], texts.files[self.NAMES[0]])
        ahead.close()
        assert (tmp_path / "w" / PREPARED / self.NAMES[0]).read_bytes() == texts.files[
            self.NAMES[0]]
        write_results(tmp_path / "w", texts, ahead=ahead.written)
        folder = tmp_path / "w" / "performances"
        assert {n: (folder / n).read_bytes() for n in self.NAMES} == texts.files

    def test_a_folder_there_already_is_written_file_by_file_and_the_prepared_one_goes(
            self, tmp_path):
        (tmp_path / "w" / "performances").mkdir(parents=True)
        (tmp_path / "w" / "performances" / "mine.txt").write_text("the user's")
        prepare_results(tmp_path / "w", self.NAMES)
        write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER))
        assert sorted(os.listdir(tmp_path / "w" / "performances")) == ["mine.txt", *self.NAMES]
        assert not (tmp_path / "w" / PREPARED).exists()

    def test_a_failed_fill_publishes_nothing_and_a_retry_publishes_all(
            self, tmp_path, monkeypatch):
        prepare_results(tmp_path / "w", self.NAMES)
        second_write_fails(monkeypatch)
        with pytest.raises(StoreError, match="No space"):
            write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER))
        monkeypatch.undo()
        assert os.listdir(tmp_path / "w") == [PREPARED]  # hidden: readers see no results
        write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER))
        folder = tmp_path / "w" / "performances"
        assert sorted(os.listdir(folder)) == self.NAMES
        assert all(json.loads((folder / n).read_text()) for n in self.NAMES)

    async def test_a_started_window_has_its_files_made_and_its_stop_fills_them(
            self, fake_vllm, exporter, tmp_path):
        a, b = await fake_vllm(k=2), await fake_vllm(k=3)
        exp = await exporter({"targets": [{"name": "a", "url": a.url},
                                          {"name": "b", "url": b.url}]})
        await exp.start(id="ahead")
        prepared = tmp_path / "out" / "ahead" / PREPARED
        for _ in range(200):  # made in a thread, after the start's answer
            if prepared.is_dir() and len(os.listdir(prepared)) == 2:
                break
            await asyncio.sleep(0.01)
        names = sorted(os.listdir(prepared))
        assert names == sorted(f"spec_decode_127.0.0.1_{t.http.port}.json" for t in (a, b))
        inodes = {n: (prepared / n).stat().st_ino for n in names}
        a.server.add(0, 4, 8, [3, 2])
        answer = await exp.stop("ahead")
        folder = tmp_path / "out" / "ahead" / "performances"
        assert {n: (folder / n).stat().st_ino for n in names} == inodes
        assert not prepared.exists()
        by_name = {json.loads((folder / n).read_text())["target"]: n for n in names}
        assert json.loads((folder / by_name["a"]).read_text()) == answer["results"]["a"]


class TestTemporaryNames:
    def test_a_temporary_name_taken_is_never_ours(self, tmp_path, monkeypatch):
        names = iter(["taken", "taken", "free"])
        monkeypatch.setattr(secrets, "token_hex", lambda _: next(names))
        (tmp_path / ".f.json.taken.tmp").write_bytes(b"another writer's")
        atomic_write(tmp_path / "f.json", b"mine")
        assert (tmp_path / "f.json").read_bytes() == b"mine"
        assert (tmp_path / ".f.json.taken.tmp").read_bytes() == b"another writer's"

    def test_no_free_name_is_an_error(self, tmp_path, monkeypatch):
        monkeypatch.setattr(secrets, "token_hex", lambda _: "taken")
        (tmp_path / ".f.json.taken.tmp").write_bytes(b"another writer's")
        with pytest.raises(FileExistsError):
            atomic_write(tmp_path / "f.json", b"mine")
        assert not (tmp_path / "f.json").exists()


def random_answer(rng: random.Random, targets: int) -> dict:
    """A stop answer's shape (results and their advice by target, in the middle) with random
    values; names made of the strings encoders get wrong first."""
    names = [f"{random_value(rng, 4) if rng.random() < 0.3 else ''}t{i}" for i in range(targets)]
    names = [n if isinstance(n, str) else f"t{i}" for i, n in enumerate(names)]
    results = {n: {"status": "ok", "host_port": f"h{i}:1", "x": random_value(rng)}
               for i, n in enumerate(names)}
    return {
        "id": "w", "labels": {"odd": rng.choice(["\x00r", "é\n", '"}']), "v": random_value(rng)},
        "results": results, "aggregate": {"v": random_value(rng)},
        "advice": {"draft_costs": [0.0, 0.5],
                   "results": {n: rng.choice([None, {"k": 3, "v": random_value(rng)}])
                               for n in names},
                   "aggregate": rng.choice([None, {"v": random_value(rng)}])},
    }


class TestTextParts:
    """Texts spliced from per-target pieces are the texts of the answer encoded whole."""

    @staticmethod
    def spliced(answer, parts=None):
        parts = parts or TextParts()
        for name, result in answer["results"].items():
            parts.target(name, result, answer["advice"]["results"][name])
        return parts.texts(answer)

    @pytest.mark.parametrize("seed", range(60))
    def test_the_same_bytes_as_encoded_whole(self, seed):
        rng = random.Random(seed)
        answer = random_answer(rng, rng.choice([0, 1, 2, 7]))
        assert self.spliced(answer) == AnswerTexts.of(answer)

    def test_a_result_replaced_after_its_piece_is_encoded_again(self):
        answer = random_answer(random.Random(1), 3)
        parts = TextParts()
        self.spliced(answer, parts)
        name = next(iter(answer["results"]))
        answer["results"][name] = answer["results"][name] | {"status": "na"}
        answer["advice"]["results"][name] = {"k": 0, "error": "no rates"}
        texts = parts.texts(answer)
        assert texts == AnswerTexts.of(answer)
        assert json.loads(texts.compact)["results"][name]["status"] == "na"

    def test_what_orjson_refuses_takes_the_stdlib_whole(self):
        answer = random_answer(random.Random(2), 2)
        name = next(iter(answer["results"]))
        answer["results"][name]["huge"] = 2**70
        texts = self.spliced(answer)
        assert texts == AnswerTexts.of(answer)
        assert json.loads(texts.compact)["results"][name]["huge"] == 2**70

    def test_file_names_given_are_used(self):
        answer = random_answer(random.Random(3), 2)
        names = {n: f"file{i}.json" for i, n in enumerate(answer["results"])}
        texts = self.spliced(answer, TextParts(names))
        assert list(texts.files) == ["file0.json", "file1.json"]
        assert texts.whole == AnswerTexts.of(answer).whole
