"""How many more replicas of each of a model's profiles the fleet would take now, and how many
with the room of every lower capacity class taken (what preemption could free), without I/O.

Counted by placing them one after another on a copy of the fleet's free room, as a pass would
(the same filters, claims and needs), up to `MOST_COUNTED`.
"""

from __future__ import annotations

from llmgw.proto import Model, Profile, ReplicaState
from llmgw.proto.scheduler import ProfileRoom
from llmgw.scheduler.core._plan import Actual, Policy
from llmgw.scheduler.core._status import CLASS_RANK
from llmgw.scheduler.placement import Need, NodeState, Search, claim, hold, need_for, node_states, place, release

__all__ = ["MOST_COUNTED", "room_left"]

MOST_COUNTED = 64
"""Counting stops here: a profile that fits this many more fits "at least" as many."""


def _states(actual: Actual, policy: Policy) -> dict[str, NodeState]:
    nodes = {n: (v.info, v.last_seen, v.weights) for n, v in actual.nodes.items()}
    states = node_states(nodes, actual.replicas, policy.reserve_mb)
    for r in actual.stopping:
        hold(states, r)
    return states


def _count(need: Need, model: Model, states: dict[str, NodeState], now: float, policy: Policy) -> tuple[int, str]:
    """Replicas of `need` placed one after another on `states` (changed), and why the next was not."""
    how = Search(stale_s=policy.stale_s, weights=policy.scoring)
    for placed in range(MOST_COUNTED):
        where, why = place(need, model, states, now, how)
        if where is None:
            return placed, "; ".join(f"{n}: {w}" for n, w in why.items()) or "no nodes registered"
        replica = ReplicaState(
            id=f"room-{placed}",
            model=model.name,
            profile=need.profile.name,
            node=where.node,
            memory_mb=need.memory_mb,
            cores=need.profile.cpu_cores or 0,
            gpus=where.cards,
            workers=where.workers,
            state="pending",
        )
        claim(states, replica)
    return MOST_COUNTED, ""


def _lower(model: Model, models: dict[str, Model], states: dict[str, NodeState]) -> list[ReplicaState]:
    """The live replicas of models of a lower capacity class than `model`'s, each once."""
    rank = CLASS_RANK[model.capacity_class]
    found = {
        r.id: r
        for n in states.values()
        for r in n.replicas
        if r.model in models and r.model != model.name and CLASS_RANK[models[r.model].capacity_class] < rank
    }
    return list(found.values())


def _profile_room(
    model: Model, profile: Profile, actual: Actual, models: dict[str, Model], now: float, policy: Policy
) -> ProfileRoom:
    if model.source not in actual.weights:
        why = "its file's size is not known yet (the mirror has not confirmed it holds the file)"
        return ProfileRoom(profile=profile.name, why=why)
    need = need_for(model, profile, actual.weights, actual.shapes)
    more, why = _count(need, model, _states(actual, policy), now, policy)
    freed = _states(actual, policy)
    for victim in _lower(model, models, freed):
        release(freed, victim)
    preempting, _ = _count(need, model, freed, now, policy)
    return ProfileRoom(
        profile=profile.name,
        more_now=more,
        more_preempting=max(preempting, more),
        most=MOST_COUNTED,
        why="" if more else why,
    )


def room_left(model: Model, actual: Actual, models: dict[str, Model], now: float, policy: Policy) -> list[ProfileRoom]:
    """Each profile of `model`: how many more replicas the fleet takes now, and with every lower
    class's replicas stopped (`models`: the catalog, for their classes); where none, why."""
    return [_profile_room(model, p, actual, models, now, policy) for p in model.profiles]
