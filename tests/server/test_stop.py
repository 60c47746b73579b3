"""exporter/server/stop.py: the stop's one work, fed its scrapes as they come or after them."""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import stat

import pytest
from jsonlayout import assert_indented

from bench.answer import EVERY, REMOVED, open_window
from exporter.core.aisbench import result_file_names
from exporter.core.isotime import with_iso_times
from exporter.core.kept import LastWindow, StoppedWindow
from exporter.core.parse import parse_page
from exporter.core.snapshot import ScrapeResult, Snapshot
from exporter.core.window import Window
from exporter.server import isolate
from exporter.server.stop import END, FEED, FINAL, ResultCodec, read_stop, stop_work

PAGE = b"""\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m",t="ab"} 10
vllm:spec_decode_num_drafts_created{engine="0",model_name="m",t="ab"} 1700000000.5
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m",t="ab"} 30
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m",t="ab"} NaN
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0",t="ab"} 7
"""


def file_names(window: Window) -> dict[str, str]:
    return result_file_names({n: {"host_port": r.host_port} for n, r in window.targets.items()})


def files_of(directory) -> dict[str, bytes]:
    """Every file under `directory`, by its path below it."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as file:
                found[os.path.relpath(path, directory)] = file.read()
    return found


class TestResultCodec:
    def test_a_result_comes_back_equal_through_pickle(self):
        snapshot = parse_page(PAGE)
        assert any(math.isnan(v) for v in snapshot.values.values())
        assert any(key.extra for key in snapshot.values)
        results = [ScrapeResult("t1", 1.5, 0.01, snapshot, None, 4321),
                   ScrapeResult("t2", 2.5, 0.2, None, "timeout", 0),
                   ScrapeResult("t3", 3.5, 0.01, Snapshot({}, {}, {"rate": 0.5}, "sglang", 2))]
        packer, unpacker = ResultCodec(), ResultCodec()
        back = [unpacker.unpack(pickle.loads(pickle.dumps(packer.pack(r)))) for r in results]
        assert repr(back) == repr(results)  # NaN != NaN: compared as text
        assert back[1:] == results[1:]

    def test_each_shape_is_sent_once(self):
        # A page's keys in order (its shape) are sent the first time; after that, by number,
        # for that target or another with the same series, its numbers packed.
        snapshot = parse_page(PAGE)
        other = Snapshot({k: v + 1 for k, v in snapshot.values.items()}, snapshot.created)
        renamed = Snapshot(dict(list(snapshot.values.items())[1:]), {})
        packer, unpacker = ResultCodec(), ResultCodec()
        results = [ScrapeResult("t1", 1.0, 0.0, snapshot), ScrapeResult("t2", 2.0, 0.0, other),
                   ScrapeResult("t1", 3.0, 0.0, other), ScrapeResult("t1", 4.0, 0.0, renamed),
                   ScrapeResult("t2", 5.0, 0.0, snapshot)]
        sent = [pickle.dumps(packer.pack(r)) for r in results]
        assert all(len(later) < len(sent[0]) / 2 for later in sent[1:3] + sent[4:])
        assert len(sent[3]) > len(sent[0]) / 2  # a new shape: its keys go again
        back = [unpacker.unpack(pickle.loads(s)) for s in sent]
        assert repr(back) == repr(results)  # NaN != NaN: compared as text
        assert [list(b.snapshot.values) for b in back] == [list(r.snapshot.values)
                                                           for r in results]


def worked(tmp_path, name: str, window: Window, inbox) -> tuple:
    """`stop_work` writing to `tmp_path/w` (the answer's `results_dir`), then its folder moved
    to `tmp_path/name`: two ways of one stop name the same folder."""
    data = stop_work(window, tmp_path / "w")(inbox)
    os.rename(tmp_path / "w", tmp_path / name)
    return read_stop(data)


def stopped_both_ways(tmp_path, n: int, change=None, before=None):
    """The same open window (`before` done to it) stopped twice by the one work: after its
    window took the stop's scrapes (a late fork, or a thread), and forked early, fed every
    message while the parent's window is `change`d meanwhile; the bytes of each."""
    window, finals, last_scrape = open_window(n)
    stop = last_scrape + 0.5  # the stop's end, after its last scrape came in
    if before:
        before(window)
    late, early = copy.deepcopy(window), copy.deepcopy(window)

    for result in finals:
        late.take_stop_scrape(result)
    late.stopped_at = stop
    if change:
        change(late)
    late_stopped = worked(tmp_path, "late", late, iter([(END, stop, late.removed)]))

    codec = ResultCodec()
    messages = [(FINAL, codec.pack(r)) for r in finals]
    messages.append((END, stop, late.removed))
    return late_stopped, worked(tmp_path, "early", early,
                                iter(pickle.loads(pickle.dumps(m)) for m in messages))


def answer_of(stopped) -> dict:
    return json.loads(stopped[2])


class TestStopWork:
    @pytest.mark.parametrize("n", [1, 5, 240])
    def test_fed_as_the_scrapes_come_or_after_them_the_same_answer_and_files(self, tmp_path, n):
        late, early = stopped_both_ways(tmp_path, n)
        assert early[1:] == late[1:]
        assert early[0] == late[0]
        assert files_of(tmp_path / "early") == files_of(tmp_path / "late")
        assert sorted(os.listdir(tmp_path / "early")) == ["performances", "window.json"]
        answer = answer_of(early)
        assert len(answer["results"]) == n
        # The row is the window's document with that answer; the files hold its RESULTs.
        assert json.loads(early[1])["answer"] == answer
        assert json.loads((tmp_path / "early" / "window.json").read_bytes()) == answer

    def test_a_target_removed_after_its_stop_scrape_is_made_again(self, tmp_path):
        def remove_t0(window):
            window.removed["t0"] = "target removed from the config at the stop"

        late, early = stopped_both_ways(tmp_path, 3, remove_t0)
        assert early[1:] == late[1:]
        result = answer_of(early)["results"]["t0"]
        assert result["status"] == "na" and "at the stop" in result["error"]
        assert files_of(tmp_path / "early") == files_of(tmp_path / "late")

    def test_partial_results_name_the_stop_time_known_only_at_the_end(self, tmp_path):
        # A late baseline makes t1 partial, and its coverage note ends at the stop time, which
        # only the END message brings; target REMOVED left before the stop.
        def late_baseline(window):
            window.late_baselines["t1"] = "no baseline was saved"

        late, early = stopped_both_ways(tmp_path, EVERY, before=late_baseline)
        assert early[1:] == late[1:]
        results = answer_of(early)["results"]
        assert results[f"t{REMOVED}"]["status"] == "na"
        assert results["t1"]["coverage"] == "partial"
        assert ("of the window 2026-12-02T18:00:00.000Z to 2026-12-02T18:00:20.500Z; "
                in results["t1"]["coverage_note"]), results["t1"]["coverage_note"]

    def test_a_scrape_fed_during_the_stop_counts_as_in_the_parent(self, tmp_path):
        window, finals, stop = open_window(2)
        parent, child_copy = copy.deepcopy(window), copy.deepcopy(window)
        # A periodic scrape of t0 between the fork and its stop scrape: the parent feeds it,
        # the child gets it as FEED, in the same order.
        between = ScrapeResult("t0", stop - 1, 0.01, finals[0].snapshot)
        parent.feed(between)
        for result in finals:
            parent.take_stop_scrape(result)
        late = worked(tmp_path, "late", parent, iter([(END, stop, {})]))
        codec = ResultCodec()
        messages = [(FEED, codec.pack(between))] + [(FINAL, codec.pack(r)) for r in finals]
        messages.append((END, stop, parent.removed))
        early = worked(tmp_path, "early", child_copy, iter(messages))
        assert early[1:] == late[1:]
        assert answer_of(early)["results"]["t0"]["scrapes"] == 6

    def test_files_are_written_while_the_scrapes_come_in_hidden_until_the_end(self, tmp_path):
        window, finals, stop = open_window(3)
        names = file_names(window)
        codec = ResultCodec()
        seen = []

        def inbox():
            for result in finals:
                yield FINAL, codec.pack(result)
                seen.append(sorted(n for _, _, files in os.walk(tmp_path / "w") for n in files))
            yield END, stop, {}

        read_stop(stop_work(window, tmp_path / "w")(inbox()))
        # One more file after each stop scrape, in a hidden folder (no `performances` yet).
        assert [len(s) for s in seen] == [1, 2, 3]
        assert sorted(os.listdir(tmp_path / "w" / "performances")) == sorted(names.values())

    def test_an_inbox_cut_short_writes_nothing(self, tmp_path):
        # The server killed mid-stop: the child's inbox ends without END.
        window, finals, _ = open_window(3)
        codec = ResultCodec()
        with pytest.raises(RuntimeError, match="cut short"):
            stop_work(window, tmp_path / "w")(iter([(FINAL, codec.pack(finals[0]))]))
        assert os.listdir(tmp_path / "w") == []

    def test_what_memory_keeps_reads_as_the_whole_answer_does(self, tmp_path):
        late, _ = stopped_both_ways(tmp_path, 5)
        kept, answer = late[0], answer_of(late)
        assert StoppedWindow.of(kept) == StoppedWindow.of(answer)
        assert LastWindow.of_kept(kept) == LastWindow.of(answer)
        assert LastWindow.of_kept(kept).increases
        assert len(pickle.dumps(kept)) < len(late[2]) / 2


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
        assert_indented((folder / "window.json").read_bytes(), answer)
        files = sorted((folder / "performances").iterdir())
        assert len(files) == 3
        by_url = {r["url"]: r for r in answer["results"].values()}
        for path in files:
            result = json.loads(path.read_text())
            assert_indented(path.read_bytes(), by_url[result["url"]])
            assert stat.S_IMODE(path.stat().st_mode) == 0o600  # as mkstemp made them
        assert not [p for p in folder.rglob("*") if p.name.endswith(".tmp")]
        # The state DB holds the same answer; a second stop and a GET answer the same body.
        assert exp.service.book.store.load("texts")["answer"] == answer
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
        assert exp.service.book.take_answer_text("texts") is None
        again = await exp.client.post("/api/v1/windows/texts/stop")
        assert await again.text() == body

    async def test_the_text_is_taken_once_and_deleting_drops_it(
            self, fake_vllm, exporter, unused_tcp_port):
        a = await fake_vllm(k=2)
        exp = await exporter({"targets": [{"name": "a", "url": a.url}]})
        await exp.start(id="w")
        window = await exp.service.stop_window("w", answer=False)
        assert window.answer is None  # the dicts were never built here: the text has it all
        text = exp.service.book.take_answer_text("w")
        assert json.loads(text)["id"] == "w"
        assert exp.service.book.take_answer_text("w") is None
        await exp.start(id="v")
        await exp.service.stop_window("v", answer=False)
        assert (await exp.client.delete("/api/v1/windows/v")).status == 200
        assert exp.service.book.take_answer_text("v") is None
