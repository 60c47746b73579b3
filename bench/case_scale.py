"""Case 5: CPU and memory against N, from the fleet case; a PNG when matplotlib is installed."""

from __future__ import annotations

from pathlib import Path

from bench.common import CaseResult, Row

LINEAR_SPREAD = 1.5  # max/min CPU per target-scrape over N: at most this for "linear"


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares line y = a + b x: (a, b, r squared)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx if sxx else 0.0
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return a, b, (1 - ss_res / ss_tot) if ss_tot else 1.0


def series(points: dict, who: str, key: str) -> tuple[list[int], list[float]]:
    """(N values, figures) of one process's figure, for the points that have it."""
    xs, ys = [], []
    for n in sorted(points, key=int):
        value = (points[n].get(who) or {}).get(key)
        if value is not None:
            xs.append(int(n))
            ys.append(value)
    return xs, ys


def plot(points: dict, path: Path) -> str | None:
    """Draw CPU (% of one core) and peak RSS against N; None when done, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install '.[bench]'): plot skipped"
    fig, (cpu_ax, rss_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for who, style, name in (("exporter", "o-", "specdec-exporter"),
                             ("prometheus-spec", "s--", "Prometheus, spec-decode series kept"),
                             ("prometheus-all", "^:", "Prometheus, every series kept")):
        xs, ys = series(points, who, "core_pct")
        if xs:
            cpu_ax.plot(xs, ys, style, label=name)
        xs, ys = series(points, who, "peak_rss_mb")
        if xs:
            rss_ax.plot(xs, ys, style, label=name)
    cpu_ax.set(xlabel="targets (5 s interval)", ylabel="CPU, % of one core",
               title="CPU against fleet size")
    rss_ax.set(xlabel="targets (5 s interval)", ylabel="peak RSS, MB",
               title="Memory against fleet size")
    for ax in (cpu_ax, rss_ax):
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def run(fleet_data: dict, *, png: Path | None) -> CaseResult:
    """Linearity of the exporter's cost in N, and the plot."""
    result = CaseResult("scale")
    points = fleet_data.get("points", {})
    xs, per_scrape = series(points, "exporter", "cpu_ms_per_target_scrape")
    if len(xs) < 2:
        result.skipped = "needs the fleet case at two or more sizes"
        return result
    spread = max(per_scrape) / min(per_scrape) if min(per_scrape) > 0 else None
    _, cpu_ys = series(points, "exporter", "cpu_s_per_round")
    a, b, r2 = fit([float(x) for x in xs], cpu_ys)
    _, rss = series(points, "exporter", "peak_rss_mb")
    ra, rb, rr2 = fit([float(x) for x in xs], rss)
    pxs, prss = series(points, "prometheus-spec", "peak_rss_mb")
    prom_rb = fit([float(x) for x in pxs], prss)[1] if len(pxs) >= 2 else None
    result.data = {
        "n": xs,
        "cpu_ms_per_target_scrape": per_scrape,
        "cpu_per_round_fit": {"intercept_s": a, "slope_ms_per_target": b * 1e3, "r2": r2},
        "rss_fit": {"intercept_mb": ra, "slope_mb_per_100_targets": rb * 100, "r2": rr2},
        "prometheus_rss_slope_mb_per_100_targets": None if prom_rb is None else prom_rb * 100,
    }
    result.rows = [
        Row("scale", f"CPU per target-scrape, max/min over N={xs}", spread, "x", None, "", None,
            f"<= {LINEAR_SPREAD:g} (linear)", spread is not None and spread <= LINEAR_SPREAD),
        Row("scale", "CPU per round: linear fit slope (r2)", b * 1e3, f"ms/target (r2 {r2:.3f})"),
        Row("scale", "peak RSS growth", rb * 100, f"MB/100 targets (base {ra:.0f} MB)",
            None if prom_rb is None else prom_rb * 100, "Prometheus MB/100 targets",
            None if not prom_rb else rb / prom_rb),
    ]
    if png is not None:
        why = plot(points, png)
        result.data["plot"] = why or str(png)
        if why:
            print(f"scale: {why}")
    return result
