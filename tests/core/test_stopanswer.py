"""A stopped window's RESULTs end to end: a loopback page server, the exporter, exact answers."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from conftest import Clock

from exporter.client import merge_answers
from exporter.core.aisbench import Result, Status, result_file_name, result_file_names
from exporter.core.console import format_window
from exporter.core.derive import result_data
from exporter.core.snapshot import Counts

T0 = 1796234400.0  # 2026-12-02T18:00:00Z
SERIES_LABELS = 'engine="0",model_name="m"'
NAMES = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}


@dataclass
class Page:
    """The counters a loopback server shows, and values to show as written instead of them."""

    drafts: int = 0
    draft_tokens: int = 0
    per_position: list[int] = field(default_factory=list)
    text: dict[str, str] = field(default_factory=dict)  # counter -> value text (NaN, +Inf)

    def set(self, counts: tuple[int, int, list[int]], text: dict[str, str]) -> None:
        self.drafts, self.draft_tokens, self.per_position = counts
        self.text = text

    def render(self) -> str:
        values = {"drafts": self.drafts, "draft_tokens": self.draft_tokens,
                  "accepted": sum(self.per_position)}
        lines = []
        for counter, name in NAMES.items():
            lines.append(f"# TYPE {name[:-6]} counter")
            lines.append(f"{name}{{{SERIES_LABELS}}} {self.text.get(counter, values[counter])}")
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
        for pos, value in enumerate(self.per_position):
            lines.append(f"vllm:spec_decode_num_accepted_tokens_per_pos_total"
                         f'{{{SERIES_LABELS},position="{pos}"}} {value}')
        return "\n".join(lines) + "\n"


@pytest.fixture
def page_server(aiohttp_server):
    """Factory: `await page_server()` -> (Page, its /metrics URL) on a loopback port."""

    async def make() -> tuple[Page, str]:
        page = Page()

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text=page.render(), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        server = await aiohttp_server(app)
        return page, str(server.make_url("/metrics"))

    return make


# Three states of the server's counters, 10 s apart. From the first to the second: 20 drafts,
# 60 draft tokens, 30 accepted (10 per position); from the second to the third: 40 drafts,
# 120 draft tokens, 30 accepted (20, 10, 0).
STATES = [(100, 300, [70, 50, 30]), (120, 360, [80, 60, 40]), (160, 480, [100, 70, 40])]
RAW = [
    {"num_drafts": d, "num_draft_tokens": t, "num_accepted_tokens": sum(p),
     "accepted_per_pos": {str(i): v for i, v in enumerate(p)}}
    for d, t, p in STATES
]
FIRST_SPAN = {"num_drafts": 20, "draft_tokens": 60, "accepted_tokens": 30,
              "acceptance_rate": 50.0, "acceptance_length": 2.5,
              "per_position_acceptance_rates": {"0": 0.5, "1": 0.5, "2": 0.5}}
SECOND_SPAN = {"num_drafts": 40, "draft_tokens": 120, "accepted_tokens": 30,
               "acceptance_rate": 25.0, "acceptance_length": 1.75,
               "per_position_acceptance_rates": {"0": 0.5, "1": 0.25, "2": 0.0}}


async def _window(page_server, exporter, bad: dict[int, dict[str, str]], states=(0, 1, 2),
                  name: str | None = "a"):
    """Start at T0, one scrape round at T0+10 (unless left out), stop at T0+20.

    `bad` maps a state's index to counters shown with an unusable value in that scrape.
    Without a `name`, the target is named by its host:port (the console's label).
    """
    page, url = await page_server()
    clock = Clock(T0)
    target = {"url": url} | ({"name": name} if name else {})
    exp = await exporter({"targets": [target]}, clock=clock)
    for step, state in enumerate(states):
        page.set(STATES[state], bad.get(state, {}))
        clock.now = T0 + 10 * state
        if step == 0:
            await exp.start(id="w")
        elif step < len(states) - 1:
            await exp.round()
    answer = await exp.stop("w")
    (result,) = answer["results"].values()
    return answer, result


class TestUnusableCounterValues:
    """A NaN, infinite or negative counter value is an anomaly of its scrape, never a number."""

    @pytest.mark.parametrize("counter,text,series", [
        ("accepted", "NaN", 'num_accepted_tokens{engine="0",model_name="m"}'),
        ("draft_tokens", "+Inf", 'num_draft_tokens{engine="0",model_name="m"}'),
    ])
    async def test_at_stop_the_numbers_end_at_the_last_usable_scrape(
        self, page_server, exporter, counter, text, series
    ):
        answer, result = await _window(page_server, exporter, {2: {counter: text}})
        assert result["status"] == "ok" and result["error"] is None
        assert result["data"] == FIRST_SPAN
        assert result["raw"] == {"before": RAW[0], "after": RAW[1]}
        assert result["coverage"] == "partial"
        assert result["coverage_note"] == (
            "partial: the numbers cover 2026-12-02T18:00:00.000Z to 2026-12-02T18:00:10.000Z"
            " of the window 2026-12-02T18:00:00.000Z to 2026-12-02T18:00:20.000Z; "
            f"{series} was {text} at 2026-12-02T18:00:20.000Z (scrape not used)"
        )
        assert (result["first_scrape_at"], result["last_scrape_at"]) == (T0, T0 + 10)

    @pytest.mark.parametrize("counter,text,series", [
        ("accepted", "NaN", 'num_accepted_tokens{engine="0",model_name="m"}'),
        ("draft_tokens", "+Inf", 'num_draft_tokens{engine="0",model_name="m"}'),
    ])
    async def test_at_start_the_numbers_begin_at_the_first_usable_scrape(
        self, page_server, exporter, counter, text, series
    ):
        answer, result = await _window(page_server, exporter, {0: {counter: text}})
        assert result["status"] == "ok" and result["error"] is None
        assert result["data"] == SECOND_SPAN
        assert result["raw"] == {"before": RAW[1], "after": RAW[2]}
        assert result["coverage"] == "partial"
        assert result["coverage_note"] == (
            "partial: the numbers cover 2026-12-02T18:00:10.000Z to 2026-12-02T18:00:20.000Z"
            " of the window 2026-12-02T18:00:00.000Z to 2026-12-02T18:00:20.000Z; "
            f"{series} was {text} at 2026-12-02T18:00:00.000Z (scrape not used)"
        )
        assert (result["first_scrape_at"], result["last_scrape_at"]) == (T0 + 10, T0 + 20)

    @pytest.mark.parametrize("bad_state,counter,text,series,raw", [
        (2, "accepted", "NaN", 'num_accepted_tokens{engine="0",model_name="m"}',
         {"before": RAW[0], "after": None}),
        (0, "accepted", "NaN", 'num_accepted_tokens{engine="0",model_name="m"}',
         {"before": None, "after": RAW[2]}),
        (2, "draft_tokens", "+Inf", 'num_draft_tokens{engine="0",model_name="m"}',
         {"before": RAW[0], "after": None}),
        (0, "draft_tokens", "+Inf", 'num_draft_tokens{engine="0",model_name="m"}',
         {"before": None, "after": RAW[2]}),
    ])
    async def test_no_usable_span_left_is_na(
        self, page_server, exporter, bad_state, counter, text, series, raw
    ):
        answer, result = await _window(
            page_server, exporter, {bad_state: {counter: text}}, states=(0, 2)
        )
        at = "2026-12-02T18:00:20.000Z" if bad_state else "2026-12-02T18:00:00.000Z"
        assert result["status"] == "na"
        assert result["error"] == (
            "No span of the window with every spec decode counter usable: "
            f"{series} was {text} at {at} (scrape not used)"
        )
        assert result["data"] is None
        assert result["raw"] == raw
        assert answer["aggregate"]["status"] == "na"

    async def test_negative_value_inside_the_window_is_bridged_and_said(
        self, page_server, exporter
    ):
        answer, result = await _window(page_server, exporter, {1: {"drafts": "-5"}})
        assert result["status"] == "ok"
        assert result["data"] == {
            "num_drafts": 60, "draft_tokens": 180, "accepted_tokens": 60,
            # AISBench's expression, to the last bit: (accepted / draft tokens) * 100
            "acceptance_rate": 60 / 180 * 100, "acceptance_length": 2.0,
            "per_position_acceptance_rates": {"0": 0.5, "1": 20 / 60, "2": 10 / 60},
        }
        assert result["coverage"] == "full" and result["coverage_note"] is None
        assert result["anomaly_note"] == (
            '1 scrape inside the span not used: num_drafts{engine="0",model_name="m"} was -5 '
            "at 2026-12-02T18:00:10.000Z; the next usable values bridge it exactly"
        )
        assert result["raw"] == {"before": RAW[0], "after": RAW[2]}


class TestResultFiles:
    """`performances/spec_decode_<label>.json` as AISBench names it, and no overwrite."""

    @pytest.mark.parametrize("label,name", [
        ("10.0.0.1:8080", "spec_decode_10.0.0.1_8080.json"),
        ("[::1]:8080", "spec_decode____1__8080.json"),
        ("[fe80::1%eth0]:9000", "spec_decode__fe80__1_eth0__9000.json"),
        ("my-host.example:443", "spec_decode_my-host.example_443.json"),
    ])
    def test_aisbench_names(self, label, name):
        assert result_file_name(label) == name

    def test_names_unique_stay_aisbench_ones(self):
        results = {"a": {"host_port": "h:1"}, "b": {"host_port": "h:2"}}
        assert result_file_names(results) == {
            "a": "spec_decode_h_1.json", "b": "spec_decode_h_2.json"}

    def test_colliding_names_get_the_target_name(self):
        results = {"eagle/k3": {"host_port": "h:1"}, "eagle k5": {"host_port": "h:1"},
                   "c": {"host_port": "h:2"}}
        assert result_file_names(results) == {
            "eagle/k3": "spec_decode_h_1__eagle_k3.json",
            "eagle k5": "spec_decode_h_1__eagle_k5.json",
            "c": "spec_decode_h_2.json",
        }

    def test_long_target_names_are_cut_with_a_hash(self):
        name = "n" * 300
        results = {name: {"host_port": "h:1"}, "b": {"host_port": "h:1"}}
        names = result_file_names(results)
        assert names[name] == f"spec_decode_h_1__{'n' * 55}-{zlib.crc32(name.encode()):08x}.json"
        assert names["b"] == "spec_decode_h_1__b.json"

    def test_names_that_collide_once_made_safe_get_a_hash(self):
        results = {"a/b": {"host_port": "h:1"}, "a_b": {"host_port": "h:1"}}
        names = result_file_names(results)
        assert names["a/b"] == f"spec_decode_h_1__a_b-{zlib.crc32(b'a/b'):08x}.json"
        assert names["a_b"] == f"spec_decode_h_1__a_b-{zlib.crc32(b'a_b'):08x}.json"

    async def test_ipv6_target_end_to_end(self, aiohttp_server, exporter, tmp_path):
        page = Page()
        page.set(STATES[0], {})

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text=page.render(), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        try:
            server = await aiohttp_server(app, host="::1")
        except OSError as exc:  # a machine without IPv6 loopback
            pytest.skip(f"no IPv6 loopback: {exc}")
        exp = await exporter({"targets": [{"host": "::1", "port": server.port}]})
        label = f"[::1]:{server.port}"
        await exp.start(id="v6")
        page.set(STATES[1], {})
        answer = await exp.stop("v6")
        result = answer["results"][label]
        assert result["host_port"] == label and result["data"] == FIRST_SPAN
        written = tmp_path / "out" / "v6" / "performances" / f"spec_decode____1__{server.port}.json"
        assert json.loads(written.read_text()) == result
        title = next(line for line in format_window(answer).splitlines()
                     if line.strip() and set(line.strip()) != {"="})
        assert f"[{label}]" in title

    async def test_two_paths_on_one_host_port_keep_both_files(
        self, aiohttp_server, exporter, tmp_path
    ):
        pages = {"/a/metrics": Page(), "/b/metrics": Page()}
        for page, state in zip(pages.values(), STATES, strict=False):
            page.set(state, {})

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text=pages[request.path].render(), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/a/metrics", metrics)
        app.router.add_get("/b/metrics", metrics)
        server = await aiohttp_server(app)
        base = f"http://127.0.0.1:{server.port}"
        exp = await exporter({"targets": [{"name": "pa", "url": base + "/a/metrics"},
                                          {"name": "pb", "url": base + "/b/metrics"}]})
        await exp.start(id="two")
        pages["/a/metrics"].set(STATES[1], {})
        pages["/b/metrics"].set(STATES[2], {})
        answer = await exp.stop("two")
        folder = tmp_path / "out" / "two" / "performances"
        assert sorted(p.name for p in folder.iterdir()) == [
            f"spec_decode_127.0.0.1_{server.port}__pa.json",
            f"spec_decode_127.0.0.1_{server.port}__pb.json",
        ]
        a = json.loads((folder / f"spec_decode_127.0.0.1_{server.port}__pa.json").read_text())
        b = json.loads((folder / f"spec_decode_127.0.0.1_{server.port}__pb.json").read_text())
        assert a["data"] == FIRST_SPAN and b["data"] == SECOND_SPAN
        assert (a, b) == (answer["results"]["pa"], answer["results"]["pb"])


class TestRawCounters:
    async def test_integral_counters_are_integers_in_the_file(
        self, page_server, exporter, tmp_path
    ):
        answer, result = await _window(page_server, exporter, {})
        text = next((tmp_path / "out" / "w" / "performances").iterdir()).read_text()
        assert '"num_drafts": 100,' in text and '"num_drafts": 160,' in text
        assert ".0," not in text.split('"raw"')[1].split('"increase"')[0]
        assert result["raw"] == {"before": RAW[0], "after": RAW[2]}

    async def test_no_activity_still_has_both_snapshots(self, page_server, exporter):
        page, url = await page_server()
        page.set(STATES[0], {})
        exp = await exporter({"targets": [{"name": "a", "url": url}]})
        await exp.start(id="idle")
        answer = await exp.stop("idle")
        result = answer["results"]["a"]
        assert result["status"] == "na"
        assert result["error"] == "No spec decode activity detected during benchmark window"
        assert result["raw"] == {"before": RAW[0], "after": RAW[0]}
        assert answer["aggregate"]["raw"] == {"before": None, "after": None}

    async def test_failed_start_scrape_is_null_before(
        self, page_server, exporter, unused_tcp_port
    ):
        exp = await exporter({"targets": [
            {"name": "down", "url": f"http://127.0.0.1:{unused_tcp_port}/metrics"}]})
        await exp.start(id="dead")
        answer = await exp.stop("dead")
        result = answer["results"]["down"]
        assert result["status"] == "na" and result["data"] is None
        assert result["raw"] == {"before": None, "after": None}

    async def test_page_without_spec_decode_series_is_null_not_zeros(
        self, fake_vllm, exporter, tmp_path
    ):
        # AISBench's snapshot of such a page fails (None): it writes null, never zeros; and
        # its reason once (AISBench joins start's and stop's: "X; X").
        fake = await fake_vllm(spec_decode=False)
        exp = await exporter({"targets": [{"name": "plain", "url": fake.url}]})
        await exp.start(id="plain")
        fake.server.simulate(10)
        answer = await exp.stop("plain")
        result = answer["results"]["plain"]
        assert result["status"] == "na"
        assert result["error"] == "No spec decode metrics found on server"
        assert result["raw"] == {"before": None, "after": None}
        (path,) = (tmp_path / "out" / "plain" / "performances").glob("spec_decode_*")
        assert json.loads(path.read_text())["raw"] == {"before": None, "after": None}


class TestMixedK:
    """Position i of any aggregate is over the drafts of the targets that draft position i."""

    async def _two_targets(self, fake_vllm, exporter):
        k3, k5 = await fake_vllm(k=3), await fake_vllm(k=5)
        exp = await exporter({"targets": [{"name": "k3", "url": k3.url},
                                          {"name": "k5", "url": k5.url}]})
        await exp.start(id="mixed")
        k3.server.add(0, 50, 150, [40, 30, 20])
        k5.server.add(0, 11, 55, [10, 9, 8, 7, 5])
        return await exp.stop("mixed")

    async def test_window_aggregate_and_per_model(self, fake_vllm, exporter):
        answer = await self._two_targets(fake_vllm, exporter)
        assert answer["results"]["k5"]["data"]["per_position_acceptance_rates"]["3"] == 7 / 11
        aggregate = answer["aggregate"]
        rates = {"0": 50 / 61, "1": 39 / 61, "2": 28 / 61, "3": 7 / 11, "4": 5 / 11}
        assert aggregate["data"]["per_position_acceptance_rates"] == rates  # not 7/61 at 3
        assert aggregate["data"]["num_drafts"] == 61
        assert aggregate["per_position_drafts"] == {"0": 61, "1": 61, "2": 61, "3": 11, "4": 11}
        assert all(type(v) is int for v in aggregate["per_position_drafts"].values())
        assert aggregate["per_position_note"] == (
            "position i is over the drafts of the targets that draft position i (those with a "
            "series for it): per_position_drafts")
        # Both fake servers serve the same model name: its breakdown follows the same rule.
        (model,) = aggregate["per_model"].values()
        assert model["per_position_acceptance_rates"] == rates
        assert model["increase"]["num_drafts_per_pos"] == {"3": 11, "4": 11}
        assert "{0: 0.8197, 1: 0.6393, 2: 0.4590, 3: 0.6364, 4: 0.4545}" in format_window(answer)

    async def test_merged_shard_answers(self, fake_vllm, exporter):
        answer = await self._two_targets(fake_vllm, exporter)
        shards = [answer | {"targets": [name], "results": {name: answer["results"][name]}}
                  for name in ("k3", "k5")]
        merged = merge_answers(shards)
        assert merged["aggregate"] == answer["aggregate"]
        assert merged["results"] == answer["results"]


def _block(label: str, rows: list[tuple[str, str]]) -> str:
    title = f"========== Speculative Decoding Metrics  [{label}] =========="
    rule = "=" * (len(title) - 2)
    return "\n".join(["", rule, title, rule] + [f"{n:<46}{v}" for n, v in rows]) + "\n"


class TestConsoleCaveats:
    """The seed's block exactly for a clean full result; one line per caveat after it."""

    async def test_clean_full_result_is_the_block_alone(self, page_server, exporter):
        answer, result = await _window(page_server, exporter, {}, name=None)
        label = result["host_port"]
        assert format_window(answer) == _block(label, [
            ("Acceptance rate (%)", "33.33"), ("Acceptance length", "2.00"), ("Drafts", "60"),
            ("Draft tokens", "180"), ("Accepted tokens", "60"),
            ("Per-position acceptance rates", "{0: 0.5000, 1: 0.3333, 2: 0.1667}"),
        ])

    async def test_partial_result_says_so_after_the_block(self, page_server, exporter):
        answer, result = await _window(page_server, exporter, {2: {"accepted": "NaN"}},
                                       name=None)
        assert format_window(answer) == _block(result["host_port"], [
            ("Acceptance rate (%)", "50.00"), ("Acceptance length", "2.50"), ("Drafts", "20"),
            ("Draft tokens", "60"), ("Accepted tokens", "30"),
            ("Per-position acceptance rates", "{0: 0.5000, 1: 0.5000, 2: 0.5000}"),
        ]) + (
            "Note: partial coverage: the numbers cover 2026-12-02T18:00:00.000Z to "
            "2026-12-02T18:00:10.000Z of the window 2026-12-02T18:00:00.000Z to "
            '2026-12-02T18:00:20.000Z; num_accepted_tokens{engine="0",model_name="m"} was NaN '
            "at 2026-12-02T18:00:20.000Z (scrape not used)\n"
        )

    async def test_restart_and_bridged_scrape_each_get_a_line(self, page_server, exporter):
        page, url = await page_server()
        clock = Clock(T0)
        exp = await exporter({"targets": [{"name": "a", "url": url}]}, clock=clock)
        page.set(STATES[1], {})
        await exp.start(id="r")
        clock.now += 10
        page.set((10, 30, [5, 5, 5]), {"drafts": "NaN"})  # restarted; this scrape unusable
        await exp.round()
        clock.now += 10
        page.set((20, 60, [10, 10, 5]), {})
        answer = await exp.stop("r")
        result = answer["results"]["a"]
        assert result["data"]["num_drafts"] == 20 and result["resets"] == 1
        lines = format_window(answer).splitlines()
        assert lines[10:] == [
            "Target: a",  # the config's name, where it differs from the block's host:port
            "Note: partial coverage: not counted: what the server counted from our last scrape "
            "before each restart to the restart: 2026-12-02T18:00:00.000Z to "
            "2026-12-02T18:00:20.000Z (20.000 s; restart between the scrapes at "
            "2026-12-02T18:00:00.000Z and 2026-12-02T18:00:20.000Z)",
            'Note: 1 scrape inside the span not used: num_drafts{engine="0",model_name="m"} was '
            "NaN at 2026-12-02T18:00:10.000Z; the next usable values bridge it exactly",
        ]


class TestPerModel:
    def test_each_model_its_own_numbers_and_one_model_the_targets(self):
        a = Counts(10, 30, 12, {0: 7, 1: 5})
        b = Counts(4, 12, 2, {0: 2, 1: 0})
        two = Result(status=Status.OK, url="u", increase=a + b, per_model={"m2": b, "m1": a})
        body = two.to_json()
        assert list(body["per_model"]) == ["m1", "m2"]
        for name, counts in (("m1", a), ("m2", b)):
            assert body["per_model"][name] == result_data(counts) | {"increase": counts.as_raw()}
        one = Result(status=Status.OK, url="u", increase=a, per_model={"m1": a}).to_json()
        assert one["per_model"]["m1"] == one["data"] | {"increase": one["increase"]}
        # A copy, not the target's own dicts: a reader changing one leaves the other.
        one["per_model"]["m1"]["per_position_acceptance_rates"]["0"] = -1.0
        one["per_model"]["m1"]["increase"]["accepted_per_pos"]["0"] = -1
        assert one["data"] == result_data(a) and one["increase"] == a.as_raw()
