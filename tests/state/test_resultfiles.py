"""exporter/state/resultfiles.py: result files written atomically, a stop's folder whole."""

from __future__ import annotations

import json
import os
import stat

import pytest
from jsonlayout import assert_indented

from exporter.core.errors import StoreError
from exporter.state.answertext import AnswerTexts
from exporter.state.resultfiles import ResultFolder, atomic_write, write_results


def second_write_fails(monkeypatch) -> None:
    """The disk fills up at the second `os.write` (`monkeypatch.undo()` ends it)."""
    real, calls = os.write, []

    def second_fails(fd, data):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", second_fails)


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


class TestResultFolder:
    """A stop's files written as its targets come in, then put in place together."""

    ANSWER = TestWriteResults.ANSWER
    NAMES = ["spec_decode_h_1.json", "spec_decode_h_2.json"]

    def test_files_written_early_are_hidden_until_the_finish(self, tmp_path):
        texts = AnswerTexts.of(self.ANSWER)
        folder = ResultFolder(tmp_path / "w")
        folder.write(self.NAMES[0], texts.files[self.NAMES[0]])
        (hidden,) = os.listdir(tmp_path / "w")
        assert hidden.startswith(".") and os.listdir(tmp_path / "w" / hidden) == [self.NAMES[0]]
        folder.finish(texts)
        assert sorted(os.listdir(tmp_path / "w")) == ["performances", "window.json"]
        assert sorted(os.listdir(tmp_path / "w" / "performances")) == self.NAMES
        for name in self.NAMES:
            assert (tmp_path / "w" / "performances" / name).read_bytes() == texts.files[name]

    def test_a_file_written_again_holds_its_last_text_and_a_dropped_name_goes(self, tmp_path):
        texts = AnswerTexts.of(self.ANSWER)
        folder = ResultFolder(tmp_path / "w")
        folder.write(self.NAMES[0], b"a much longer text than the file will hold at the end" * 9)
        folder.write("spec_decode_gone_1.json", b"{}\n")
        folder.finish(texts)
        assert sorted(os.listdir(tmp_path / "w" / "performances")) == self.NAMES
        assert (tmp_path / "w" / "performances" / self.NAMES[0]).read_bytes() == texts.files[
            self.NAMES[0]]

    def test_a_folder_there_already_takes_each_file_and_no_hidden_one_stays(self, tmp_path):
        write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER | {"id": "first"}))
        (tmp_path / "w" / "performances" / "mine.txt").write_text("the user's")
        # A stop killed mid-way left its hidden folder behind.
        (tmp_path / "w" / ".performances.dead.tmp").mkdir()
        write_results(tmp_path / "w", AnswerTexts.of(self.ANSWER))
        assert sorted(os.listdir(tmp_path / "w")) == ["performances", "window.json"]
        assert sorted(os.listdir(tmp_path / "w" / "performances")) == ["mine.txt", *self.NAMES]
        assert json.loads((tmp_path / "w" / "window.json").read_text())["id"] == "w"

    def test_a_failed_finish_puts_nothing_in_place_and_a_retry_puts_all(
            self, tmp_path, monkeypatch):
        texts = AnswerTexts.of(self.ANSWER)
        folder = ResultFolder(tmp_path / "w")
        second_write_fails(monkeypatch)  # the second file, written at the finish
        folder.write(self.NAMES[0], texts.files[self.NAMES[0]])
        with pytest.raises(StoreError, match="No space"):
            folder.finish(texts)
        monkeypatch.undo()
        assert os.listdir(tmp_path / "w") == []
        write_results(tmp_path / "w", texts)
        assert sorted(os.listdir(tmp_path / "w" / "performances")) == self.NAMES

    def test_discard_leaves_nothing(self, tmp_path):
        folder = ResultFolder(tmp_path / "w")
        folder.write(self.NAMES[0], b"{}\n")
        folder.discard()
        assert os.listdir(tmp_path / "w") == []

