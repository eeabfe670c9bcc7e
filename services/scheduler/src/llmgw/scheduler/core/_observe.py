"""A heartbeat read against the records: what to record, what its agent no longer runs, what it
runs that nobody recorded, and which replicas lost a worker on it."""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from llmgw.proto import Heartbeat, ReplicaState
from llmgw.scheduler.core._plan import AgentStop, Plan
from llmgw.scheduler.core._replica import accept
from llmgw.scheduler.placement import LIVE

__all__ = ["lost", "lost_workers", "observe"]

RUNNING = ("fetching", "starting", "ready")
"""An agent's states of a replica that runs (or is about to)."""


def lost(node: str, reported: set[str], recorded: list[ReplicaState]) -> list[ReplicaState]:
    """Replicas recorded on `node` that its agent took on but no longer reports (it restarted).

    A pending replica may not have reached the agent yet, so only those it acknowledged count.
    """
    return [r for r in recorded if r.node == node and r.state in LIVE and r.state != "pending" and r.id not in reported]


def lost_workers(node: str, reported: set[str], recorded: list[ReplicaState]) -> list[ReplicaState]:
    """Live replicas with a worker on `node` that its agent no longer reports: the worker exited
    (or its agent restarted), so the engine that drives it cannot go on.

    Workers start before their engine, so a replica its engine's agent took on has its workers.
    """
    return [
        r
        for r in recorded
        if r.state in LIVE and r.state != "pending" and r.id not in reported and any(w.node == node for w in r.workers)
    ]


def observe(beat: Heartbeat, recorded: dict[str, ReplicaState], draining: Collection[str], now: float) -> Plan:
    """What one heartbeat means (events can be missed; the heartbeat is the agent's whole truth).

    Each report it carries updates its record; a replica it runs that is neither recorded nor
    being stopped was given up while its node was lost and replaced since: it is stopped, never
    run twice. Recorded replicas it no longer runs are forgotten; workers it runs for no
    recorded replica are stopped; replicas whose worker here it no longer runs have failed.
    """
    plan = Plan()
    node = beat.info.node
    for report in beat.replicas:
        if report.id not in recorded and report.id not in draining and report.state in RUNNING:
            plan.asks.append(AgentStop(node=report.node, id=report.id, reason="replaced while its node was lost"))
        elif state := accept(recorded.get(report.id), report):
            plan.records.append(state)
    now_recorded = [*{**recorded, **{r.id: r for r in plan.records}}.values()]
    plan.forgets = lost(node, {r.id for r in beat.replicas}, now_recorded)
    for rid in sorted(set(beat.workers) - set(recorded) - set(draining)):
        plan.asks.append(AgentStop(node=node, id=rid, reason="its replica is gone", worker=True))
    for broken in lost_workers(node, set(beat.workers), now_recorded):
        why = f"its worker on node '{node}' is gone"
        plan.records.append(msgspec.structs.replace(broken, state="failed", updated=now, error=why))
        plan.asks.append(AgentStop(node=broken.node, id=broken.id, reason=why))
    return plan
