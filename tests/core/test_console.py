"""The console block, byte for byte as AISBench's reporter prints it.

`aisbench_block` below restates the shape of AISBench's code (`spec_decode/reporter.py`:
`format_spec_decode_console` / `format_spec_decode_na`, printed by its logger, which ends the
line): every block starts with an empty line, each rule is `len(title) - 2` `=`, labels take 45
columns and one space.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.core.aisbench import unobserved_span, unobserved_text
from exporter.core.console import format_block, format_caveats, format_window
from exporter.core.derive import result_data
from exporter.core.snapshot import Counts

CONSOLE = Path(__file__).resolve().parents[1] / "testdata" / "console"
SEED = Counts(163, 815, 809, {0: 162, 1: 162, 2: 162, 3: 162, 4: 161})
NO_ACTIVITY = "No spec decode activity detected during benchmark window"
T0 = 1796234400.0  # 2026-12-02T18:00:00Z


def ok(counts: Counts, **extra) -> dict:
    result = {"status": "ok", "url": "http://x/metrics", "error": None}
    return result | {"data": result_data(counts)} | extra


def na(error: str | None) -> dict:
    return {"status": "na", "url": "http://x/metrics", "error": error, "data": None}


def title_of(label: str) -> str:
    return f"========== Speculative Decoding Metrics  [{label}] =========="


def aisbench_block(label: str, rows: list[tuple[str, str]]) -> str:
    title = title_of(label)
    sep = "=" * (len(title) - 2)
    lines = ["", sep, title, sep] + [f"{name:<45} {value}" for name, value in rows]
    return "\n".join(lines) + "\n"  # the logger's newline


class TestFormatBlock:
    def test_seed_golden(self):
        want = (CONSOLE / "seed_block.txt").read_bytes()
        got = format_block("10.0.0.1:8080", ok(SEED)).encode()
        assert got == want

    def test_seed_is_aisbench_shape(self):
        assert format_block("10.0.0.1:8080", ok(SEED)) == aisbench_block("10.0.0.1:8080", [
            ("Acceptance rate (%)", "99.26"), ("Acceptance length", "5.96"), ("Drafts", "163"),
            ("Draft tokens", "815"), ("Accepted tokens", "809"),
            ("Per-position acceptance rates",
             "{0: 0.9939, 1: 0.9939, 2: 0.9939, 3: 0.9939, 4: 0.9877}"),
        ])

    @pytest.mark.parametrize(
        "error,reason",
        [
            ("No spec decode metrics found on server", "No spec decode metrics found on server"),
            (
                "Failed to fetch metrics from http://10.0.0.1:8080/metrics: timeout after 3s",
                "Failed to fetch metrics from http://10.0.0.1:8080/metrics: timeout after 3s",
            ),
            (NO_ACTIVITY, NO_ACTIVITY),
            (None, NO_ACTIVITY),
        ],
    )
    def test_na_layout(self, error, reason):
        want = aisbench_block("10.0.0.1:8080", [("Status", "N/A"), ("Reason", reason)])
        assert format_block("10.0.0.1:8080", na(error)) == want

    def test_ok_without_drafts_is_na(self):
        text = format_block("h:1", ok(Counts()))
        assert text.splitlines()[4:] == [f"{'Status':<46}N/A", f"{'Reason':<46}{NO_ACTIVITY}"]

    def test_na_exact_text(self):
        assert format_block("h:1", na("No spec decode metrics found on server")) == (
            "\n"
            "=======================================================\n"
            "========== Speculative Decoding Metrics  [h:1] ==========\n"
            "=======================================================\n"
            "Status                                        N/A\n"
            "Reason                                        No spec decode metrics found on server\n"
        )

    @pytest.mark.parametrize(
        "label", ["all", "h:1", "10.0.0.1:8080", "[::1]:9400", "llama-eagle", "x" * 60, ""]
    )
    def test_empty_line_then_rules_two_shorter_than_title(self, label):
        for result in (ok(SEED), na("why")):
            lines = format_block(label, result).split("\n")
            assert lines[0] == ""
            assert lines[2] == title_of(label)
            assert lines[1] == lines[3] == "=" * (len(lines[2]) - 2)
            assert lines[-1] == ""  # ends with exactly one newline
            for line in lines[4:-1]:
                assert line[:46].rstrip() and line[46] != " "
                assert len(line[:46]) == 46

    def test_twelve_positions_in_numeric_order(self):
        counts = Counts(100, 1200, 660, {pos: 100 - 5 * pos for pos in reversed(range(12))})
        line = format_block("h:1", ok(counts)).splitlines()[-1]
        rates = ", ".join(f"{p}: {(100 - 5 * p) / 100:.4f}" for p in range(12))
        assert line == f"{'Per-position acceptance rates':<46}{{{rates}}}"

    def test_positions_given_as_text_sorted_by_number(self):
        data = result_data(SEED)
        data["per_position_acceptance_rates"] = {"10": 0.1, "2": 0.5, "1": 0.75, "0": 1}
        line = format_block("h:1", {"status": "ok", "data": data}).splitlines()[-1]
        assert line.endswith("{0: 1.0000, 1: 0.7500, 2: 0.5000, 10: 0.1000}")

    @pytest.mark.parametrize(
        "counts,rate,length",
        [
            (SEED, "99.26", "5.96"),
            (Counts(3, 9, 2, {0: 1, 1: 1}), "22.22", "1.67"),
            # 1 + 1/200 = 1.005: from the counts, not from the 3-decimal 1.005 (which is 1.00)
            (Counts(200, 600, 1, {0: 1}), "0.17", "1.00"),
            (Counts(8, 8, 8, {0: 8}), "100.00", "2.00"),
            (Counts(2.5, 7.5, 3.75, {0: 2.5}), "50.00", "2.50"),
        ],
    )
    def test_rate_and_length_two_decimals(self, counts, rate, length):
        lines = format_block("h:1", ok(counts)).splitlines()
        assert lines[4] == f"{'Acceptance rate (%)':<46}{rate}"
        assert lines[5] == f"{'Acceptance length':<46}{length}"

    def test_v0_without_drafts_shows_rate_and_na_length(self):
        lines = format_block("h:1", ok(Counts(0, 8, 4))).splitlines()
        assert lines[4] == f"{'Acceptance rate (%)':<46}50.00"
        assert lines[5] == f"{'Acceptance length':<46}N/A"
        assert lines[9] == f"{'Per-position acceptance rates':<46}{{}}"


class TestFormatWindow:
    def answer(self, results: dict, aggregate: dict | None) -> dict:
        return {"id": "w1", "name": "n", "results": results, "aggregate": aggregate}

    def test_one_target_no_all_block(self):
        # A target named by its host:port (the default name) gets no name line.
        results = {"10.0.0.1:8080": ok(SEED, host_port="10.0.0.1:8080")}
        text = format_window(self.answer(results, ok(SEED)))
        assert text == (CONSOLE / "seed_block.txt").read_text()
        assert "[all]" not in text

    def test_two_targets_then_all(self):
        b = Counts(10, 30, 20, {0: 8, 1: 7, 2: 5})
        results = {"a": ok(SEED, host_port="10.0.0.1:8080"), "b": ok(b, host_port="h:2")}
        text = format_window(self.answer(results, ok(SEED + b)))
        assert text == (
            format_block("10.0.0.1:8080", results["a"]) + "Target: a\n"
            + format_block("h:2", results["b"]) + "Target: b\n"
            + format_block("all", ok(SEED + b))
        )
        assert [line for line in text.splitlines() if "Speculative" in line] == [
            title_of("10.0.0.1:8080"), title_of("h:2"), title_of("all")
        ]

    def test_three_targets_with_one_na(self):
        results = {"a": ok(SEED), "b": na("Failed to fetch metrics from u: refused"), "c": ok(SEED)}
        text = format_window(self.answer(results, ok(SEED + SEED)))
        titles = [line for line in text.splitlines() if "Speculative" in line]
        assert titles == [title_of("a"), title_of("b"), title_of("c"), title_of("all")]
        assert f"{'Reason':<46}Failed to fetch metrics from u: refused\n" in text

    def test_no_aggregate_no_all_block(self):
        results = {"a": ok(SEED, host_port="x:1"), "b": ok(SEED)}
        text = format_window(self.answer(results, None))
        titles = [line for line in text.splitlines() if "Speculative" in line]
        assert titles == [title_of("x:1"), title_of("b")]

    def test_config_name_follows_the_block_only_where_it_differs(self):
        results = {"llama-eagle": ok(SEED, host_port="10.0.0.1:8080"),
                   "h:2": ok(SEED, host_port="h:2")}
        text = format_window(self.answer(results, ok(SEED + SEED)))
        first = format_block("10.0.0.1:8080", results["llama-eagle"])
        second = format_block("h:2", results["h:2"])
        assert text.startswith(first + "Target: llama-eagle\n" + second)
        assert text.count("Target: ") == 1

    def test_empty_window(self):
        assert format_window(self.answer({}, None)) == ""


class TestRestartLine:
    """A restart's unobserved span: one `Note:` line after AISBench's block, left as it is."""

    def restarted(self) -> tuple[dict, dict]:
        span = unobserved_span(T0 + 10, T0 + 15, T0 + 12.5)
        coverage_note = "partial: " + unobserved_text([span])
        result = ok(SEED, host_port="10.0.0.1:8080", resets=1, coverage="partial",
                    coverage_note=coverage_note, unobserved=[span],
                    reset_note="server restart seen 1 time(s) inside the window; missing: ...")
        return result, span

    def test_one_line_naming_the_span(self):
        result, span = self.restarted()
        text = format_window({"results": {"10.0.0.1:8080": result}, "aggregate": None})
        block = format_block("10.0.0.1:8080", result)
        assert block == format_block("10.0.0.1:8080", ok(SEED))  # the block is AISBench's
        assert text.startswith(block)
        (line,) = text[len(block):].splitlines()
        assert line == (
            "Note: partial coverage: not counted: what the server counted from our last scrape "
            "before each restart to the restart: 2026-12-02T18:00:10.000Z to "
            "2026-12-02T18:00:12.500Z (2.500 s; restart at 2026-12-02T18:00:12.500Z (its "
            "counters' _created))")

    def test_aggregate_one_line_with_the_targets_spans(self):
        result, span = self.restarted()
        agg_note = ("partial: includes targets whose numbers cover part of the window: a; "
                    + unobserved_text([span | {"target": "a"}]))
        agg = ok(SEED, resets=1, coverage="partial", coverage_note=agg_note,
                 unobserved=[span | {"target": "a"}])
        lines = format_caveats(agg).splitlines()
        assert len(lines) == 1 and "a: 2026-12-02T18:00:10.000Z to" in lines[0]

    def test_restarts_without_spans_say_what_is_missing(self):
        # An aggregate from before spans were kept: the count, and that it is not all counted.
        lines = format_caveats(ok(SEED, resets=2)).splitlines()
        assert lines == ["Note: server restarts: 2; what the server counted from our last "
                         "scrape before each restart to the restart is not counted"]
