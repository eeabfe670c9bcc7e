"""A replica's spec (the scheduler's) and report (its agent's) merged into the record the
replicas bucket holds, and the rule for which reports change a record."""

from __future__ import annotations

from llmgw.proto import ReplicaReport, ReplicaSpec, ReplicaState

__all__ = ["accept", "merge", "spec_of"]

_SPEC = ReplicaSpec.__struct_fields__
_REPORT = tuple(f for f in ReplicaReport.__struct_fields__ if f not in _SPEC)
"""What a report says that a spec does not (its identity is the spec's)."""


def merge(spec: ReplicaSpec, report: ReplicaReport | None) -> ReplicaState:
    """The record of a replica: everything its spec says (the engine's key included: the
    router needs it) and its agent's latest word on how it is doing; none yet: pending."""
    fields = {f: getattr(spec, f) for f in _SPEC}
    if report is not None:
        fields.update({f: getattr(report, f) for f in _REPORT})
    return ReplicaState(**fields)


def spec_of(state: ReplicaState) -> ReplicaSpec:
    """What the scheduler decided of a recorded replica: what an agent is sent to start it."""
    return ReplicaSpec(**{f: getattr(state, f) for f in _SPEC})


def accept(known: ReplicaState | None, report: ReplicaReport) -> ReplicaState | None:
    """The record after an agent's report, or None where the report changes nothing: a replica
    not recorded (not ours, or gone), a stop (the reconcile pass decides what follows), one
    already failed (replaced, never revived), one being stopped (a stored draining record a new
    leader adopted: its stop is finished, never forgotten), or nothing new said (its measured memory
    moving a little is not news)."""
    if known is None or report.state == "stopped" or known.state in ("failed", "draining"):
        return None
    same = (known.state, known.url, known.error) == (report.state, report.url, report.error)
    if same and not _moved(known.measured_mb, report.measured_mb):
        return None
    return merge(spec_of(known), report)


MEASURE_STEP_MB = 64
"""A measured memory moved by less than this (and less than a twentieth) is not written again."""


def _moved(was: int, now: int) -> bool:
    """Whether a replica's measured memory moved enough to record: first measured, or by more
    than a twentieth and `MEASURE_STEP_MB` (an engine's RSS wanders a little every heartbeat)."""
    if (was == 0) != (now == 0):
        return True
    return abs(now - was) >= max(MEASURE_STEP_MB, was // 20)
