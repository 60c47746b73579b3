"""Pages that cost more than a real server's are refused by per-target limits."""

from __future__ import annotations

import pytest

from exporter.core.parse import PageLimitError, PageLimits, parse_page
from faults.checks import still_serving, target_view, value
from faults.servers import Counters, RawTarget

NAMES = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
         "vllm:spec_decode_num_accepted_tokens")


def page(models: list[str], positions: int = 2, value_of: int = 1) -> bytes:
    """A vLLM page with one engine per model name and `positions` per-position series."""
    lines = []
    for name in NAMES:
        lines.append(f"# TYPE {name} counter")
        lines += [f'{name}_total{{model_name="{m}"}} {value_of}.0' for m in models]
    per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines.append(f"# TYPE {per_pos} counter")
    for m in models:
        lines += [f'{per_pos}_total{{model_name="{m}",position="{p}"}} {value_of}.0'
                  for p in range(positions)]
    return ("\n".join(lines) + "\n").encode()


class TestPageLimits:
    LIMITS = PageLimits(series=100, label_value_length=50, positions=8)

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            (page([f"m{i}" for i in range(21)]), "more than 100 spec-decode series"),
            (page(["m" * 51]), "a label value of 51 characters is over label_value_length_limit"),
            (page(["m"], positions=9), "position 8 is over position_limit (8)"),
        ],
        ids=["series", "label", "position"],
    )
    def test_over_a_limit_is_an_error(self, text, message):
        assert parse_page(text, "auto").values  # fine without limits
        with pytest.raises(PageLimitError) as caught:
            parse_page(text, "auto", self.LIMITS)
        assert message in str(caught.value)

    @pytest.mark.parametrize(
        "text",
        [page([f"m{i}" for i in range(16)]), page(["m" * 50]), page(["m"], positions=8)],
        ids=["series", "label", "position"],
    )
    def test_at_a_limit_is_fine(self, text):
        assert parse_page(text, "auto", self.LIMITS).values == parse_page(text, "auto").values

    def test_created_series_do_not_count(self):
        text = page([f"m{i}" for i in range(20)]).replace(
            b"_total{", b"_created{").replace(b"} 1.0", b"} 5.0") + page(
                [f"m{i}" for i in range(20)])
        snapshot = parse_page(text, "auto", PageLimits(100, 50, 8))
        assert len(snapshot.values) == 100

    def test_181000_position_series_stop_at_the_limit(self):
        # 181,000 per-position series (~10 MiB, under the 16 MiB cap): the parse stops at the
        # first series past the default limit, so its cost is bounded by the limit.
        text = page(["m"], positions=181_000)
        limits = PageLimits(20_000, 1024, 200_000)
        with pytest.raises(PageLimitError, match="more than 20000 spec-decode series"):
            parse_page(text, "auto", limits)


@pytest.fixture
async def pair(exporter):
    good = await RawTarget(Counters(k=2)).start()
    bad = await RawTarget(Counters(k=2)).start()
    exp = await exporter({"targets": [
        {"name": "good", "url": good.url},
        {"name": "bad", "url": bad.url, "series_limit": 200},
    ]})
    await exp.round()
    yield good, bad, exp
    await good.stop()
    await bad.stop()


class TestTargetOverALimit:
    @pytest.mark.parametrize(
        ("make", "reason"),
        [
            (lambda n: page([f"renamed-{n}-{i}" for i in range(60)]), "series_limit"),
            (lambda n: page(["m" * 2000]), "label_value_length_limit (1024)"),
            (lambda n: page(["m"], positions=70), "position 64 is over position_limit (64)"),
            # 15,000 series of fresh 900-character names each scrape (~14 MB, under the cap).
            (lambda n: page([f"{n}-{i}-" + "x" * 900 for i in range(3_000)]), "series_limit"),
        ],
        ids=["series", "label", "position", "fresh-900-char-names"],
    )
    async def test_up0_with_the_reason_and_the_window_says_why(self, pair, make, reason):
        good, bad, exp = pair
        await exp.start(id="w1")
        good.counters.add(10, 20, [8, 5])
        rounds = iter(range(100))
        bad.page = lambda: make(next(rounds))
        await exp.round()
        found = await still_serving(exp.client)
        assert value(found, "specdec_target_up", target="bad") == 0
        assert value(found, "specdec_target_up", target="good") == 1
        view = await target_view(exp.client, "bad")
        assert reason in view["last_error"]
        answer = await exp.stop("w1")
        assert answer["results"]["good"]["status"] == "ok"
        assert answer["results"]["good"]["data"]["num_drafts"] == 10
        bad_result = answer["results"]["bad"]
        said = " ".join(str(bad_result.get(k)) for k in ("error", "coverage_note"))
        assert reason in said, bad_result
        assert bad_result["status"] == "na" or bad_result.get("coverage") == "partial"
