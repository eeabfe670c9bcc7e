"""Reconcile, pure: no I/O and no clock (`now` is passed in). Placement is `placement`'s chain.

Nomad's shape: the replicas grouped by model, one function per model over the room the models
before it left, their plans merged. Higher classes go first, so a critical model takes room
before a batch one asks for it; within a class, the models that read least a token (a replica's
speed is its node's bandwidth over those bytes, so a fast node gains a light model most), then
by name. Where that order leaves a replica unplaced, a small try moves starts off a node to
make room for it (`make_room`: each to another node, on its own profile or else its model's
next); and the pass is tried again with those models first, each on the slowest room that fits
it (up to `policy.tries` tries), and the try that starts the most replicas, counted by class
from the highest (then the most tokens a second), is the plan: a light model takes the fast
room, but not a heavy one's only room. Where a try still leaves replicas unplaced, they and its
starts are placed exactly (`exact`: an integer program, the most replicas by class, then the
most tokens a second); one it proves best ends the tries. A small try's starts are then
improved by moves and trades where the tokens a second rise (`improve`).

For every model: stop replicas of removed models and those left draining; replace stale
replicas (another fingerprint) one at a time; keep each counted profile at its count, starting
those short before stopping those over so a change of split never runs fewer; otherwise keep
the scaling's number, each new replica on the highest-priority profile that fits, taking a
lower class's room where nothing else would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from llmgw.proto import Model, ReplicaState
from llmgw.scheduler.core._exact import by_class, exact, highs
from llmgw.scheduler.core._hearing import silence
from llmgw.scheduler.core._improve import improve
from llmgw.scheduler.core._model import Pass, for_model, repair, settled
from llmgw.scheduler.core._plan import Actual, Desired, Plan, Policy, Stop
from llmgw.scheduler.core._rollout import fingerprints
from llmgw.scheduler.core._status import CLASS_RANK
from llmgw.scheduler.placement import (
    LIVE,
    NodeState,
    hold,
    node_states,
    release,
    spans,
)

__all__ = ["reconcile"]

_REMOVED: Mapping[str, str] = MappingProxyType({})
"""The fingerprints of a model not in the catalog: none (its replicas are stopped)."""


def reconcile(
    desired: Desired,
    actual: Actual,
    now: float,
    policy: Policy = Policy(),
    *,
    ids: Iterator[str],
    solver: Callable[[], Any] = highs,
) -> Plan:
    """Compare what the catalog asks with what runs; say what to start and stop.

    A node silent for `policy.stale_s` (suspect) gets nothing new; silent for `policy.lost_s`
    (lost) its replicas are given up and replaced elsewhere; silence counts only while the
    scheduler could hear (`actual.deaf_s`: not while away from NATS or hearing no node). A node
    never heard of counts as lost once the inventory has been listening (`actual.known_since`)
    for `lost_s`. An on-demand model runs while asked for within its idle timeout. New replicas
    take their ids from `ids`, and a pass where capacity binds its HiGHS solvers from `solver`
    (the shell's keeps HiGHS's banner off its stdout). Replicas being stopped (`actual.stopping`)
    hold their room until they stopped; a ready one stopped now drains for `policy.drain_s`, and
    a start waits for the stops of this plan on its nodes.
    """
    silent, lost_s = _Silences(actual, now), policy.lost_s
    lost_nodes = silent.past(lost_s)
    unheard_lost = silent.unheard > lost_s  # a node never heard of is lost too
    # One walk over the replicas, each read once: a steady pass at 10,000 is bound by the
    # memory it reads. It finds the lost, those to stop, each model's replicas, and the models
    # with one not live or not of its profile's fingerprint now (`unsettled`).
    early: list[Stop] = []
    later: list[Stop] = []
    by_model: dict[str, list[ReplicaState]] = {}
    current_of: dict[str, Mapping[str, str]] = {}  # model -> its profiles' fingerprints now
    unsettled: set[str] = set()
    for r in actual.replicas:
        lost = None
        # `_lost` is asked only of a live replica across nodes or on a node silent too long
        if r.state in LIVE and (r.workers or r.node in lost_nodes or (unheard_lost and r.node not in actual.nodes)):
            lost = _lost(r, silent, lost_s)
        if lost is not None:
            early.append(lost)
            continue
        by_model.setdefault(r.model, []).append(r)
        current = current_of.get(r.model)
        if current is None:
            model = desired.models.get(r.model)
            current = current_of[r.model] = _REMOVED if model is None else fingerprints(model)
        if r.state not in LIVE or current.get(r.profile) != r.fingerprint:
            unsettled.add(r.model)
        if r.state == "draining":  # left by a scheduler that stopped halfway: finish the stop
            later.append(Stop(replica=r, reason="it was being stopped"))
        elif current is _REMOVED:
            later.append(Stop(replica=r, reason=f"model '{r.model}' was removed from the catalog"))
    replicas = actual.replicas  # those not on lost nodes: most passes, all
    if early:
        gone = {id(stop.replica) for stop in early}
        replicas = [r for r in actual.replicas if id(r) not in gone]
    early += later
    # those running as they should have no part in any try: only the others are ordered and run
    moving = {
        n: m
        for n, m in desired.models.items()
        if n in unsettled or not settled(m, len(by_model.get(n, ())), now, desired.demand)
    }
    fleet = _Fleet(desired, actual, now, policy, early, replicas, by_model, silent, moving, solver)
    drawn: list[str] = []
    first: set[str] = set()
    best: Plan | None = None
    for _ in range(max(policy.tries, 1)):
        plan, short, final = _try(fleet, first, _replay(ids, drawn))
        if best is None or _worth(plan) > _worth(best):
            best = plan
        if final or short <= first or not plan.starts:  # proved best, nothing new to put first, or
            break  # no start took room from it
        first |= short
    _order(best, policy.drain_s)
    return best


@dataclass
class _Fleet:
    """What every try of a pass starts from: the catalog, the fleet, and the stops made first."""

    desired: Desired
    actual: Actual
    now: float
    policy: Policy
    early: list[Stop]
    """Replicas on lost nodes, left draining, or of removed models."""
    replicas: list[ReplicaState]
    """Those not on lost nodes."""
    by_model: dict[str, list[ReplicaState]]
    silent: _Silences
    """Each node's silence now, when asked."""
    moving: dict[str, Model]
    """The models not running as they should (a replica not live or not current, or `settled`
    says no): the only ones a try takes in turn."""
    solver: Callable[[], Any]
    """Makes the HiGHS solver of a try where capacity binds (`exact`)."""


def _try(fleet: _Fleet, first: set[str], ids: Iterator[str]) -> tuple[Plan, set[str], bool]:
    """One try of the pass from the fleet as it is, the models in `first` first: its plan, the
    models it left short, and whether no other try could rank higher (`exact` proved it)."""
    desired, actual, now, policy = fleet.desired, fleet.actual, fleet.now, fleet.policy
    plan = Plan(stops=list(fleet.early))

    def view() -> dict[str, NodeState]:
        # One view of every node's free room for the whole pass, kept as replicas stop and start
        # (made only where a model places or stops one); a node is heard of last as long ago as
        # its silence (`health`'s rule: suspect past stale_s).
        silent = fleet.silent
        nodes = {n: (v.info, now - silent(n), v.weights) for n, v in actual.nodes.items()}
        states = node_states(nodes, fleet.replicas, policy.reserve_mb)
        for r in actual.stopping:
            hold(states, r)
        for stop in fleet.early:  # the stops made after free their room themselves
            if stop.replica.state in LIVE:
                release(states, stop.replica)
        return states

    run = Pass(
        desired.models, desired.demand, actual.weights, actual.shapes, now, policy, ids, view, fleet.solver, first=first
    )
    for name, model in sorted(fleet.moving.items(), key=lambda kv: _turn(kv[1], actual, first)):
        plan.absorb(for_model(model, fleet.by_model.get(name, []), run))
    repair(plan, run)
    final = any(left for _, left, _ in run.left.values()) and exact(plan, run)
    if plan.starts:
        improve(plan, run.states, now, policy, actual.weights, actual.shapes)
    return plan, run.short, final


def _turn(model: Model, actual: Actual, first: set[str]) -> tuple[int, bool, int, str]:
    """When a model is placed in a try: its class (higher first); those put first; the bytes a
    token reads (fewest first); its name."""
    shape = actual.shapes.get(model.source)
    read = shape.active_bytes if shape is not None else actual.weights.get(model.source, 0)
    return (-CLASS_RANK[model.capacity_class], model.name not in first, read, model.name)


def _worth(plan: Plan) -> tuple[int | float, ...]:
    """How a try's plan ranks: replicas started of each class (the highest first), then their
    predicted tokens a second."""
    return (*by_class(s.model for s in plan.starts), sum(s.replica.tokens_per_s or 0.0 for s in plan.starts))


def _replay(ids: Iterator[str], drawn: list[str]) -> Iterator[str]:
    """The ids an earlier try drew (`drawn`), in order, then new ones from `ids` (kept in `drawn`)."""
    for i in itertools.count():
        if i == len(drawn):
            drawn.append(next(ids))
        yield drawn[i]


def _order(plan: Plan, drain_s: float) -> None:
    """When each stop and start of the plan happens. A reachable ready replica that drains gets
    `drain_s` for its in-flight requests; any other stops at once. A start waits for the stops
    of the plan that free room it may take: those at once on its nodes, and those draining
    whose cards it takes (an agent refuses cards still held)."""
    stopped: dict[str, list[tuple[Stop, set[str]]]] = {}
    for stop in plan.stops:
        r = stop.replica
        if stop.drain and stop.reachable and r.state == "ready":
            stop.grace_s = drain_s
        for node in spans(r):
            stopped.setdefault(node, []).append((stop, _cards(r)))
    for start in plan.starts:
        cards = _cards(start.replica)
        waits = (
            stop.replica.id
            for node in spans(start.replica)
            for stop, held in stopped.get(node, [])
            if not stop.grace_s or held & cards
        )
        start.after = list(dict.fromkeys(waits))


def _cards(r: ReplicaState) -> set[str]:
    """Every card a replica holds, on each of its nodes."""
    return {*r.gpus, *(g for w in r.workers for g in w.gpus)}


class _Silences:
    """Each node's silence now: the time since it was last heard less the time the scheduler was
    deaf since (`silence`, `Hearing`); a node never heard of has been silent `unheard`, the time
    the inventory has listened. Worked out when asked: a steady pass asks only which nodes are
    silent too long (a set, most passes empty), not every node's silence in a dict."""

    def __init__(self, actual: Actual, now: float) -> None:
        self.nodes, self.now, self.deaf_s = actual.nodes, now, actual.deaf_s
        self.unheard = silence(actual.known_since, actual.known_deaf_s, now, actual.deaf_s)

    def __call__(self, node: str) -> float:
        v = self.nodes.get(node)
        return self.unheard if v is None else silence(v.last_seen, v.deaf_s, self.now, self.deaf_s)

    def past(self, limit_s: float) -> set[str]:
        """The nodes heard of that have been silent longer than `limit_s`."""
        now, deaf_s = self.now, self.deaf_s
        return {n for n, v in self.nodes.items() if silence(v.last_seen, v.deaf_s, now, deaf_s) > limit_s}


def _lost(r: ReplicaState, silent: _Silences, lost_s: float) -> Stop | None:
    """The stop of a live replica on a lost node, silent past `lost_s` (one across nodes is lost
    with any of them), or None."""
    worst = max(spans(r), key=silent) if r.workers else r.node
    if (longest := silent(worst)) <= lost_s:
        return None
    why = f"node '{worst}' lost: no heartbeat for {longest:.0f}s"
    return Stop(replica=r, reason=why, reachable=silent(r.node) <= lost_s)
