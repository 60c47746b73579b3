"""A window row saved before segments were kept: migrated, its proxied requests stand in
`unknown` of each dimension (their sums still add up; no interval: no moments were kept)."""

from __future__ import annotations

import json
import sqlite3

from exporter.core.perrequest import PerRequest, RequestStats
from exporter.core.segments import DIMENSIONS
from state.test_schema import counted, version_0, window_doc
from state.test_store import loaded


def _old_tally() -> dict:
    """A target's per-request tally as the row held it before `by`."""
    acc = PerRequest()
    for steps in (3, 5, 7):
        acc.record(RequestStats("r", "m", 10, steps, {
            "num_spec_steps": steps, "num_draft_tokens": 3 * steps,
            "num_accepted_draft_tokens": steps, "acceptance_histogram": [1, steps - 2, 1, 0]}),
                   at=150.0)
    return {k: v for k, v in acc.to_dict().items() if k not in ("by", "by_notes")}


def test_a_version_0_row_migrates_with_its_requests_in_unknown(tmp_path) -> None:
    doc = window_doc(counted()) | {"per_request": {"a": _old_tally()}}
    version_0(tmp_path / "s.sqlite", doc)
    back = loaded(tmp_path / "s.sqlite")
    block = back.per_request["a"].answer()
    for dimension in DIMENSIONS:
        assert list(block["by"][dimension]) == ["unknown"]
        unknown = block["by"][dimension]["unknown"]
        assert (unknown["requests"], unknown["num_spec_steps"]) == (3, 15)
        assert unknown["acceptance_histogram"] == block["acceptance_histogram"]
        assert unknown["acceptance_length"] is None and unknown["moments"] is None
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        (row,) = db.execute("SELECT doc FROM windows").fetchone()
    db.close()
    assert json.loads(row)["per_request"]["a"]["by"] == block["by"]  # rewritten whole
    assert list(back.per_request["a"].finished) == [150.0] * 3  # its finish times kept
