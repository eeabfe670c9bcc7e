"""Placement and reconcile, pure: no I/O and no clock (`now` is passed in)."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from llmgw.proto import Model, NodeInfo, Profile, ReplicaState

__all__ = ["NodeView", "Plan", "Start", "Stop", "backoff_s", "lost", "memory_need_mb", "place", "reconcile"]

LIVE = ("pending", "fetching", "starting", "ready")
STARTING = ("pending", "fetching", "starting")


class NodeView(msgspec.Struct, kw_only=True):
    """A node as the inventory knows it."""

    info: NodeInfo
    last_seen: float
    """Unix time of its last heartbeat or registration."""


class Start(msgspec.Struct, kw_only=True):
    """Start this replica."""

    replica: ReplicaState
    model: Model
    profile: Profile


class Stop(msgspec.Struct, kw_only=True):
    """Stop this replica, for this reason."""

    replica: ReplicaState
    reason: str


class Plan(msgspec.Struct, kw_only=True):
    """What to do now, and why a model could not be placed."""

    starts: list[Start] = msgspec.field(default_factory=list)
    stops: list[Stop] = msgspec.field(default_factory=list)
    unplaced: dict[str, str] = msgspec.field(default_factory=dict)
    """Model name -> why no node took it (each node's reason)."""


def memory_need_mb(profile: Profile, weights_bytes: int) -> int:
    """Host memory a CPU replica claims: the profile's figure, else the weights plus 10% and 256 MiB."""
    if profile.host_memory_mb is not None:
        return profile.host_memory_mb
    return int(weights_bytes * 1.1 / 2**20) + 256


def backoff_s(failures: int, base: float = 5.0, cap: float = 300.0) -> float:
    """Seconds to wait before replacing a model's replica after `failures` failures in a row."""
    return min(cap, base * 2 ** max(0, failures - 1))


def lost(node: str, reported: set[str], recorded: list[ReplicaState]) -> list[ReplicaState]:
    """Replicas recorded on `node` that its agent took on but no longer reports (it restarted).

    A pending replica may not have reached the agent yet, so only those it acknowledged count.
    """
    return [r for r in recorded if r.node == node and r.state in LIVE and r.state != "pending" and r.id not in reported]


def place(need_mb: int, nodes: dict[str, NodeView], replicas: list[ReplicaState], now: float,
          stale_s: float, reserve_mb: int) -> tuple[str | None, str]:
    """The node with the most memory left after `need_mb`, or None and each node's reason."""
    reasons, best, best_free = [], None, -1
    for name, view in sorted(nodes.items()):
        if now - view.last_seen > stale_s:
            reasons.append(f"{name}: no heartbeat for {now - view.last_seen:.0f}s")
            continue
        # Replicas still starting have not taken their memory yet; count their claim.
        claimed = sum(r.memory_mb for r in replicas if r.node == name and r.state in STARTING)
        free = view.info.memory_available_mb - claimed - reserve_mb
        if free < need_mb:
            reasons.append(f"{name}: needs {need_mb} MiB, {max(free, 0)} MiB free")
            continue
        if free > best_free:
            best, best_free = name, free
    return best, "; ".join(reasons) or "no nodes registered"


def reconcile(models: dict[str, Model], nodes: dict[str, NodeView], replicas: list[ReplicaState],
              weights: dict[str, int], now: float, ids: Iterator[str],
              stale_s: float = 10.0, reserve_mb: int = 512) -> Plan:
    """Compare what the catalog asks with what runs; say what to start and stop.

    `weights` maps a source to its size in bytes (absent: the mirror does not hold it).
    """
    plan = Plan()
    placed = list(replicas)
    for r in replicas:
        if r.model not in models:
            plan.stops.append(Stop(replica=r, reason=f"model '{r.model}' was removed from the catalog"))
    for name, model in sorted(models.items()):
        mine = [r for r in replicas if r.model == name]
        live = [r for r in mine if r.state in LIVE]
        failed = sorted((r for r in mine if r.state == "failed"), key=lambda r: r.updated)
        want = model.scaling.min
        for r in sorted(live, key=lambda r: r.updated, reverse=True)[: max(0, len(live) - want)]:
            plan.stops.append(Stop(replica=r, reason=f"model '{name}' runs {len(live)}, wants {want}"))
        missing = want - len(live)
        if missing <= 0:
            continue
        failures = max((r.failures + 1 for r in failed), default=0)
        if failed and now < failed[-1].updated + backoff_s(failures):
            wait = failed[-1].updated + backoff_s(failures) - now
            plan.unplaced[name] = f"backing off after {failures} failures, next try in {wait:.0f}s: {failed[-1].error}"
            continue
        if model.source not in weights:
            plan.unplaced[name] = f"the mirror has not confirmed it holds '{model.source}'"
            continue
        profile = model.profiles[0]
        need = memory_need_mb(profile, weights[model.source])
        started = 0
        for _ in range(missing):
            node, why = place(need, nodes, placed, now, stale_s, reserve_mb)
            if node is None:
                plan.unplaced[name] = why
                break
            replica = ReplicaState(id=next(ids), model=name, profile=profile.name, node=node,
                                   memory_mb=need, failures=failures, updated=now)
            placed.append(replica)
            plan.starts.append(Start(replica=replica, model=model, profile=profile))
            started += 1
        if started:  # replaced now: the failed records go
            plan.stops.extend(Stop(replica=r, reason="replaced after failure") for r in failed)
    return plan
