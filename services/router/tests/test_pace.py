"""A replica's pace fitted in numpy: the same fit as Theil-Sen's in plain Python, on any reads."""

from __future__ import annotations

import random
import statistics

import pytest

from llmgw.router.routing.pace import APART_CHARS, PACE_KEPT, PACE_LEAST, Pace


def _plain_fit(kept: list[tuple[float, float]]) -> float | None:
    """The fit as written first, pair by pair in Python: the reference."""
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(kept)
        for x2, y2 in kept[i + 1 :]
        if abs(x2 - x1) >= max(APART_CHARS, min(x1, x2))
    ]
    if len(slopes) >= PACE_LEAST:
        rate = statistics.median(slopes)
        fixed = statistics.median(y - rate * x for x, y in kept)
    else:
        rate, fixed = statistics.median(y / x for x, y in kept), 0.0
    return max(0.0, fixed) / rate if rate > 0 else None


@pytest.mark.parametrize("seed", range(60))
def test_the_fit_is_theil_sens_as_written_pair_by_pair(seed):
    rng = random.Random(seed)
    pace = Pace()
    fixed, per_char = rng.uniform(0, 300), rng.uniform(0.01, 2)
    for _ in range(rng.randint(1, PACE_KEPT + 8)):  # past PACE_KEPT the oldest go
        chars = rng.choice([rng.uniform(1, 200), rng.uniform(200, 20_000), float(rng.randint(1, 4) * 512)])
        noise = rng.choice([1.0, 1.0, rng.uniform(0.3, 3.0)])  # an engine sharing its cores, now and then
        ms = rng.choice([(fixed + per_char * chars) * noise, rng.uniform(0.01, 50)])
        pace.add(chars, ms)
        want = _plain_fit(list(pace.kept))
        if want is None:
            assert pace.chars is None
        else:
            assert pace.chars == pytest.approx(want, rel=1e-9, abs=1e-9)
