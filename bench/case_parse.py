"""Case 1: our spec-decode parser against prometheus_client's full parser and bytes.count."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from bench.common import CaseResult, Row, ratio, time_call
from exporter.core.dialects import DIALECTS, Dialect
from exporter.core.parse import parse_page
from exporter.fakevllm import page_for_bench

SIZES_FULL = ((1, 100_000), (2, 600_000), (8, 5_000_000))
SIZES_QUICK = ((1, 20_000), (2, 60_000))

_NAMES = {fld: name + "_total" for name, fld in DIALECTS[Dialect.VLLM].counters.items()}


def reference_series(page: bytes) -> dict[tuple, float]:
    """Spec-decode counter series as prometheus_client reads them: (name, labels) -> value."""
    series = {}
    for family in text_string_to_metric_families(page.decode("utf-8")):
        for sample in family.samples:
            if sample.name.startswith("vllm:spec_decode_") and sample.name.endswith("_total"):
                series[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return series


def our_series(page: bytes) -> dict[tuple, float]:
    """The same series from our parser's Snapshot, keyed the same way."""
    series = {}
    for key, value in parse_page(page, Dialect.VLLM).values.items():
        labels = {"model_name": key.model_name} | dict(key.extra)
        if key.engine:
            labels["engine"] = key.engine
        if key.position >= 0:
            labels["position"] = str(key.position)
        series[(_NAMES[key.field], tuple(sorted(labels.items())))] = value
    return series


def run(*, sizes=SIZES_FULL, repeats: int = 5, ref_repeats: int = 3) -> CaseResult:
    """Time the three readers over pages of each size; check our answers equal the reference."""
    result = CaseResult("parse")
    for engines, target_bytes in sizes:
        page = page_for_bench(engines, target_bytes)
        mb = len(page) / 1e6
        label = f"{engines} engine{'s' if engines > 1 else ''}, {mb:.2f} MB"
        ref = reference_series(page)
        ours = our_series(page)
        same = ref == ours and bool(ref)
        t_ours = time_call(lambda p=page: parse_page(p, Dialect.VLLM), repeats=repeats)
        t_ref = time_call(
            lambda p=page: list(text_string_to_metric_families(p.decode("utf-8"))),
            repeats=ref_repeats, min_seconds=0.0,
        )
        t_count = time_call(lambda p=page: p.count(b"\n"), repeats=repeats)
        speedup = ratio(t_ref, t_ours)
        vs_count = ratio(t_ours, t_count)
        result.data[label] = {
            "engines": engines,
            "bytes": len(page),
            "lines": page.count(b"\n"),
            "spec_series": len(ours),
            "same_answers": same,
            "ours_s": t_ours,
            "reference_s": t_ref,
            "count_newlines_s": t_count,
            "ours_mb_s": mb / t_ours,
            "reference_mb_s": mb / t_ref,
            "count_newlines_mb_s": mb / t_count,
            "speedup_vs_reference": speedup,
            "slowdown_vs_count": vs_count,
        }
        result.rows += [
            Row("parse", f"{label}: ours MB/s", mb / t_ours, "MB/s", mb / t_ref,
                "prometheus_client parser", speedup, ">= 200x",
                speedup is not None and speedup >= 200),
            Row("parse", f"{label}: ours vs count(b'\\n'), time", t_ours * 1e6, "us",
                t_count * 1e6, "page.count(b'\\n')", vs_count, "<= 3x",
                vs_count is not None and vs_count <= 3),
            Row("parse", f"{label}: same series values as reference ({len(ours)} series)",
                1.0 if same else 0.0, "bool", None, "", None, "equal", same),
        ]
    return result
