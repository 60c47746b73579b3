"""Entry point: run the cases, print the table of figures and ratios, write the JSON."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from bench import (
    case_exposition,
    case_fleet,
    case_floor,
    case_markers,
    case_pages,
    case_parse,
    case_proxy,
    case_records,
    case_save,
    case_scale,
    case_servercost,
)
from bench.common import CaseResult, Row, Skip
from bench.fleet import NginxFleet, find_nginx
from bench.procs import find_prometheus, find_victoria

CASES = ("parse", "fleet", "fleet-plain", "floor", "pages", "markers", "exposition", "save",
         "records", "scale", "servercost", "proxy")
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


@dataclass
class Settings:
    """Sizes and durations of one run: full by default, small with --quick."""

    parse_sizes: tuple = case_parse.SIZES_FULL
    parse_repeats: int = 5
    fleet_sizes: tuple = (100, 500, 1000, 2500, 5000)
    compare_at: tuple = (100, 1000)  # Prometheus and the asyncio-loop exporter beside ours
    fleet_seconds: float = 10.0
    rotations: int = 3
    interval: float = 5.0
    prometheus_keep: tuple = ("spec", "all")
    marker_sizes: tuple = (100, 1000)
    marker_repeats: dict = field(default_factory=lambda: {100: 5, 1000: 50})
    marker_live_window: float = case_markers.LIVE_WINDOW
    exposition_n: int = 1000
    exposition_repeats: int = 7
    lag_seconds: float = 12.0
    page_kib: int = 160  # the fleet's mean page: 60, 160 or 400 KiB shapes a real fleet's
    pages_n: int = 200  # targets of the pages case, per page size
    pages_kib: tuple = case_pages.SIZES_KIB
    plain_sizes: tuple = (1000,)  # the plain-page fleet: against Prometheus and VM only
    server_seconds: float = 15.0  # servercost's spans
    records_n: int = 1_000_000  # per-request records in the records case's window
    proxy_rounds: int = 5  # the proxy case's alternating rounds, 64 and 8 streams each
    proxy_span: float = 3.0  # seconds per path and round

    @classmethod
    def quick(cls) -> Settings:
        """Tiny sizes and short spans: a smoke run of every case in well under a minute."""
        return cls(
            parse_sizes=case_parse.SIZES_QUICK, parse_repeats=3, fleet_sizes=(10, 30),
            compare_at=(30,), fleet_seconds=3.0, rotations=2, interval=1.0, marker_sizes=(3, 10),
            marker_repeats={3: 2, 10: 2}, marker_live_window=2.0, exposition_n=30,
            exposition_repeats=3, lag_seconds=2.0, pages_n=10, pages_kib=(60,),
            plain_sizes=(30,), server_seconds=2.0, records_n=10_000, proxy_rounds=1,
            proxy_span=0.5,
        )

    @property
    def fleet_size(self) -> int:
        """Targets nginx must serve for every case."""
        return max(*self.fleet_sizes, *self.plain_sizes, *self.marker_sizes, self.exposition_n)


class Suite:
    """Runs the chosen cases, sharing one nginx fleet, and collects their results."""

    def __init__(self, settings: Settings, png: Path | None):
        self.settings = settings
        self.png = png
        self.results: dict[str, CaseResult] = {}
        self._fleet: NginxFleet | None = None
        self.baseline_tree: Path | None = None

    def fleet(self) -> NginxFleet:
        """The shared nginx fleet, started on first use (Skip without nginx)."""
        if self._fleet is None:
            self._fleet = NginxFleet(self.settings.fleet_size,
                                     page_bytes=self.settings.page_kib * 1024)
        return self._fleet

    def close(self) -> None:
        """Stop nginx."""
        if self._fleet is not None:
            self._fleet.close()
            self._fleet = None

    def run_case(self, name: str) -> CaseResult:
        """Run one case; a Skip becomes a skipped result with the reason."""
        s = self.settings
        started = time.monotonic()
        print(f"-- {name} ...", flush=True)
        try:
            if name == "parse":
                result = case_parse.run(sizes=s.parse_sizes, repeats=s.parse_repeats)
            elif name == "fleet":
                result = case_fleet.run(self.fleet(), sizes=s.fleet_sizes,
                                        seconds=s.fleet_seconds, interval=s.interval,
                                        keep=s.prometheus_keep, rotations=s.rotations,
                                        compare_at=s.compare_at,
                                        baseline_tree=self.baseline_tree)
            elif name == "fleet-plain":
                result = case_fleet.run(self.fleet(), sizes=s.plain_sizes,
                                        seconds=s.fleet_seconds, interval=s.interval,
                                        keep=("spec",), rotations=s.rotations, loops=False,
                                        plain=True)
            elif name == "servercost":
                result = case_servercost.run(seconds=s.server_seconds,
                                             rotations=2 if s.server_seconds < 5 else 3)
            elif name == "floor":
                fleet = self.results.get("fleet")
                result = case_floor.run(self.fleet(), fleet.data if fleet else None)
            elif name == "pages":
                result = case_pages.run(n=s.pages_n, sizes_kib=s.pages_kib,
                                        rounds=3 if s.pages_n < 100 else 7)
            elif name == "markers":
                result = case_markers.run(self.fleet(), sizes=s.marker_sizes,
                                          repeats=s.marker_repeats, interval=s.interval,
                                          live_window=s.marker_live_window)
            elif name == "exposition":
                result = case_exposition.run(self.fleet(), n=s.exposition_n,
                                             repeats=s.exposition_repeats,
                                             lag_seconds=s.lag_seconds, interval=s.interval)
            elif name == "save":
                result = case_save.run(self.fleet(), n=s.exposition_n,
                                       repeats=s.exposition_repeats)
            elif name == "proxy":
                result = case_proxy.run(rounds=s.proxy_rounds, span=s.proxy_span)
            elif name == "records":
                result = case_records.run(s.records_n)
            elif name == "scale":
                if "fleet" not in self.results:
                    self.results["fleet"] = self.run_case("fleet")
                fleet = self.results["fleet"]
                if fleet.skipped:
                    raise Skip(f"fleet case skipped: {fleet.skipped}")
                result = case_scale.run(fleet.data, png=self.png)
            else:
                raise ValueError(f"unknown case {name!r}")
        except Skip as exc:
            result = CaseResult(name, skipped=str(exc))
            print(f"   skipped: {exc}", flush=True)
        except Exception as exc:  # one broken case must not lose the others' figures
            traceback.print_exc()
            result = CaseResult(name, skipped=f"ERROR {type(exc).__name__}: {exc}")
        result.seconds = time.monotonic() - started
        print(f"   {name} done in {result.seconds:.1f}s", flush=True)
        self.results[name] = result
        return result


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.01:
        return f"{value:.3g}"
    return f"{value:.2e}"


def table(results: list[CaseResult]) -> list[list[str]]:
    """The table's rows as text: case, figure, value, baseline, ratio, target, met."""
    lines = [["case", "figure", "value", "baseline", "ratio", "target", "met?"]]
    for result in results:
        if result.skipped:
            lines.append([result.name, f"SKIPPED: {result.skipped}", "", "", "", "", ""])
            continue
        for row in result.rows:
            lines.append(_row(row))
    return lines


def _row(row: Row) -> list[str]:
    base = _fmt(row.baseline) if row.baseline is not None else "-"
    if row.baseline is not None and row.baseline_name:
        base = f"{base} ({row.baseline_name})"
    met = "-" if row.met is None else ("yes" if row.met else "NO")
    ratio = f"{_fmt(row.ratio)}x" if row.ratio is not None else "-"
    return [row.case, row.figure, f"{_fmt(row.value)} {row.unit}", base, ratio, row.target, met]


def render_table(lines: list[list[str]], markdown: bool = False) -> str:
    """Plain aligned text, or a Markdown table."""
    if markdown:
        out = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(lines[0])]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in lines[1:]]
        return "\n".join(out)
    widths = [min(60, max(len(line[i]) for line in lines)) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip()
        for line in lines
    )


def _version(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0] if text else None


def meta(args: argparse.Namespace, settings: Settings) -> dict:
    """Where and how the figures were taken."""
    from exporter import __version__

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nginx, prom = find_nginx(), find_prometheus()
    commit = _version(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "exporter_version": __version__,
        "git_commit": commit,
        # Figures of a tree with uncommitted exporter changes do not belong to the commit alone.
        "exporter_uncommitted_changes": bool(
            _version(["git", "-C", str(ROOT), "status", "--porcelain", "exporter"])
        ),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "nginx": _version([nginx, "-v"]) if nginx else None,
        "prometheus": _version([prom, "--version"]) if prom else None,
        "victoria_metrics": _version([vm, "-version"]) if (vm := find_victoria()) else None,
        "quick": args.quick,
        "settings": {k: (list(v) if isinstance(v, tuple) else v)
                     for k, v in vars(settings).items()},
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m bench`."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="small N and short spans, for a smoke run")
    parser.add_argument("--only", action="append", choices=CASES, metavar="CASE",
                        help=f"run only this case (repeatable): {', '.join(CASES)}")
    parser.add_argument("--duration", type=float,
                        help="seconds each process is measured per N in the fleet case")
    parser.add_argument("--page-kib", type=int,
                        help="mean size of the fleet's pages in KiB (default 160; 60, 400)")
    parser.add_argument("--fleet-sizes", type=lambda v: tuple(int(x) for x in v.split(",")),
                        help="fleet case's target counts, comma-separated (e.g. 1000)")
    parser.add_argument("--rotations", type=int, help="fleet case's turns per contender")
    parser.add_argument("--baseline-tree", type=Path,
                        help="a checkout of another commit (git worktree add): its exporter"
                             " joins the fleet case's rotation, measured the same way")
    parser.add_argument("--prometheus-keep", choices=("spec", "all"), action="append",
                        help="Prometheus baselines: keeping only spec-decode series, all series"
                             " (repeatable; default both)")
    parser.add_argument("--json", type=Path, default=RESULTS / "latest.json",
                        help="where to write the results (default bench/results/latest.json)")
    parser.add_argument("--png", type=Path,
                        help="scale plot (default docs/perf-scale.png; quick: bench/results/)")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run, print, write; exit 0 even when targets are missed (the table says which)."""
    args = build_parser().parse_args(argv)
    settings = Settings.quick() if args.quick else Settings()
    if args.duration:
        settings.fleet_seconds = args.duration
    if args.page_kib:
        settings.page_kib = args.page_kib
    if args.fleet_sizes:
        settings.fleet_sizes = settings.compare_at = settings.plain_sizes = args.fleet_sizes
    if args.rotations:
        settings.rotations = args.rotations
    if args.prometheus_keep:
        settings.prometheus_keep = tuple(args.prometheus_keep)
    png = args.png or (RESULTS / "perf-scale-quick.png" if args.quick
                       else ROOT / "docs" / "perf-scale.png")
    chosen = args.only or list(CASES)
    started = time.monotonic()
    info = meta(args, settings)
    suite = Suite(settings, png)
    suite.baseline_tree = args.baseline_tree
    try:
        for name in CASES:
            if name in chosen and name not in suite.results:
                suite.run_case(name)
    finally:
        suite.close()
    results = [suite.results[n] for n in CASES if n in suite.results]
    elapsed = time.monotonic() - started
    lines = table(results)
    print()
    print(render_table(lines))
    if args.markdown:
        print()
        print(render_table(lines, markdown=True))
    missed = [r for res in results for r in res.rows if r.met is False]
    print(f"\n{len(missed)} target(s) missed; suite took {elapsed:.0f}s")
    info["elapsed_s"] = round(elapsed, 1)
    doc = {"meta": info, "cases": {r.name: r.to_dict() for r in results},
           "table": lines}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
