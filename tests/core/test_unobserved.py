"""A restart between two scrapes: never full; the span no scrape saw, per restart.

What a server counted between our last scrape and its restart died with the old process, so a
window with a restart inside is `partial`, and its RESULT names each unobserved span: from that
last scrape to the restart as its counters' `_created` dates it, else between the two scrapes.
"""

from __future__ import annotations

import json

import pytest

from exporter.core.aisbench import (
    Coverage,
    Result,
    Status,
    aggregate,
    unobserved_span,
    unobserved_spans,
)
from exporter.core.console import format_caveats
from exporter.core.counting import Accumulator
from exporter.core.isotime import iso_utc
from exporter.core.snapshot import Field, SeriesKey, Snapshot
from exporter.core.stopanswer import AnswerParts, target_result
from exporter.core.window import TargetRef, Window
from exporter.server.stop import ADVICE

T0 = 1796234400.0  # 2026-12-02T18:00:00Z
D, T, A, P = Field.DRAFTS, Field.DRAFT_TOKENS, Field.ACCEPTED, Field.PER_POS


def page(drafts: int, created: float | None = None, engine: str = "0") -> Snapshot:
    """One engine's counters (k=2, every position accepted), with a `_created` if given."""
    values = {SeriesKey(D, "m", engine, -1): float(drafts),
              SeriesKey(T, "m", engine, -1): 2.0 * drafts,
              SeriesKey(A, "m", engine, -1): 2.0 * drafts,
              SeriesKey(P, "m", engine, 0): float(drafts),
              SeriesKey(P, "m", engine, 1): float(drafts)}
    made = {} if created is None else dict.fromkeys(values, created)
    return Snapshot(values=values, created=made)


def restarted(created_after: float | None, *, old_created: float | None = None) -> Accumulator:
    """Scrapes at T0, +5 and +10 (40 then 60 drafts), a restart, the next scrape at +15 with
    10 drafts: the new process's counters created at `created_after` (or without `_created`)."""
    acc = Accumulator()
    acc.feed(page(40, old_created), T0)
    acc.feed(page(50, old_created), T0 + 5)
    acc.feed(page(60, old_created), T0 + 10)
    acc.feed(page(10, created_after), T0 + 15)
    return acc


def spans_of(acc: Accumulator) -> list[dict]:
    return unobserved_spans(acc.reset_spans, acc.restart_times)


def window_of(acc: Accumulator, downtimes: list[tuple[float, float]] | None = None) -> Window:
    ref = TargetRef("a", "http://10.0.0.1:8080/metrics", "10.0.0.1:8080")
    return Window(id="w", name="w", targets={"a": ref}, labels={}, started_at=T0,
                  stopped_at=T0 + 15, accumulators={"a": acc}, downtimes=downtimes or [])


class TestAccumulatorSpans:
    def test_restart_dated_by_created(self):
        acc = restarted(T0 + 12.5, old_created=T0 - 100)
        assert acc.resets == 1 and acc.restart_times == [T0 + 12.5]
        (span,) = spans_of(acc)
        assert span["from"] == T0 + 10 and span["to"] == T0 + 12.5
        assert span["seconds"] == 2.5 and span["restart_at"] == T0 + 12.5
        assert span["next_scrape_at"] == T0 + 15
        assert span["from_iso"] == "2026-12-02T18:00:10.000Z"
        assert span["to_iso"] == span["restart_at_iso"] == "2026-12-02T18:00:12.500Z"
        assert span["restart"] == "at 2026-12-02T18:00:12.500Z (its counters' _created)"

    def test_no_created_between_the_scrapes(self):
        acc = restarted(None)  # told by the counters going down alone
        assert acc.restart_times == [None]
        (span,) = spans_of(acc)
        assert span["to"] == T0 + 15 and span["seconds"] == 5.0 and span["restart_at"] is None
        assert span["restart"] == (
            "between the scrapes at 2026-12-02T18:00:10.000Z and 2026-12-02T18:00:15.000Z")

    @pytest.mark.parametrize("created", [T0 - 50, T0 + 9.0, T0 + 30])
    def test_created_outside_the_span_is_not_a_restart_time(self, created):
        # A `_created` before our last scrape of the old process or after the scrape that
        # showed the new one is a skewed clock: it dates nothing.
        acc = restarted(created, old_created=T0 - 100)
        assert acc.resets == 1 and spans_of(acc)[0]["restart_at"] is None

    def test_two_restarts_each_their_span(self):
        acc = restarted(T0 + 11, old_created=T0 - 100)
        acc.feed(page(20, T0 + 11), T0 + 20)
        acc.feed(page(3, T0 + 24), T0 + 25)
        spans = spans_of(acc)
        assert [(s["from"], s["to"]) for s in spans] == [(T0 + 10, T0 + 11), (T0 + 20, T0 + 24)]
        assert acc.totals().drafts == 20 + 10 + 10 + 3  # what was seen still counts, exactly

    def test_saved_and_loaded_keeps_the_restart_times(self):
        acc = restarted(T0 + 12.5, old_created=T0 - 100)
        back = Accumulator.from_dict(json.loads(acc.to_json()))
        assert back == acc and spans_of(back) == spans_of(acc)


class TestResult:
    def test_a_restart_between_scrapes_is_partial_with_its_span(self):
        acc = restarted(T0 + 12.5, old_created=T0 - 100)
        result = target_result(window_of(acc), "a")
        assert result.status is Status.OK and result.coverage is Coverage.PARTIAL
        body = result.to_json()
        assert body["coverage"] == "partial"
        assert body["unobserved"] == spans_of(acc)
        assert body["coverage_note"] == (
            "partial: not counted: what the server counted from our last scrape before each "
            "restart to the restart: 2026-12-02T18:00:10.000Z to 2026-12-02T18:00:12.500Z "
            "(2.500 s; restart at 2026-12-02T18:00:12.500Z (its counters' _created))")
        # The note says what is missing, never that the restart's increase was all counted.
        assert body["reset_note"] == (
            "server restart seen 1 time(s) inside the window; missing: what the server "
            "counted from our last scrape before each restart to the restart (2.500 s in all: "
            "`unobserved`)")
        assert "is counted" not in body["reset_note"]

    def test_without_restart_full_and_no_span(self):
        acc = Accumulator()
        acc.feed(page(40), T0)
        acc.feed(page(60), T0 + 15)
        body = target_result(window_of(acc), "a").to_json()
        assert body["coverage"] == "full" and "unobserved" not in body

    def test_restart_while_the_exporter_was_down_is_named_in_the_span(self):
        acc = restarted(None)
        body = target_result(window_of(acc, [(T0 + 11, T0 + 14)]), "a").to_json()
        (span,) = body["unobserved"]
        assert span["exporter_down"] == [T0 + 11, T0 + 14]
        assert span["restart"].endswith(
            "while the exporter was down (2026-12-02T18:00:11.000Z to 2026-12-02T18:00:14.000Z)")
        assert "while the exporter was down" in body["reset_note"]

    def test_read_back_and_aggregated(self):
        acc = restarted(T0 + 12.5, old_created=T0 - 100)
        answer = AnswerParts(window_of(acc), ADVICE).answer()
        body = answer["results"]["a"]
        back = Result.from_json(body)
        assert back.coverage is Coverage.PARTIAL
        assert back.to_json(iso_times=True) == body
        agg = aggregate([("a", back), ("b", Result.from_json(body))]).to_json()
        assert agg["coverage"] == "partial"
        assert [s["target"] for s in agg["unobserved"]] == ["a", "b"]
        assert "a: 2026-12-02T18:00:10.000Z to" in agg["coverage_note"]
        assert answer["aggregate"]["unobserved"] == [body["unobserved"][0] | {"target": "a"}]

    def test_a_peers_span_is_made_again_from_its_times(self):
        span = unobserved_span(T0 + 10, T0 + 15, T0 + 12)
        forged = span | {"restart": "<script>", "seconds": -1}
        back = Result.from_json({"status": "ok", "unobserved": [forged, "x", {"from": "y"}]})
        assert back.unobserved == (span,)

    def test_console_one_line(self):
        acc = restarted(T0 + 12.5, old_created=T0 - 100)
        body = target_result(window_of(acc), "a").to_json()
        lines = format_caveats(body).splitlines()
        assert lines == ["Note: partial coverage: " + body["coverage_note"].removeprefix(
            "partial: ")]
        assert iso_utc(T0 + 10) in lines[0] and "2.500 s" in lines[0]


class TestThroughTheExporter:
    """A real fake-vLLM server restarted under the exporter, scraped on loopback."""

    async def test_restart_under_a_running_exporter(self, exporter, fake_vllm):
        fake, other = await fake_vllm(k=3, seed=1), await fake_vllm(k=3, seed=2)
        exp = await exporter({"targets": [{"name": "a", "url": fake.url},
                                          {"name": "b", "url": other.url}]})
        await exp.start(id="r")
        fake.server.simulate(20)
        other.server.simulate(20)
        await exp.round()
        fake.server.simulate(20)  # counted by the server, never scraped: lost at its restart
        fake.server.restart()
        fake.server.simulate(10)
        await exp.round()
        answer = await exp.stop("r")
        result = answer["results"]["a"]
        assert result["status"] == "ok" and result["resets"] == 1
        assert result["coverage"] == "partial"
        (span,) = result["unobserved"]
        # Dated by the restarted counters' `_created` (the fake's clock is ours).
        assert span["restart_at"] == fake.server.created
        assert span["from"] < span["restart_at"] <= span["next_scrape_at"]
        assert span["seconds"] == pytest.approx(span["restart_at"] - span["from"])
        assert answer["results"]["b"]["coverage"] == "full"
        assert "unobserved" not in answer["results"]["b"]
        agg = answer["aggregate"]
        assert agg["coverage"] == "partial" and agg["unobserved"] == [span | {"target": "a"}]
        caveats = format_caveats(result)
        assert caveats.count("\n") == 1 and span["from_iso"] in caveats
