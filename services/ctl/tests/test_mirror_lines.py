"""`llmgw ctl mirror add`'s progress as plain lines (a log, a pipe): no '0 B/s' before a rate is
known, and an event that arrives after a later one prints nothing (both seen by a newcomer)."""

import io

from llmgw.ctl.mirror_commands import _Lines, progress_line
from llmgw.proto import MirroredRepo

C = "a" * 40


def _at(done: int, rate: float, state: str = "fetching") -> MirroredRepo:
    return MirroredRepo(
        repo="o/r", commit=C, revision="main", origin="hub", state=state, size=1000, done=done, rate=rate, eta_s=5.0
    )


def test_a_fetch_without_a_rate_yet_says_so_not_zero_bytes_a_second():
    assert progress_line(_at(0, 0.0)).endswith("(0%), measuring the rate")
    assert "0 B/s" not in progress_line(_at(0, 0.0))
    assert ", 100 B/s, 5 s left" in progress_line(_at(200, 100.0))


def test_a_late_event_prints_nothing():
    out = io.StringIO()
    lines = _Lines(out)
    lines.show(_at(500, 100.0))
    lines.last = 0.0  # as if the line's few seconds had passed
    lines.show(_at(300, 100.0))  # sent before the one above, arrived after it
    lines.show(_at(1000, 0.0, "ready"))
    printed = out.getvalue().splitlines()
    said = [p.split(": ", 1)[1].split(" (")[0] for p in printed]
    assert said == ["fetching 500 B of 1.0 kB", "ready 1.0 kB of 1.0 kB"]
