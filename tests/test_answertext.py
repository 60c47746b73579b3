"""A stop answer encoded once: the files, window.json, the state DB row and the HTTP answer."""

from __future__ import annotations

import json
import os
import random
import secrets
import sqlite3
import stat

import pytest
from randomjson import random_value

from exporter.answertext import AnswerTexts, compact_of, with_key
from exporter.errors import StoreError
from exporter.isotime import with_iso_times
from exporter.jsontext import pretty
from exporter.store import StateStore, atomic_write, write_results


def indented(value) -> str:
    """AISBench's json.dump layout, as the files have always been written."""
    return json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)


class TestCompactOf:
    @pytest.mark.parametrize("seed", range(300))
    def test_is_json_dumps(self, seed):
        value = random_value(random.Random(seed), key_marks=("", ",", " "))
        assert compact_of(pretty(value), value) == json.dumps(value)

    def test_non_ascii_is_escaped_as_json_dumps_does(self):
        value = {"labels": {"équipe": "ü 🙂"}, "n": [1, 2]}
        assert compact_of(pretty(value), value) == json.dumps(value)

    def test_with_key_is_json_dumps_of_the_dict_with_it(self):
        for value in ({}, {"a": [1, {"b": None}]}, {"x": "é"}):
            text = with_key(json.dumps(value), "results_dir", "/out/w ü")
            assert text == json.dumps(value | {"results_dir": "/out/w ü"})

    def test_with_key_refuses_what_is_no_object(self):
        with pytest.raises(ValueError, match="JSON object"):
            with_key("[1, 2]", "k", 1)


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

    async def test_every_text_is_the_stdlib_encoding_of_the_answer(
            self, fake_vllm, exporter, unused_tcp_port, tmp_path):
        exp, body = await self._stopped(fake_vllm, exporter, unused_tcp_port)
        answer = json.loads(body)
        assert {r["status"] for r in answer["results"].values()} == {"ok", "na"}
        assert answer["results"]["partial"]["coverage"] == "partial"
        # The HTTP answer: json.dumps of the answer, every ISO time already beside its time
        # (key order included: nothing walks the answer after the stop any more).
        assert body == json.dumps(with_iso_times(answer))
        assert answer["results"]["ok"]["last_scrape_at_iso"] is not None
        folder = tmp_path / "out" / "texts"
        without_dir = {k: v for k, v in answer.items() if k != "results_dir"}
        assert (folder / "window.json").read_text() == indented(without_dir) + "\n"
        files = sorted((folder / "performances").iterdir())
        assert len(files) == 3
        by_url = {r["url"]: r for r in answer["results"].values()}
        for path in files:
            result = json.loads(path.read_text())
            assert path.read_text() == indented(by_url[result["url"]]) + "\n"
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
        # Only the last stop's text is kept: once another window stopped, this one's answer
        # is encoded again from the window, to the same bytes.
        await exp.start(id="other")
        await exp.stop("other")
        assert exp.service.answer_text("texts") is None
        again = await exp.client.post("/api/v1/windows/texts/stop")
        assert await again.text() == body

    async def test_deleting_the_window_drops_its_text(
            self, fake_vllm, exporter, unused_tcp_port):
        exp, _ = await self._stopped(fake_vllm, exporter, unused_tcp_port)
        assert exp.service.answer_text("texts") is not None
        assert (await exp.client.delete("/api/v1/windows/texts")).status == 200
        assert exp.service.answer_text("texts") is None

    def test_window_json_splices_each_result_file(self):
        answer = {"id": "w", "results": {"a": {"status": "ok", "data": {"x": 1.5}},
                                         "b:1": {"status": "na", "data": None}},
                  "aggregate": {"status": "ok"}, "advice": {"results": {"a": None}}}
        texts = AnswerTexts.of(answer)
        assert texts.whole == indented(answer) + "\n"
        assert texts.compact == json.dumps(answer)
        assert sorted(texts.files) == ["spec_decode_a.json", "spec_decode_b_1.json"]
        assert texts.files["spec_decode_b_1.json"] == indented(answer["results"]["b:1"]) + "\n"


class TestStateRow:
    @pytest.mark.parametrize("where", ["first", "middle", "last"])
    def test_the_row_is_json_dumps_of_the_document_with_that_answer(self, tmp_path, where):
        store = StateStore(tmp_path / "state.sqlite")
        answer = {"id": "w", "results": {"a": {"x": [1, 2.5, None]}}, "labels": {"é": "ü"}}
        head = {"id": "w", "name": "w", "targets": {}, "labels": {}, "started_at": 1.0,
                "stopped_at": 2.0, "accumulators": {}}
        tail = {"late_baselines": {"a": "x"}}
        stale = {"answer": {"stale": True}}
        doc = {"first": stale | head | tail, "middle": head | stale | tail,
               "last": head | tail | stale}[where]
        store.save([doc], sync=True, answers={"w": json.dumps(answer)})
        assert store.load("w")["answer"] == answer
        store.close()
        with sqlite3.connect(tmp_path / "state.sqlite") as db:
            (row,) = db.execute("SELECT doc FROM windows WHERE id='w'").fetchone()
        assert row == json.dumps(doc | {"answer": answer})


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
        assert (folder / "spec_decode_h_2.json").read_text() == indented(
            self.ANSWER["results"]["b"]) + "\n"
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
        real = os.write
        calls = []

        def second_fails(fd, data):
            calls.append(fd)
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(os, "write", second_fails)
        with pytest.raises(StoreError, match="No space"):
            write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER))
        monkeypatch.undo()
        assert os.listdir(tmp_path / "w") == []

    def test_no_results_no_folder(self, tmp_path):
        write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER | {"results": {}}))
        assert os.listdir(tmp_path / "w") == ["window.json"]


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
