"""What every fault case asserts: the exporter still serves, and its numbers are the truth."""

from __future__ import annotations

import asyncio
import time

from prometheus_client.parser import text_string_to_metric_families

GOOD_PAGE_BUDGET = 2.0  # seconds /metrics and the API may take while a target misbehaves


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition, keyed by name and sorted labels (parsing checks it too)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: dict, name: str, **labels: str) -> float | None:
    """The value of one sample, or None if absent (extra labels on the sample are ignored)."""
    for (sample_name, sample_labels), sample_value in found.items():
        if sample_name == name and set(labels.items()) <= set(sample_labels):
            return sample_value
    return None


async def still_serving(client) -> dict:
    """/metrics, /-/healthy and the API answer fast; returns the parsed /metrics samples."""
    started = time.monotonic()
    metrics = await asyncio.wait_for(client.get("/metrics"), GOOD_PAGE_BUDGET)
    assert metrics.status == 200
    text = await metrics.text()
    for path in ("/-/healthy", "/api/v1/targets", "/api/v1/windows"):
        response = await asyncio.wait_for(client.get(path), GOOD_PAGE_BUDGET)
        assert response.status == 200, path
        await response.read()
    assert time.monotonic() - started < GOOD_PAGE_BUDGET
    return samples(text)


async def target_view(client, name: str) -> dict:
    """One target of GET /api/v1/targets."""
    body = await (await client.get("/api/v1/targets")).json()
    return next(t for t in body["targets"] if t["name"] == name)


def increase(before: dict, after: dict) -> dict:
    """The true increase between two `Counters.totals()`."""
    return {
        "num_drafts": after["num_drafts"] - before["num_drafts"],
        "num_draft_tokens": after["num_draft_tokens"] - before["num_draft_tokens"],
        "num_accepted_tokens": after["num_accepted_tokens"] - before["num_accepted_tokens"],
        "accepted_per_pos": {
            p: after["accepted_per_pos"][p] - before["accepted_per_pos"].get(p, 0)
            for p in after["accepted_per_pos"]
        },
    }


def assert_increase(result: dict, expected: dict) -> None:
    """A RESULT is ok and its exact increase is `expected` (positions with 0 may be absent)."""
    assert result["status"] == "ok", result["error"]
    got = result["increase"]
    assert got["num_drafts"] == expected["num_drafts"]
    assert got["num_draft_tokens"] == expected["num_draft_tokens"]
    assert got["num_accepted_tokens"] == expected["num_accepted_tokens"]
    want_pos = {p: v for p, v in expected["accepted_per_pos"].items() if v}
    got_pos = {p: v for p, v in got["accepted_per_pos"].items() if v}
    assert got_pos == want_pos
    data = result["data"]
    assert data["num_drafts"] == expected["num_drafts"]
    assert data["accepted_tokens"] == expected["num_accepted_tokens"]
