"""The sub-commands that read stopped windows: compare, advise."""

from __future__ import annotations

import argparse
import json
import logging

from exporter.cli.common import say


def cmd_compare(args: argparse.Namespace) -> int:
    from exporter.analysis.compare import GateError, apply_gates, compare_answers, parse_gate
    from exporter.analysis.speedup import compare_speed, gate_slower
    from exporter.cli.sources import SourceError, align_names, load_source
    from exporter.cli.tables import format_comparison, format_speedup

    # 2 for anything that keeps the comparison from being made: a CI gate must not read a
    # typo or an unreachable exporter as a regression (1).
    try:
        gates = [parse_gate(text) for text in args.fail_if_worse]
        a = load_source(args.a, args.exporter, args.token)
        b = load_source(args.b, args.exporter, args.token)
    except (GateError, SourceError) as exc:
        say(str(exc), prefix="specdec-exporter compare", level=logging.ERROR)
        return 2
    a, b = align_names(a, b)
    body = apply_gates({"a": a.label, "b": b.label} | compare_answers(a.answer, b.answer), gates)
    body["speedup"] = compare_speed(a.answer, b.answer)
    if args.fail_if_slower is not None:
        body["speed_gate"] = gate_slower(body["speedup"], args.fail_if_slower)
        if not any(c["speedup"]["high"] is not None for c in body["speed_gate"]["checks"]):
            say("--fail-if-slower: no speed-up with an interval to test (the windows need "
                "timed requests through the proxy, 10 or more on each side)",
                prefix="specdec-exporter compare", level=logging.ERROR)
            return 2
    print(json.dumps(body, indent=2) + "\n" if args.json
          else format_comparison(body) + format_speedup(body), end="")
    return 1 if body["tripped"] or body.get("speed_gate", {}).get("tripped") else 0


def cmd_advise(args: argparse.Namespace) -> int:
    from exporter.analysis.advise import DEFAULT_COSTS, NOT_BY_RATE, measured_cost, window_advice
    from exporter.cli.sources import ExporterSourceError, SourceError, load_source
    from exporter.cli.tables import format_window_advice

    if args.rank_by == "acceptance_rate":
        say(NOT_BY_RATE, prefix="specdec-exporter advise", level=logging.ERROR)
        return 2
    try:
        source = load_source(args.window, args.exporter, args.token)
        baseline = load_source(args.baseline, args.exporter, args.token) if (
            args.baseline) else None
    except SourceError as exc:
        say(str(exc), prefix="specdec-exporter advise", level=logging.ERROR)
        # README's exit codes: 1 the exporter unreachable or refusing, 2 a folder's mistake.
        return 1 if isinstance(exc, ExporterSourceError) else 2
    measured = measured_cost(baseline.answer, source.answer) if baseline else None
    costs = list(args.draft_cost or ([] if measured and "value" in measured else DEFAULT_COSTS))
    if measured and "value" in measured:
        bands = measured["by_concurrency"]
        costs += sorted({c["value"] for c in bands.values()}) if bands else [measured["value"]]
    body = window_advice(source.answer, costs) | {"ranked_by": "speedup",
                                                  "measured_cost": measured}
    print(json.dumps({"window": source.label} | body, indent=2) + "\n" if args.json
          else format_window_advice(source.label, body), end="")
    advised = [a for a in [*body["results"].values(), body["aggregate"]] if a and "error" not in a]
    return 0 if advised else 1


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def speed_ratio(text: str) -> float:
    if not 0 < (value := _number(text)) < 1e6:
        raise argparse.ArgumentTypeError(f"{text!r}: a speed-up ratio is a number > 0, "
                                         "e.g. 1.2")
    return value


def draft_cost(text: str) -> float:
    if not 0 <= (value := _number(text)) < 1e6:
        raise argparse.ArgumentTypeError(f"{text!r}: a draft cost is a number >= 0")
    return value
