"""A stopped window's RESULTs: per target and aggregate, in AISBench's format plus our extras."""

from __future__ import annotations

from exporter.accounting import Accumulator
from exporter.advise import window_advice
from exporter.derive import acceptance_length, acceptance_ratio, has_activity, result_data
from exporter.parse import SGLANG_LENGTH, SGLANG_RATE, dialect_note
from exporter.snapshot import Counts
from exporter.window import TargetRef, Window

NO_METRICS = "No spec decode metrics found on server"
NO_ACTIVITY = "No spec decode activity detected during benchmark window"


def fetch_error(url: str, reason: str, when: str) -> str:
    """AISBench's fetch error, saying whether it was the window's start or its stop."""
    return f"Failed to fetch metrics from {url} at window {when}: {reason}"


def _na(ref: TargetRef, error: str, extra: dict) -> dict:
    return {"status": "na", "url": ref.url, "error": error, "data": None, "raw": None} | extra


def target_result(window: Window, name: str) -> dict:
    """The RESULT of one target of a stopped window."""
    ref = window.targets[name]
    acc = window.accumulators.get(name)
    start_error = window.start_errors.get(name)
    stop_error = window.stop_errors.get(name)
    extra = _extras(ref, acc)
    notes = []
    if start_error:
        notes.append(fetch_error(ref.url, start_error, "start"))
    if stop_error:
        notes.append(fetch_error(ref.url, stop_error, "stop"))
    if name in window.removed:
        # The target left the window before its stop: N/A, with what was seen until then.
        if acc is not None and acc.scrapes >= 2 and has_activity(acc.totals()):
            extra["increase_until_removed"] = acc.totals().as_raw()
        return _na(ref, "; ".join([window.removed[name], *notes]), extra)
    if acc is None or acc.scrapes == 0:
        return _na(ref, "; ".join(notes) or NO_METRICS, extra)
    if acc.dialect == "sglang":
        return _estimate_result(window, name, ref, acc, extra, notes)
    if not acc.last:
        return _na(ref, NO_METRICS, extra)
    if acc.scrapes < 2:
        # One good scrape is a baseline with nothing to compare it to.
        return _na(ref, "; ".join(notes) or NO_ACTIVITY, extra)
    counts = acc.totals()
    if not has_activity(counts):
        reason = NO_ACTIVITY if not notes else f"{NO_ACTIVITY} ({'; '.join(notes)})"
        return _na(ref, reason, extra)
    coverage = _coverage(window, name, acc, notes)
    if acc.resets:
        extra["reset_note"] = (
            f"server restart seen {acc.resets} time(s) inside the window; "
            "the increase before and after each restart is counted"
        )
        while_down = [
            (down, up) for down, up in window.downtimes
            if any(prev <= down and seen >= up for prev, seen in acc.reset_spans)
        ]
        if while_down:
            down, up = while_down[-1]
            extra["reset_note"] += (
                f"; the server restarted while the exporter was down ({down:.3f} to {up:.3f}):"
                " what it counted between our last scrape and its restart is lost"
            )
    return {
        "status": "ok",
        "url": ref.url,
        "error": None,
        "data": result_data(counts),
        "raw": {"before": _before(acc).as_raw(), "after": acc.current().as_raw()},
        "increase": counts.as_raw(),
    } | extra | coverage | {"per_model": _per_model(acc)}


def _estimate_result(
    window: Window, name: str, ref: TargetRef, acc: Accumulator, extra: dict, notes: list[str]
) -> dict:
    """SGLang has no counters: the time-weighted means of its interval gauges, flagged."""
    means = acc.gauge_means()
    if acc.scrapes < 2 or SGLANG_LENGTH not in means:
        reason = NO_ACTIVITY if not notes else f"{NO_ACTIVITY} ({'; '.join(notes)})"
        return _na(ref, reason, extra)
    data = {
        "num_drafts": None,
        "draft_tokens": None,
        "accepted_tokens": None,
        "acceptance_rate": round(100 * means[SGLANG_RATE], 2) if SGLANG_RATE in means else None,
        "acceptance_length": round(means[SGLANG_LENGTH], 3),
        "per_position_acceptance_rates": {},
    }
    return {
        "status": "ok", "url": ref.url, "error": None, "data": data, "raw": None,
        "estimate": True, "gauge_means": means,
    } | extra | _coverage(window, name, acc, notes)


def _before(acc: Accumulator) -> Counts:
    return acc.before if acc.before is not None else Counts()


def _coverage(window: Window, name: str, acc: Accumulator, notes: list[str]) -> dict:
    if not notes:
        return {"coverage": "full", "coverage_note": None}
    note = (
        f"partial: the numbers cover {acc.first_at:.3f} to {acc.last_at:.3f} "
        f"(window {window.started_at:.3f} to {window.stopped_at or acc.last_at:.3f}); "
        + "; ".join(notes)
    )
    return {"coverage": "partial", "coverage_note": note}


def _extras(ref: TargetRef, acc: Accumulator | None) -> dict:
    return {
        "target": ref.name,
        "host_port": ref.host_port,
        "model_names": acc.model_names if acc else [],
        "engines": len(acc.engines) if acc else 0,
        "dialect": (acc.dialect or None) if acc else None,
        "resets": acc.resets if acc else 0,
        "scrapes": acc.scrapes if acc else 0,
        "first_scrape_at": acc.first_at if acc else None,
        "last_scrape_at": acc.last_at if acc else None,
    } | ({"dialect_note": note} if acc and (note := dialect_note(acc.dialect)) else {})


def _per_model(acc: Accumulator) -> dict:
    return {m: result_data(c) for m, c in acc.by_model().items() if has_activity(c)}


def aggregate_result(window: Window, results: dict[str, dict]) -> dict:
    """All targets with activity summed, then divided (never an average of ratios)."""
    # Estimates (SGLang's gauge means) cannot be summed with counts: they stay out.
    used = [n for n, r in results.items() if r["status"] == "ok" and not r.get("estimate")]
    total, before, after = Counts(), Counts(), Counts()
    per_model: dict[str, Counts] = {}
    for name in used:
        acc = window.accumulators[name]
        total = total + acc.totals()
        before = before + _before(acc)
        after = after + acc.current()
        for model, counts in acc.by_model().items():
            per_model[model] = per_model.get(model, Counts()) + counts
    base = {
        "url": None,
        "targets": used,
        "resets": sum(results[n].get("resets", 0) for n in used),
        "engines": sum(results[n].get("engines", 0) for n in used),
        "model_names": sorted(per_model),
    }
    if not used:
        return {"status": "na", "error": NO_ACTIVITY, "data": None, "raw": None} | base
    return {
        "status": "ok",
        "error": None,
        "data": result_data(total),
        "raw": {"before": before.as_raw(), "after": after.as_raw()},
        "increase": total.as_raw(),
        "per_model": {m: result_data(c) for m, c in sorted(per_model.items()) if has_activity(c)},
    } | base


def window_answer(window: Window) -> dict:
    """The whole stop answer of a stopped window."""
    results = {name: target_result(window, name) for name in window.targets}
    answer = window.summary() | {
        "stopped_at": window.stopped_at,
        "results": results,
        "aggregate": aggregate_result(window, results),
    }
    return answer | {"advice": window_advice(answer)}


def window_series(window: Window) -> dict:
    """Per target, per scrape: cumulative and since-the-previous-scrape ratio and length."""
    targets = {}
    for name, points in window.series.items():
        rows = []
        previous = None
        for at, drafts, draft_tokens, accepted in points:
            row = {"at": at, "drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted,
                   **_ratio_pair("", Counts(drafts, draft_tokens, accepted))}
            if previous is not None:
                step = Counts(drafts - previous[1], draft_tokens - previous[2],
                              accepted - previous[3])
                row |= _ratio_pair("interval_", step)
            rows.append(row)
            previous = (at, drafts, draft_tokens, accepted)
        targets[name] = rows
    return {"id": window.id, "name": window.name, "started_at": window.started_at,
            "stopped_at": window.stopped_at, "targets": targets}


def _ratio_pair(prefix: str, counts: Counts) -> dict:
    return {f"{prefix}acceptance_ratio": acceptance_ratio(counts),
            f"{prefix}acceptance_length": acceptance_length(counts)}
