"""Where a try leaves replicas unplaced (capacity binds), an exact placement of those and of the
try's open starts: an integer program over the ways each could go (its model's profile on a node,
of one card class there), solved by HiGHS. First the most replicas, counted by class (one of a
higher class outweighs every one of the lower classes together: a batch model never takes a
critical one's room), then among those placements the most predicted tokens a second.

The program counts each node's free host memory, cores, and free cards of each class; the
filter chain has the last word: the chosen ways are placed one by one (those with more cards,
then more memory, first), each on the cards of its class the agent's rule takes, and where one
is refused nothing changes. The result is kept only where it ranks above what the try had.

Open starts are those `improve` may change: on one node, where no stop of the plan frees room.
A start may take any one-node profile of its model (a counted model's keeps its own); a replica
left unplaced the profiles its try would have tried. HiGHS stops after `NODES` branch-and-bound
nodes (a count, not a clock, so a pass stays deterministic) and uses its best placement found.
Only a pass of at most `Policy.exact` ways asks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from llmgw.proto import Model, Profile, ReplicaState
from llmgw.scheduler.core._improve import relocated
from llmgw.scheduler.core._model import Pass, Wants
from llmgw.scheduler.core._plan import Plan, Start
from llmgw.scheduler.core._rollout import wanted_counts
from llmgw.scheduler.core._status import CLASS_RANK
from llmgw.scheduler.placement import Need, NodeState, Placement, cards_for, claim, fits, release, spans, speed_of

__all__ = ["NODES", "by_class", "exact", "highs"]

NODES = 20_000
"""Branch-and-bound nodes HiGHS explores at most in each of its two stages."""
_FEASIBLE = 2
"""HiGHS's `SolutionStatus.kSolutionStatusFeasible`: a solution that keeps every constraint."""


@dataclass
class _Item:
    """One replica the program places: an open start of the try, or one left unplaced."""

    model: Model
    profiles: tuple[Profile, ...]
    start: Start | None = None
    wants: Wants | None = None
    way: tuple[str, str, str] | None = None
    """An open start's way now: (profile, node, card class)."""


@dataclass(frozen=True)
class _Way:
    """A replica of a group (items of one model with the same profiles) on `profile`, on
    `node`, on cards of class `cls` ("" on the CPU)."""

    group: int
    profile: Profile
    need: Need
    node: str
    cls: str
    tps: float


def exact(plan: Plan, run: Pass) -> bool:
    """Place what the try left unplaced, and its open starts, exactly where that ranks higher
    (`Plan.starts` and the node states changed in place; `run.left`, `run.short` and
    `plan.unplaced` say what is still short). Whether the plan is the pass's best: every start
    was open and HiGHS proved both stages (no other order of the models could rank higher)."""
    items = _items(plan, run)
    if all(item.start is not None for item in items) or run.policy.exact <= 0:
        return False
    opened, left = sum(item.start is not None for item in items), sum(len(e[1]) for e in run.left.values())
    every = opened == len(plan.starts) and len(items) - opened == left  # none left out of the program
    for item in items:
        if item.start is not None:
            release(run.states, item.start.replica)
    groups = _groups(items)
    ways = _ways(groups, run)
    chosen, proved = _solve(groups, ways, run) if ways and len(ways) <= run.policy.exact else (None, False)
    placed = _realize(groups, ways, chosen, run) if chosen else None
    had = [(item, item.start.replica) for item in items if item.start is not None]
    if placed is None or _rank(placed) <= _rank(had):
        for _, replica in placed or ():
            release(run.states, replica)
        for _, replica in had:
            claim(run.states, replica)
    else:
        _apply(placed, items, plan, run)
    return every and proved and placed is not None


def _items(plan: Plan, run: Pass) -> list[_Item]:
    """The try's open starts, then the replicas it left unplaced (their one-node profiles)."""
    freed = {node for stop in plan.stops for node in spans(stop.replica)}
    items = []
    for s in plan.starts:
        r = s.replica
        if s.profile.nodes != 1 or r.node not in run.states or r.node in freed:
            continue
        own = wanted_counts(s.model) is not None
        profiles = (s.profile,) if own else tuple(p for p in _by_priority(s.model) if p.nodes == 1)
        items.append(_Item(s.model, profiles, start=s, way=(s.profile.name, r.node, _class_of(r, run.states))))
    for wants, left, _ in run.left.values():
        for profiles in left:
            ones = tuple(p for p in profiles if p.nodes == 1)
            if ones:
                items.append(_Item(wants.model, ones, wants=wants))
    return items


def _by_priority(model: Model) -> list[Profile]:
    return sorted(model.profiles, key=lambda p: -p.priority)


def _class_of(r: ReplicaState, states: dict[str, NodeState]) -> str:
    """The class of the cards a replica holds ("" for none)."""
    if not r.gpus:
        return ""
    return next((g.cls for g in states[r.node].info.gpus if g.uuid == r.gpus[0]), "")


def _groups(items: list[_Item]) -> list[list[_Item]]:
    """The items by model and profiles (the program counts copies of a way, not replicas)."""
    by: dict[tuple[str, tuple[str, ...]], list[_Item]] = {}
    for item in items:
        by.setdefault((item.model.name, tuple(p.name for p in item.profiles)), []).append(item)
    return list(by.values())


def _view(n: NodeState, cls: str) -> NodeState:
    """Node `n` with only its free cards of class `cls` (itself on the CPU)."""
    if not cls:
        return n
    return msgspec.structs.replace(n, free_cards=[g for g in n.free_cards if g.cls == cls], chosen=None)


def _ways(groups: list[list[_Item]], run: Pass) -> list[_Way]:
    """Every way a group's replica could go, the others not placed: each of its profiles on
    each node (and free card class there) the filter chain passes."""
    ways = []
    stale_s = run.policy.stale_s
    for g, group in enumerate(groups):
        model = group[0].model
        for profile in group[0].profiles:
            need = run.need(model, profile)
            for name, n in run.states.items():
                classes = sorted({c.cls for c in n.free_cards}) if need.cards else [""]
                for cls in classes:
                    view = _view(n, cls)
                    if fits(need, view, run.now, stale_s):
                        ways.append(_Way(g, profile, need, name, cls, round(speed_of(need, view), 1)))
    return ways


def highs():
    """A HiGHS solver that prints nothing once made (imported by the first pass that binds: a
    third of a second). The first one a process makes prints HiGHS's banner on fd 1 before any
    option can stop it: the scheduler's shell hands the pass a maker that hides it."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def _solve(groups: list[list[_Item]], ways: list[_Way], run: Pass) -> tuple[list[int] | None, bool]:
    """How many copies go each way (HiGHS, its two stages), or None where it found none; and
    whether it proved both stages' optimum."""
    import highspy

    h = run.solver()
    h.setOptionValue("mip_max_nodes", NODES)
    y = [h.addIntegral(lb=0, ub=len(groups[w.group])) for w in ways]
    by_group: dict[int, list] = {}
    memory: dict[str, list] = {}
    cores: dict[str, list] = {}
    cards: dict[tuple[str, str], list] = {}
    for v, w in zip(y, ways, strict=True):
        by_group.setdefault(w.group, []).append(v)
        memory.setdefault(w.node, []).append(w.need.memory_mb * v)
        if w.need.profile.cpu_cores:
            cores.setdefault(w.node, []).append(w.need.profile.cpu_cores * v)
        if w.cls:
            cards.setdefault((w.node, w.cls), []).append(w.need.cards * v)
    for g, vs in by_group.items():
        h.addConstr(h.qsum(vs) <= len(groups[g]))
    for node, terms in memory.items():
        h.addConstr(h.qsum(terms) <= max(run.states[node].free_mb, 0))
    for node, terms in cores.items():
        n = run.states[node]
        h.addConstr(h.qsum(terms) <= max(n.info.cpus - n.cores_held, 0))
    for (node, cls), terms in cards.items():
        h.addConstr(h.qsum(terms) <= sum(g.cls == cls for g in run.states[node].free_cards))
    weight = _weights(sum(map(len, groups)))
    count = h.qsum(weight[groups[w.group][0].model.capacity_class] * v for v, w in zip(y, ways, strict=True))
    h.setOptionValue("mip_rel_gap", 0.0)  # a whole count: proved only where none is higher by one
    h.setOptionValue("mip_abs_gap", 0.5)
    h.maximize(count)
    if not _found(h):
        return None, False
    proved = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    first = [round(x) for x in h.vals(y)]
    h.addConstr(count >= round(h.getInfo().objective_function_value))
    h.setOptionValue("mip_rel_gap", 1e-4)  # tokens a second: within a hundredth of a percent
    h.setOptionValue("mip_abs_gap", 1e-6)
    h.maximize(h.qsum(w.tps * v for v, w in zip(y, ways, strict=True)))
    if not _found(h):
        return first, False
    return [round(x) for x in h.vals(y)], proved and h.getModelStatus() == highspy.HighsModelStatus.kOptimal


def _weights(items: int) -> dict[str, int]:
    """What one replica of each class counts for in the program: more than every replica of the
    classes below (`by_class`'s order, as one linear objective)."""
    return {cls: (items + 1) ** rank for cls, rank in CLASS_RANK.items()}


def _found(h) -> bool:
    """Whether HiGHS has a placement: proved best, or the best it found within `NODES`."""
    return h.getInfo().primal_solution_status == _FEASIBLE


def _realize(
    groups: list[list[_Item]], ways: list[_Way], chosen: list[int], run: Pass
) -> list[tuple[_Item, ReplicaState]] | None:
    """The chosen ways placed through the filter chain (claimed in the node states): each
    group's open starts keep their way where it was chosen, the rest of its items take the
    other chosen ways in turn (open starts before those left unplaced). None (and nothing
    claimed) where the chain refuses one."""
    todo: list[tuple[_Way, _Item]] = []
    for g, group in enumerate(groups):
        copies = {i: k for i, k in enumerate(chosen) if k and ways[i].group == g}
        free = []
        for item in group:
            same = (i for i, k in copies.items() if k and item.way == (ways[i].profile.name, ways[i].node, ways[i].cls))
            if (i := next(same, None)) is not None:
                copies[i] -= 1
                todo.append((ways[i], item))
            else:
                free.append(item)
        todo += zip([ways[i] for i, k in copies.items() for _ in range(k)], free, strict=False)
    todo.sort(key=lambda wi: (-wi[0].need.cards, -wi[0].need.memory_mb))
    placed: list[tuple[_Item, ReplicaState]] = []
    for way, item in todo:
        view = _view(run.states[way.node], way.cls)
        if not fits(way.need, view, run.now, run.policy.stale_s):
            for _, r in placed:
                release(run.states, r)
            return None
        if item.start is not None:
            r = relocated(item.start.replica, item.model, way.profile, way.need, view)
        else:
            assert item.wants is not None
            where = Placement(node=way.node, cards=cards_for(way.need, view))
            r = item.wants.replica(way.profile, way.need, where, run, at=view)
        claim(run.states, r)
        placed.append((item, r))
    return placed


def by_class(models: Iterable[Model]) -> tuple[int, ...]:
    """How many replicas of each class, the highest class first: how placements rank before
    their tokens a second (one more of a higher class outranks any number of a lower)."""
    counts = dict.fromkeys(sorted(CLASS_RANK, key=CLASS_RANK.__getitem__, reverse=True), 0)
    for model in models:
        counts[model.capacity_class] += 1
    return tuple(counts.values())


def _rank(placed: list[tuple[_Item, ReplicaState]]) -> tuple[int | float, ...]:
    """How a placement ranks: its replicas by class, then their tokens a second."""
    return (*by_class(item.model for item, _ in placed), sum(r.tokens_per_s or 0.0 for _, r in placed))


def _apply(placed: list[tuple[_Item, ReplicaState]], items: list[_Item], plan: Plan, run: Pass) -> None:
    """Make the plan say the exact placement: each open start its new replica, or no start
    where the placement left it out (a model with more of its replicas placed took its room),
    each replica that was left unplaced and is placed now a start; what is still short stays
    in `run.left` and `run.short`."""
    kept = {id(item.start) for item, _ in placed if item.start is not None}
    dropped = [i.start for i in items if i.start is not None and id(i.start) not in kept]
    if dropped:
        gone = {id(s) for s in dropped}
        plan.starts = [s for s in plan.starts if id(s) not in gone]
        for s in dropped:
            run.short.add(s.model.name)
            plan.unplaced[s.model.name] = (
                f"the fleet's free room holds {len(placed)} of the {len(items)} replicas "
                "this pass starts, placed to start the most (then the most tokens a second): not this one"
            )
    added: dict[str, int] = {}
    for item, r in placed:
        profile = next(p for p in item.profiles if p.name == r.profile)
        if item.start is not None:
            item.start.replica, item.start.profile = r, profile
        else:
            assert item.wants is not None
            item.wants.started(profile, r, plan)
            added[item.model.name] = added.get(item.model.name, 0) + 1
    for name, got in added.items():
        wants, left, started = run.left[name]
        if not started:  # replaced now: the failed records go
            wants.replaced(plan)
        run.left[name] = (wants, left[got:], started + got)
        if got == len(left) and all(s.model.name != name for s in dropped):  # nothing of it missing
            run.short.discard(name)
            plan.unplaced.pop(name, None)
