"""stopchild: a stop's answer made target by target in a child is the answer made in one go."""

from __future__ import annotations

import copy
import json
import math
import os
import pickle

import pytest

from bench.answer import EVERY, REMOVED, open_window
from exporter.state.answertext import StopTexts
from exporter.server.isolate import Staged
from exporter.core.parse import parse_page
from exporter.core.results import result_file_names
from exporter.core.snapshot import ScrapeResult, Snapshot
from exporter.server.stop import END, FEED, FINAL, ResultCodec, streamed_answer, whole_answer
from exporter.state.store import PREPARED, prepare_results
from exporter.core.window import Window

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


def stopped_both_ways(tmp_path, n: int, change=None, before=None):
    """The same open window (`before` done to it) stopped twice: in one go (the parent's way
    where there is no child), and streamed as the child gets it, the parent's window
    `change`d while the stop's scrapes came in; their `StopTexts`."""
    window, finals, last_scrape = open_window(n)
    stop = last_scrape + 0.5  # the stop's end, after its last scrape came in
    if before:
        before(window)
    names = file_names(window)
    whole_window, streamed_window = copy.deepcopy(window), copy.deepcopy(window)

    whole_window.take_final(finals, stop)
    if change:
        change(whole_window)
    whole = done(whole_answer(whole_window, tmp_path / "whole"))

    prepare_results(tmp_path / "streamed", names.values())
    work = streamed_answer(streamed_window, tmp_path / "streamed", names)
    codec = ResultCodec()
    end_window = copy.deepcopy(window)  # what the parent holds at the end
    end_window.take_final(finals, stop)
    if change:
        change(end_window)
    messages = [(FINAL, codec.pack(r)) for r in finals]
    messages.append((END, stop, end_window.removed))
    streamed = done(work(iter(pickle.loads(pickle.dumps(m)) for m in messages)))
    return whole, streamed


def done(staged: Staged) -> list[bytes]:
    """A work's answer parts, its work after them done (the result files written)."""
    if staged.then is not None:
        staged.then()
    return list(staged.parts)


class TestStreamedAnswer:
    @pytest.mark.parametrize("n", [1, 5, 240])
    def test_the_same_texts_and_files_as_made_in_one_go(self, tmp_path, n):
        whole, streamed = stopped_both_ways(tmp_path, n)
        assert streamed == whole
        assert files_of(tmp_path / "streamed") == files_of(tmp_path / "whole")
        assert not (tmp_path / "streamed" / PREPARED).exists()
        answer = json.loads(StopTexts.of_parts(streamed).compact)
        assert len(answer["results"]) == n

    def test_a_target_removed_after_its_stop_scrape_is_made_again(self, tmp_path):
        def remove_t0(window):
            window.removed["t0"] = "target removed from the config at the stop"

        whole, streamed = stopped_both_ways(tmp_path, 3, remove_t0)
        assert streamed == whole
        result = json.loads(StopTexts.of_parts(streamed).compact)["results"]["t0"]
        assert result["status"] == "na" and "at the stop" in result["error"]
        assert files_of(tmp_path / "streamed") == files_of(tmp_path / "whole")

    def test_partial_results_name_the_stop_time_known_only_at_the_end(self, tmp_path):
        # A late baseline makes t1 partial, and its coverage note ends at the stop time, which
        # only the END message brings; target REMOVED left before the stop.
        def late(window):
            window.late_baselines["t1"] = "no baseline was saved"

        whole, streamed = stopped_both_ways(tmp_path, EVERY, before=late)
        assert streamed == whole
        results = json.loads(StopTexts.of_parts(streamed).compact)["results"]
        assert results[f"t{REMOVED}"]["status"] == "na"
        assert results["t1"]["coverage"] == "partial"
        assert ("of the window 2026-12-02T18:00:00.000Z to 2026-12-02T18:00:20.500Z; "
                in results["t1"]["coverage_note"]), results["t1"]["coverage_note"]

    def test_a_scrape_fed_during_the_stop_counts_as_in_the_parent(self, tmp_path):
        window, finals, stop = open_window(2)
        names = file_names(window)
        parent, child_copy = copy.deepcopy(window), copy.deepcopy(window)
        # A periodic scrape of t0 between the fork and its stop scrape: the parent feeds it,
        # the child gets it as FEED, in the same order.
        between = ScrapeResult("t0", stop - 1, 0.01, finals[0].snapshot)
        parent.feed(between)
        parent.take_final(finals, stop)
        whole = done(whole_answer(parent, tmp_path / "whole"))
        codec = ResultCodec()
        messages = [(FEED, codec.pack(between))] + [(FINAL, codec.pack(r)) for r in finals]
        messages.append((END, stop, parent.removed))
        streamed = done(streamed_answer(child_copy, tmp_path / "streamed", names)(iter(messages)))
        assert streamed == whole
        assert json.loads(StopTexts.of_parts(streamed).compact)["results"]["t0"]["scrapes"] == 6

    def test_the_answer_comes_before_the_files_are_written(self, tmp_path):
        # The parent saves the answer while the child writes the files (`Staged.then`).
        window, finals, stop = open_window(3)
        names = file_names(window)
        prepare_results(tmp_path / "w", names.values())
        codec = ResultCodec()
        messages = [(FINAL, codec.pack(r)) for r in finals] + [(END, stop, {})]
        staged = streamed_answer(window, tmp_path / "w", names)(iter(messages))
        assert len(json.loads(StopTexts.of_parts(list(staged.parts)).compact)["results"]) == 3
        assert not (tmp_path / "w" / "window.json").exists()
        assert not (tmp_path / "w" / "performances").exists()
        assert staged.then is not None
        staged.then()
        assert json.loads((tmp_path / "w" / "window.json").read_bytes())["results"].keys() == {
            "t0", "t1", "t2"}
        assert sorted(os.listdir(tmp_path / "w" / "performances")) == sorted(names.values())

    def test_an_inbox_cut_short_writes_nothing(self, tmp_path):
        # The server killed mid-stop: the child's inbox ends without END.
        window, finals, _ = open_window(3)
        names = file_names(window)
        prepare_results(tmp_path / "w", names.values())
        work = streamed_answer(window, tmp_path / "w", names)
        codec = ResultCodec()
        with pytest.raises(RuntimeError, match="cut short"):
            work(iter([(FINAL, codec.pack(finals[0]))]))
        assert not (tmp_path / "w" / "window.json").exists()
        assert not (tmp_path / "w" / "performances").exists()
