"""Targets that misbehave. The exporter keeps serving; good numbers stay exact."""

from __future__ import annotations

import asyncio
import math

import pytest

from faults.checks import assert_increase, increase, still_serving, target_view, value
from faults.servers import Counters, RawTarget

TIMEOUT = 0.5
CAP = 4 * 1024 * 1024


@pytest.fixture
async def fleet(exporter):
    """A healthy raw target `good`, a target `bad` to break, and the exporter over both."""
    targets = []

    async def make(bad_options=None, bad_config=None, **bad_counters):
        good = await RawTarget(Counters(k=3)).start()
        bad = await RawTarget(Counters(**({"k": 3} | bad_counters))).start()
        bad.page_options = dict(bad_options or {})
        targets.extend([good, bad])
        good.counters.add(100, 300, [90, 80, 70])  # before any window: never counted
        bad.counters.add(50, 150, [40, 30, 20])
        exp = await exporter({
            "scrape_interval": "1s", "scrape_timeout": f"{TIMEOUT}s",
            "max_response_bytes": CAP,
            "targets": [{"name": "good", "url": good.url},
                        {"name": "bad", "url": bad.url} | (bad_config or {})],
        })
        await exp.round()
        return good, bad, exp

    yield make
    for target in targets:
        await target.stop()


async def _post(exp, path, **body):
    response = await exp.client.post(path, json=body)
    assert response.status in (200, 201), await response.text()
    return await response.json()


async def _round_while_serving(exp):
    """A scrape round in flight (possibly hanging) must not stall /metrics or the API."""
    task = asyncio.create_task(exp.round())
    await asyncio.sleep(0.05)
    found = await still_serving(exp.client)
    await task
    return found


# (mode, what the reason says); every one is an `up=0` fault.
FAILURES = [
    ("refused", "connection failed: Connection refused"),
    ("reset", "Server disconnected"),
    ("hang", f"timeout after {TIMEOUT:g}s"),
    ("slowloris", f"timeout after {TIMEOUT:g}s"),
    ("http500", "HTTP 500 Internal Server Error"),
    ("http404", "HTTP 404 Not Found"),
    ("redirect_loop", "too many redirects"),
    ("html", "response is not Prometheus text format"),
    ("binary", "response is not Prometheus text format"),
    ("endless", f"response is over the {CAP} byte cap"),
    ("oversize_declared", f"response of {10**10} bytes is over the {CAP}"),
    ("cut_off", "body cut off or corrupt"),
    ("gzip_corrupt", "body cut off or corrupt"),
]


class TestFailingTarget:
    @pytest.mark.parametrize(("mode", "reason"), FAILURES, ids=[m for m, _ in FAILURES])
    async def test_fault_is_up0_with_reason_and_no_window_is_hurt(self, fleet, mode, reason):
        good, bad, exp = await fleet()
        good_0, bad_0 = good.counters.totals(), bad.counters.totals()
        await _post(exp, "/api/v1/windows", id="through")  # bad healthy at start and stop

        good.counters.add(10, 30, [9, 8, 7])
        bad.counters.add(5, 15, [5, 4, 3])
        if mode == "refused":
            await bad.stop()
        else:
            bad.mode = mode
        found = await _round_while_serving(exp)  # returns: the fault is bounded
        found = await still_serving(exp.client)
        assert value(found, "specdec_target_up", target="bad") == 0
        assert value(found, "specdec_target_up", target="good") == 1
        assert value(found, "specdec_scrape_errors_total", target="bad") >= 1
        assert value(found, "specdec_scrape_errors_total", target="good") == 0
        assert value(found, "specdec_drafts_total", target="good") == 110
        view = await target_view(exp.client, "bad")
        assert view["up"] is False and reason in view["last_error"], view["last_error"]

        good_1 = good.counters.totals()
        await _post(exp, "/api/v1/windows", id="during")  # bad broken at start and stop
        good.counters.add(20, 60, [19, 18, 17])
        bad.counters.add(7, 21, [7, 6, 5])
        await _round_while_serving(exp)
        answer = await _post(exp, "/api/v1/windows/during/stop")
        assert_increase(answer["results"]["good"], increase(good_1, good.counters.totals()))
        result = answer["results"]["bad"]
        assert result["status"] == "na"
        assert f"Failed to fetch metrics from {bad.url} at window start: {reason}" in (
            result["error"])
        assert "at window stop" in result["error"]
        assert answer["aggregate"]["targets"] == ["good"]

        if mode == "refused":
            await bad.start()
        else:
            bad.mode = "ok"
        good.counters.add(1, 3, [1, 1, 1])
        bad.counters.add(2, 6, [2, 2, 1])
        answer = await _post(exp, "/api/v1/windows/through/stop")
        assert_increase(answer["results"]["good"], increase(good_0, good.counters.totals()))
        assert_increase(answer["results"]["bad"], increase(bad_0, bad.counters.totals()))
        assert answer["results"]["bad"]["coverage"] == "full"
        assert answer["aggregate"]["increase"]["num_drafts"] == 31 + 14
        found = await still_serving(exp.client)
        assert value(found, "specdec_target_up", target="bad") == 1


class TestOddPages:
    """Pages that parse: the target stays up, and the window's numbers stay exact."""

    async def _window_through(self, fleet, break_page, mend_page=None, bad_options=None):
        good, bad, exp = await fleet(bad_options)
        good_0, bad_0 = good.counters.totals(), bad.counters.totals()
        await _post(exp, "/api/v1/windows", id="w")
        good.counters.add(10, 30, [9, 8, 7])
        bad.counters.add(5, 15, [5, 4, 3])
        await exp.round()
        break_page(bad)
        bad.counters.add(6, 18, [6, 5, 4])
        found = await _round_while_serving(exp)
        assert value(found, "specdec_target_up", target="good") == 1
        assert value(found, "specdec_drafts_total", target="good") == 110
        (mend_page or (lambda t: setattr(t, "page_options", {})))(bad)
        bad.counters.add(7, 21, [7, 6, 5])
        good.counters.add(1, 3, [1, 1, 1])
        await exp.round()
        answer = await _post(exp, "/api/v1/windows/w/stop")
        assert_increase(answer["results"]["good"], increase(good_0, good.counters.totals()))
        assert_increase(answer["results"]["bad"], increase(bad_0, bad.counters.totals()))
        return answer, exp, found

    async def test_nan_inf_negative_values_are_skipped(self, fleet):
        override = {"vllm:spec_decode_num_drafts": "NaN",
                    "vllm:spec_decode_num_draft_tokens": "+Inf",
                    "vllm:spec_decode_num_accepted_tokens": "-5.0"}
        answer, exp, found = await self._window_through(
            fleet, lambda t: setattr(t, "page_options", {"override": override}))
        drafts = value(found, "specdec_drafts_total", target="bad")
        assert drafts is None or (math.isfinite(drafts) and drafts >= 0)
        tokens = value(found, "specdec_draft_tokens_total", target="bad")
        assert tokens is None or (math.isfinite(tokens) and tokens >= 0)

    async def test_duplicate_series_keep_the_first(self, fleet):
        answer, exp, found = await self._window_through(
            fleet, lambda t: setattr(t, "page_options", {"duplicate": True}))
        assert value(found, "specdec_target_up", target="bad") == 1
        assert value(found, "specdec_drafts_total", target="bad") == 61

    async def test_counters_vanish_and_reappear(self, fleet):
        def vanish(target):
            target.mode = "vanish"

        def mend(target):
            target.mode = "ok"

        answer, exp, found = await self._window_through(fleet, vanish, mend)
        assert value(found, "specdec_target_up", target="bad") == 1
        assert value(found, "specdec_target_spec_decode_present", target="bad") == 0

    async def test_counters_vanish_at_stop_say_so(self, fleet):
        good, bad, exp = await fleet()
        bad_0 = bad.counters.totals()
        await _post(exp, "/api/v1/windows", id="v")
        bad.counters.add(5, 15, [5, 4, 3])
        await exp.round()
        seen = bad.counters.totals()
        bad.mode = "vanish"
        bad.counters.add(9, 27, [9, 9, 9])  # never seen by us
        answer = await _post(exp, "/api/v1/windows/v/stop")
        result = answer["results"]["bad"]
        assert_increase(result, increase(bad_0, seen))
        assert result["coverage"] == "partial"
        assert "no spec decode series" in result["coverage_note"]

    async def test_body_cut_mid_line_drops_the_cut_line(self, fleet):
        answer, exp, found = await self._window_through(
            fleet, lambda t: setattr(t, "mode", "cut_line"), lambda t: setattr(t, "mode", "ok"))
        # The drafts line lost its last two digits: it must not be read as a smaller value.
        assert answer["results"]["bad"]["resets"] == 0

    async def test_counter_going_down_and_created_changing(self, fleet):
        good, bad, exp = await fleet()
        await _post(exp, "/api/v1/windows", id="r")
        bad.counters.add(5, 15, [5, 4, 3])
        await exp.round()
        before_restart = increase(Counters(k=3).totals(), bad.counters.totals())
        bad.counters.restart()
        bad.counters.add(80, 240, [80, 70, 60])  # higher than before: only _created tells
        await exp.round()
        bad.counters.restart()
        bad.counters.add(1, 3, [1, 1, 0])  # lower than before
        answer = await _post(exp, "/api/v1/windows/r/stop")
        result = answer["results"]["bad"]
        assert result["resets"] == 2
        assert result["increase"]["num_drafts"] == 5 + 80 + 1
        assert result["increase"]["num_accepted_tokens"] == 12 + 210 + 2
        assert before_restart["num_drafts"] == 55

    async def test_engine_appears_mid_window(self, fleet):
        def grow(target):
            target.counters.add_engine()
            target.counters.add(4, 12, [4, 4, 4], engine=1)

        answer, exp, found = await self._window_through(fleet, grow, lambda t: None)
        assert answer["results"]["bad"]["engines"] == 2

    async def test_engine_label_appears_mid_window(self, fleet):
        # The same server, now labelling its series with engine="0": not 100 new drafts.
        answer, exp, found = await self._window_through(
            fleet, lambda t: setattr(t, "page_options", {"engine_label": True}),
            lambda t: None, bad_options={"engine_label": False})

    async def test_100k_character_label_values(self, fleet):
        huge = "m" * 100_000
        # Over the default label_value_length_limit (tests/faults/test_limits.py): raised here
        # to show the parser itself copes.
        good, bad, exp = await fleet(model=huge, bad_config={"label_value_length_limit": 10**6})
        bad_0 = bad.counters.totals()
        await _post(exp, "/api/v1/windows", id="huge")
        bad.counters.add(5, 15, [5, 4, 3])
        found = await _round_while_serving(exp)
        assert value(found, "specdec_target_up", target="bad") == 1
        assert value(found, "specdec_drafts_total", target="good") == 100
        answer = await _post(exp, "/api/v1/windows/huge/stop")
        assert_increase(answer["results"]["bad"], increase(bad_0, bad.counters.totals()))
        assert answer["results"]["bad"]["model_names"] == [huge]



class TestRestartWhileASeriesIsSkipped:
    async def test_no_double_count(self, fleet):
        good, bad, exp = await fleet()
        await _post(exp, "/api/v1/windows", id="late")
        bad.counters.add(10, 30, [5, 4, 3])
        await exp.round()
        bad.counters.restart()
        bad.page_options = {"override": {"vllm:spec_decode_num_accepted_tokens": "-1.0"}}
        await exp.round()
        bad.counters.add(19, 57, [10, 5, 3])
        await exp.round()
        bad.page_options = {}
        bad.counters.add(10, 30, [5, 4, 3])
        answer = await _post(exp, "/api/v1/windows/late/stop")
        assert answer["results"]["bad"]["increase"]["num_drafts"] == 10 + 19 + 10
