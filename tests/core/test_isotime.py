"""ISO 8601 UTC times: the kept seconds' texts give datetime's own text, to the millisecond."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import pytest

from exporter.core.isotime import iso_utc, with_iso_times


def datetime_text(at: float) -> str:
    """What `iso_utc` wrote before it kept each second's text: datetime's, every time."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


class TestIsoUtc:
    @pytest.mark.parametrize("at,text", [
        (1796234400.0, "2026-12-02T18:00:00.000Z"),
        (1796234405.25, "2026-12-02T18:00:05.250Z"),
        (1796234400.9999995, "2026-12-02T18:00:01.000Z"),  # rounds into the next second
        (0.0, "1970-01-01T00:00:00.000Z"),
    ])
    def test_examples(self, at, text):
        assert iso_utc(at) == text

    @pytest.mark.parametrize("seed", range(5))
    def test_same_text_as_datetime(self, seed):
        # Random times, and times at the edges of datetime's rounding: half a microsecond
        # (rounded half to even), the last microsecond of a millisecond or of a second.
        rng = random.Random(seed)
        times = [rng.uniform(0, 4e9) for _ in range(2000)]
        for _ in range(2000):
            second = rng.randint(0, 4_000_000_000)
            micro = rng.choice([0, 1, 499, 500, 999, 999_999, rng.randint(0, 999_999)])
            times.append(second + (micro + rng.choice([0.0, 0.5])) / 1e6)
        times += [math.nextafter(at, direction) for at in times[:1000]
                  for direction in (0.0, math.inf)]
        for at in times:
            assert iso_utc(at) == datetime_text(at), at

    @pytest.mark.parametrize("at", [-1.5, 253402300799.5, 1e300])
    def test_outside_the_kept_range_as_datetime(self, at):
        try:
            want: str | type[Exception] = datetime_text(at)
        except (ValueError, OverflowError, OSError) as exc:
            want = type(exc)
        if isinstance(want, str):
            assert iso_utc(at) == want
        else:
            with pytest.raises(want):
                iso_utc(at)

    def test_nan_refused(self):
        with pytest.raises(ValueError):
            iso_utc(math.nan)


class TestWithIsoTimes:
    def test_nested_times(self):
        value = {"started_at": 1796234400.0, "a": [{"last_at": None}], "n_at": True}
        assert with_iso_times(value) == {
            "started_at": 1796234400.0, "started_at_iso": "2026-12-02T18:00:00.000Z",
            "a": [{"last_at": None, "last_at_iso": None}], "n_at": True,
        }
