"""Case: the cost of one scrape against the page's size and series count (60, 160, 400 KiB).

For each size, an nginx fleet of N targets serving pages of that mean size (`PageSet`: a real
page's series per KiB), scraped in this process by the exporter's own `Scraper` (lean client,
inflate, parse) on the server's event loop: CPU time per target-scrape, median of rounds. Beside
it, over those pages, the stages alone: inflate, our parse, `bytes.count(b"\\n")`. What the
service then does with a snapshot (accounting, live tracks) is not in these figures: the fleet
case measures the whole process.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import statistics
import time

from bench.case_floor import _cpu_per_call
from bench.common import CaseResult, Row
from bench.fleet import NginxFleet
from exporter.config.model import validate_config
from exporter.core.parse import parse_page
from exporter.scrape.inflate import inflate
from exporter.scrape.scraper import Scraper, make_session
from exporter.server.eventloop import new_event_loop

SIZES_KIB = (60, 160, 400)
CAP = 16 * 1024 * 1024


async def _rounds(urls: list[str], rounds: int) -> list[float]:
    """CPU seconds per target-scrape of each round, after one round that opens connections."""
    config = validate_config({"targets": [{"name": f"t{i}", "url": url}
                                          for i, url in enumerate(urls)]})
    session = make_session(len(urls))
    scraper = Scraper(session, max_bytes=CAP, concurrency=64)
    per_scrape = []
    try:
        for i in range(rounds + 1):
            gc.collect()
            started = time.process_time()
            results = await asyncio.gather(*(scraper.scrape(t, 10.0) for t in config.targets))
            spent = time.process_time() - started
            failed = [r for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"{len(failed)} scrapes failed: {failed[0].error}")
            if i:
                per_scrape.append(spent / len(urls))
    finally:
        await scraper.close()
        await session.close()
    return per_scrape


def _stages(pages: list[bytes]) -> dict[str, float]:
    """CPU seconds per page of each stage of a scrape, over the fleet's pages."""
    bodies = [gzip.compress(page, 6) for page in pages]

    def per_page(stage) -> float:
        def every_page() -> None:
            # Nothing kept: a scrape frees its page before the next one is inflated.
            for i in range(len(pages)):
                stage(i)
        return _cpu_per_call(every_page, min_seconds=0.1) / len(pages)

    return {
        "gzip_bytes": round(statistics.mean(map(len, bodies))),
        "inflate_s": per_page(lambda i: inflate(bodies[i], CAP)),
        "parse_s": per_page(lambda i: parse_page(pages[i])),
        "count_s": per_page(lambda i: pages[i].count(b"\n")),
    }


def run(*, n: int = 200, rounds: int = 7, sizes_kib: tuple[int, ...] = SIZES_KIB,
        pages: int = 10) -> CaseResult:
    """Per page size: the scrape path's CPU per target-scrape and its stages."""
    result = CaseResult("pages")
    for kib in sizes_kib:
        with NginxFleet(n, pages=pages, page_bytes=kib * 1024) as fleet:
            rendered = fleet.pages.render()
            with asyncio.Runner(loop_factory=new_event_loop) as runner:
                per_scrape = runner.run(_rounds(fleet.urls(n), rounds))
            figures = {"page_bytes": fleet.page_bytes, "page_series": fleet.page_series,
                       "spec_series": round(statistics.mean(
                           len(parse_page(page).values) for page in rendered)),
                       "cpu_s_per_scrape": statistics.median(per_scrape),
                       "rounds": per_scrape, **_stages(rendered)}
        result.data[f"{kib} KiB"] = figures
        result.rows += _rows(kib, figures)
    return result


def _rows(kib: int, f: dict) -> list[Row]:
    us = 1e6
    label = (f"{kib} KiB pages ({f['page_bytes']:,} B, {f['page_series']:,} series, "
             f"{f['gzip_bytes']:,} B gzip'd)")
    scrape = f["cpu_s_per_scrape"] * us
    return [
        Row("pages", f"{label}: CPU per target-scrape, fetch + inflate + parse", scrape, "us"),
        Row("pages", f"{label}: CPU per target-scrape per 1,000 series", scrape * 1000
            / f["page_series"], "us"),
        Row("pages", f"{label}: inflate", f["inflate_s"] * us, "us", scrape, "scrape",
            f["inflate_s"] * us / scrape),
        Row("pages", f"{label}: parse ({f['spec_series']} spec-decode series)",
            f["parse_s"] * us, "us", f["count_s"] * us, "count(b'\\n')",
            f["parse_s"] / f["count_s"]),
    ]
