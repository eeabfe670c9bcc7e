"""What an engine's own timings say a request weighs there, pure: the time it takes reading a
prompt fitted as a fixed part and a part a character, so the balancer can weigh a request in
flight in the same unit as a prompt's characters still to read."""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["APART_CHARS", "PACE_KEPT", "PACE_LEAST", "Pace"]

PACE_KEPT = 32
"""The timings a replica's pace is fitted to: its engine's last few."""
PACE_LEAST = 3
"""The fewest pairs of those far enough apart in length to tell a fixed part from the rate."""
APART_CHARS = 256
"""How much longer (in characters, besides twice as long) one read must be than another for
the two to give a slope: a block of the balancer's index."""


class Pace:
    """What one replica's engine says its work takes, from its last `PACE_KEPT` timings: the ms
    it read each prompt in, fitted as a fixed part and a part a character read. The fit is
    Theil-Sen's: the rate the median of the slopes between reads of
    which one is twice the other and `APART_CHARS` longer, the fixed part the median of what each
    timing leaves over. An engine sharing its cores reads some prompts two or three times
    slower than others; a least-squares line through such timings swung from nothing to
    thousands of characters."""

    __slots__ = ("chars", "count", "reads")

    def __init__(self) -> None:
        self.reads = np.zeros((PACE_KEPT, 2))
        """(characters read, ms) of its last `PACE_KEPT` reads, the latest written over the oldest."""
        self.count = 0
        """Reads told in all."""
        self.chars: float | None = None
        """What a request weighs there, in characters read (`fit`); None: no fit yet."""

    @property
    def kept(self) -> np.ndarray:
        """The reads kept, a row each (in no particular order: the fit takes every pair)."""
        return self.reads[: min(self.count, PACE_KEPT)]

    def add(self, chars: float, prompt_ms: float) -> None:
        """The engine read `chars` of a prompt in `prompt_ms`: fit again."""
        self.reads[self.count % PACE_KEPT] = chars, prompt_ms
        self.count += 1
        self.chars = self.fit()

    def fit(self) -> float | None:
        """The fixed part of a read's ms over the ms a character read takes. Where too few reads
        differ enough in length to tell a fixed part from the rate, none is counted: their time
        is all the rate's. None where reads that were longer were not slower. Every pair of the
        kept reads at once, in numpy: a pair a slope, 496 of them for 32 reads (in Python, a
        fit cost the router more CPU than the rest of the request it was fitted after)."""
        kept = self.kept
        x, y = kept[:, 0], kept[:, 1]
        first, second = _pairs(len(kept))
        dx = x[second] - x[first]
        apart = np.abs(dx) >= np.maximum(APART_CHARS, np.minimum(x[first], x[second]))  # the longer twice the other
        if np.count_nonzero(apart) >= PACE_LEAST:
            rate = _median((y[second] - y[first])[apart] / dx[apart])
            fixed = _median(y - rate * x)
        else:
            rate, fixed = _median(y / x), 0.0
        return max(0.0, fixed) / rate if rate > 0 else None


def _median(values: np.ndarray) -> float:
    """The median, as `statistics.median` takes it (np.median costs ten times as much on a few
    hundred values)."""
    s = np.sort(values)
    return float(s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


@functools.cache
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (i < j) of `n` reads, as two index arrays."""
    return np.triu_indices(n, 1)
