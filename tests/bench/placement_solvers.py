"""The placement benchmark's placers: llmgw's `reconcile`, best-fit bin-packing, and the optimum
(an integer program solved by HiGHS); where llmgw and the optimum differ."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import highspy
from placement_fleets import NOW, POLICY, Fleet, empty, need_for, passes, way_of, way_tps

from llmgw.proto import Model, ReplicaState
from llmgw.scheduler.core import CLASS_RANK, Actual, Desired, Policy, reconcile
from llmgw.scheduler.placement import Need, NodeState, claim, node_states, place, speed_of
from llmgw.scheduler.solver import quiet_highs

__all__ = ["Way", "best_fit", "difference", "llmgw", "optimum", "ways_of"]


def llmgw(f: Fleet, policy: Policy = POLICY) -> list[ReplicaState]:
    """What one `reconcile` pass from nothing starts."""
    ids = (f"r{i}" for i in itertools.count())
    plan = reconcile(
        Desired(models=f.models),
        Actual(nodes=f.nodes, weights=f.weights, shapes=f.shapes),
        NOW,
        policy,
        ids=ids,
        solver=quiet_highs,  # the scheduler's: HiGHS's banner stays off the table
    )
    return [s.replica for s in plan.starts]


def _room_left(need: Need, state: NodeState, cards: list[str]) -> tuple[int, int]:
    """What the node has left of what the replica takes once it is placed, then the rest."""
    cards_left = sum(g.memory_total_mb for g in state.free_cards if g.uuid not in cards)
    host_left = state.free_mb - need.memory_mb
    return (cards_left, host_left) if need.cards else (host_left, cards_left)


def best_fit(f: Fleet) -> list[ReplicaState]:
    """Bin-packing: the models by class, then name (the order they came in), each replica on the
    first of its profiles that fits anywhere, on the node that passes the scheduler's filters and
    is left with the least room."""
    states = node_states({n: (v.info, v.last_seen, v.weights) for n, v in f.nodes.items()}, [], POLICY.reserve_mb)
    placed = []
    order = sorted(f.models.values(), key=lambda m: (-CLASS_RANK[m.capacity_class], m.name))
    for model in order:
        for k in range(model.scaling.min):
            for profile in sorted(model.profiles, key=lambda p: -p.priority):
                need = need_for(f, model, profile)
                best = None
                for name, state in states.items():
                    if passes(need, state):
                        where, _ = place(need, model, {name: state}, NOW)
                        room = _room_left(need, state, where.cards)
                        if best is None or room < best[0]:
                            best = (room, where)
                if best:
                    where = best[1]
                    r = ReplicaState(
                        id=f"{model.name}-{k}",
                        model=model.name,
                        profile=profile.name,
                        node=where.node,
                        memory_mb=need.memory_mb,
                        cores=profile.cpu_cores or 0,
                        gpus=where.cards,
                        updated=NOW,
                    )
                    claim(states, r)
                    placed.append(r)
                    break
    return placed


@dataclass
class Way:
    model: str
    profile: str
    node: str
    cls: str
    tps: float
    need: Need


def ways_of(f: Fleet) -> list[Way]:
    """Every (model, profile, node, card class) whose replica the node, empty, would take."""
    out = []
    for model in f.models.values():
        for profile in model.profiles:
            need = need_for(f, model, profile)
            for name, view in f.nodes.items():
                classes = sorted({g.cls for g in view.info.gpus}) if need.cards else [""]
                for cls in classes:
                    state = empty(view.info, cls)
                    if passes(need, state):
                        out.append(Way(model.name, profile.name, name, cls, speed_of(need, state), need))
    return out


def optimum(f: Fleet) -> tuple[float, int, dict[tuple[str, str, str, str], int]]:
    """The most tokens a second among the placements of as many replicas as can be placed: the
    total, the replicas placed, and how many copies go each way (model, profile, node, class)."""
    ways = ways_of(f)
    h = quiet_highs()  # the scheduler's maker: HiGHS's banner stays off the table
    h.setOptionValue("mip_rel_gap", 1e-7)
    h.setOptionValue("time_limit", 60.0)
    y = [h.addIntegral(lb=0, ub=f.models[w.model].scaling.min) for w in ways]
    by_model, by_node, by_cards = {}, {}, {}
    for v, w in zip(y, ways, strict=True):
        by_model.setdefault(w.model, []).append(v)
        by_node.setdefault(w.node, []).append((v, w))
        if w.cls:
            by_cards.setdefault((w.node, w.cls), []).append((v, w))
    for name, vs in by_model.items():
        h.addConstr(h.qsum(vs) <= f.models[name].scaling.min)
    for name, vws in by_node.items():
        info = f.nodes[name].info
        h.addConstr(h.qsum(w.need.memory_mb * v for v, w in vws) <= info.memory_available_mb - POLICY.reserve_mb)
        h.addConstr(h.qsum((w.need.profile.cpu_cores or 0) * v for v, w in vws) <= info.cpus)
    for (name, cls), vws in by_cards.items():
        count = sum(g.cls == cls for g in f.nodes[name].info.gpus)
        h.addConstr(h.qsum(w.need.cards * v for v, w in vws) <= count)
    count = h.qsum(y)
    h.maximize(count)
    _proved(h, "the most replicas")
    placed = round(h.getInfo().objective_function_value)
    h.addConstr(count >= placed)
    h.maximize(h.qsum(w.tps * v for v, w in zip(y, ways, strict=True)))
    _proved(h, "the most tokens a second")
    values = h.vals(y)
    chosen = {(w.model, w.profile, w.node, w.cls): round(x) for w, x in zip(ways, values, strict=True) if round(x)}
    return h.getInfo().objective_function_value, placed, chosen


def _proved(h: highspy.Highs, stage: str) -> None:
    """Raise unless HiGHS proved the stage's optimum (a time limit or a gap would make it a guess)."""
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"HiGHS did not prove {stage}: {h.modelStatusToString(h.getModelStatus())}")


def difference(f: Fleet, placed: list[ReplicaState], best: dict[tuple[str, str, str, str], int]) -> list[str]:
    """Where llmgw's placement and the optimum's differ, model by model, with each way's tokens a second."""
    ours: dict[tuple[str, str, str, str], int] = {}
    for r in placed:
        ours[way_of(f, r)] = ours.get(way_of(f, r), 0) + 1

    def say(model: Model, ways: dict[tuple[str, str, str, str], int]) -> str:
        return ", ".join(
            f"{n}x {p}@{node}{'/' + cls if cls else ''} {way_tps(f, model, p, node, cls):.0f}"
            for (_, p, node, cls), n in sorted(ways.items())
        )

    lines = []
    for name in sorted(f.models):
        a = {k: n for k, n in ours.items() if k[0] == name}
        b = {k: n for k, n in best.items() if k[0] == name}
        if a != b:
            m = f.models[name]
            lines.append(f"  {name} ({m.source.split('/')[1]}): llmgw {say(m, a) or '-'} | optimum {say(m, b) or '-'}")
    return lines
