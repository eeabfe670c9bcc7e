"""Placement and reconcile, pure: no I/O and no clock (`now` is passed in)."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from llmgw.proto import Model, NodeInfo, Profile, ReplicaState, fingerprint

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
          stale_s: float, reserve_mb: int, freed: dict[str, int] | None = None) -> tuple[str | None, str]:
    """The node with the most memory left after `need_mb`, or None and each node's reason.

    `freed` is memory that running replicas stopped in this same plan give back, by node
    (the shell stops them before it starts anything).
    """
    reasons, best, best_free = [], None, -1
    for name, view in sorted(nodes.items()):
        if now - view.last_seen > stale_s:
            reasons.append(f"{name}: no heartbeat for {now - view.last_seen:.0f}s")
            continue
        # Replicas still starting have not taken their memory yet; count their claim.
        claimed = sum(r.memory_mb for r in replicas if r.node == name and r.state in STARTING)
        free = view.info.memory_available_mb + (freed or {}).get(name, 0) - claimed - reserve_mb
        if free < need_mb:
            reasons.append(f"{name}: needs {need_mb} MiB, {max(free, 0)} MiB free")
            continue
        if free > best_free:
            best, best_free = name, free
    return best, "; ".join(reasons) or "no nodes registered"


def _surplus(model: Model, want: int, stale: list[ReplicaState], fresh: list[ReplicaState]) -> list[Stop]:
    """Replicas to stop: stale ones whose replacements are ready, then any beyond `want`.

    Stale replicas are replaced one at a time. With a surge rollout a stale replica stops only
    once a fresh one stands ready for it; in place, one stale replica stops while no fresh one
    is starting, and its replacement starts after it.
    """
    stops = []
    ready = sum(r.state == "ready" for r in fresh)
    starting = len(fresh) - ready
    extra = max(0, ready + len(stale) - want)
    if model.rollout == "in-place" and stale and not starting and len(fresh) + len(stale) >= want:
        extra = max(extra, 1)  # only at full strength: a failed replacement never takes a second one down
    for r in stale[:extra]:
        stops.append(Stop(replica=r, reason="stale (context, cards, engine or a restart): replaced one at a time"))
    over = max(0, len(fresh) - want)  # the newest go first, those still starting before the ready
    by_age = sorted(fresh, key=lambda r: (r.state == "ready", -r.updated))
    for r in by_age[:over]:
        stops.append(Stop(replica=r, reason=f"model '{model.name}' runs {len(fresh)}, wants {want}"))
    return stops


def reconcile(models: dict[str, Model], nodes: dict[str, NodeView], replicas: list[ReplicaState],
              weights: dict[str, int], now: float, ids: Iterator[str],
              stale_s: float = 10.0, reserve_mb: int = 512) -> Plan:
    """Compare what the catalog asks with what runs; say what to start and stop.

    `weights` maps a source to its size in bytes (absent: the mirror does not hold it).
    """
    plan = Plan()
    placed = list(replicas)
    for r in replicas:
        if r.state == "draining":  # left by a scheduler that stopped halfway: finish the stop
            plan.stops.append(Stop(replica=r, reason="it was being stopped"))
        elif r.model not in models:
            plan.stops.append(Stop(replica=r, reason=f"model '{r.model}' was removed from the catalog"))
    for name, model in sorted(models.items()):
        mine = [r for r in replicas if r.model == name]
        failed = sorted((r for r in mine if r.state == "failed"), key=lambda r: r.updated)
        want = model.scaling.min
        current = {p.name: fingerprint(model, p) for p in model.profiles}
        live = [r for r in mine if r.state in LIVE]
        stale = sorted((r for r in live if current.get(r.profile) != r.fingerprint), key=lambda r: r.updated)
        fresh = [r for r in live if r not in stale]
        stops = _surplus(model, want, stale, fresh)
        plan.stops.extend(stops)
        running = len(live) - len(stops)
        missing = want - running
        if stale and want and not any(r.state != "ready" for r in fresh) and len(fresh) < want <= running:
            missing += 1  # surge: the replacement starts beside the stale replica it replaces
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
        stopping = {s.replica.id for s in stops}
        placed = [r for r in placed if r.id not in stopping]
        freed: dict[str, int] = {}
        for stop in stops:
            if stop.replica.state == "ready":
                freed[stop.replica.node] = freed.get(stop.replica.node, 0) + stop.replica.memory_mb
        started = 0
        for _ in range(missing):
            node, why = place(need, nodes, placed, now, stale_s, reserve_mb, freed)
            if node is None:
                surge = " (a replacement starts beside the replica it replaces; `--in-place` stops that one first)"
                plan.unplaced[name] = why + (surge if stale and model.rollout == "surge" else "")
                break
            replica = ReplicaState(id=next(ids), model=name, profile=profile.name, node=node, memory_mb=need,
                                   failures=failures, fingerprint=current[profile.name], updated=now)
            placed.append(replica)
            plan.starts.append(Start(replica=replica, model=model, profile=profile))
            started += 1
        if started:  # replaced now: the failed records go
            plan.stops.extend(Stop(replica=r, reason="replaced after failure") for r in failed)
    return plan
