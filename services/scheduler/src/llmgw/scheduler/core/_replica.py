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
    leader adopted: its stop is finished, never forgotten), or nothing new said."""
    if known is None or report.state == "stopped" or known.state in ("failed", "draining"):
        return None
    if (known.state, known.url, known.error) == (report.state, report.url, report.error):
        return None
    return merge(spec_of(known), report)
