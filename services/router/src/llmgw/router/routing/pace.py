"""What an engine's own timings say a request weighs there, pure: the time it takes reading a
prompt fitted as a fixed part and a part a character, so the balancer can weigh a request in
flight in the same unit as a prompt's characters still to read."""

from __future__ import annotations

import statistics
from collections import deque

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

    __slots__ = ("chars", "kept")

    def __init__(self) -> None:
        self.kept: deque[tuple[float, float]] = deque(maxlen=PACE_KEPT)
        self.chars: float | None = None
        """What a request weighs there, in characters read (`fit`); None: no fit yet."""

    def add(self, chars: float, prompt_ms: float) -> None:
        """The engine read `chars` of a prompt in `prompt_ms`: fit again."""
        self.kept.append((chars, prompt_ms))
        self.chars = self.fit()

    def fit(self) -> float | None:
        """The fixed part of a read's ms over the ms a character read takes. Where too few reads
        differ enough in length to tell a fixed part from the rate, none is counted: their time
        is all the rate's. None where reads that were longer were not slower."""
        kept = list(self.kept)
        slopes = [
            (y2 - y1) / (x2 - x1)
            for i, (x1, y1) in enumerate(kept)
            for x2, y2 in kept[i + 1 :]
            if abs(x2 - x1) >= max(APART_CHARS, min(x1, x2))  # the longer twice the other, and more
        ]
        if len(slopes) >= PACE_LEAST:
            rate = statistics.median(slopes)
            fixed = statistics.median(y - rate * x for x, y in kept)
        else:
            rate, fixed = statistics.median(y / x for x, y in kept), 0.0
        return max(0.0, fixed) / rate if rate > 0 else None
