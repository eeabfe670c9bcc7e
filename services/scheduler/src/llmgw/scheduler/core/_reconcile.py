"""Reconcile, pure: no I/O and no clock (`now` is passed in). Placement is `placement`'s chain.

Nomad's shape: the replicas grouped by model, one function per model over the room the models
before it left, their plans merged. Higher classes go first, so a critical model takes room
before a batch one asks for it; within a class, the models that read least a token (a replica's
speed is its node's bandwidth over those bytes, so a fast node gains a light model most), then
by name. Where that order leaves a replica unplaced, a small try moves starts off a node to
make room for it (`make_room`: each to another node, on its own profile or else its model's
next); and the pass is tried again with those models first, each on the slowest room that fits
it (up to `policy.tries` tries), and the try that starts the most replicas (then the most
tokens a second) is the plan: a light model takes the fast room, but not a heavy one's only
room. A small try's starts are then improved by moves and trades where the tokens a second
rise (`improve`).

For every model: stop replicas of removed models and those left draining; replace stale
replicas (another fingerprint) one at a time; keep each counted profile at its count, starting
those short before stopping those over so a change of split never runs fewer; otherwise keep
the scaling's number, each new replica on the highest-priority profile that fits, taking a
lower class's room where nothing else would.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgspec

from llmgw.modelplan import Shape
from llmgw.proto import Model, Profile, ReplicaState
from llmgw.scheduler.core._hearing import silence
from llmgw.scheduler.core._improve import improve, make_room
from llmgw.scheduler.core._plan import Actual, Desired, Plan, Policy, Start, Stop
from llmgw.scheduler.core._rollout import fingerprint_of, surplus, wanted_counts, wanted_profiles
from llmgw.scheduler.core._status import CLASS_RANK, backoff_s, wanted
from llmgw.scheduler.placement import (
    LIVE,
    Index,
    Need,
    NodeState,
    Placement,
    Search,
    claim,
    hold,
    need_of,
    node_states,
    place,
    release,
    spans,
    speed_of,
)

__all__ = ["reconcile"]


@dataclass
class _Pass:
    """What the models of one pass share: the room left on every node, taken in turn."""

    models: dict[str, Model]
    demand: dict[str, float]
    weights: dict[str, int]
    shapes: dict[str, Shape]
    now: float
    policy: Policy
    ids: Iterator[str]
    view: Callable[[], dict[str, NodeState]]
    """Makes the view of every node's free room (`states`), when a model first needs it."""
    scan: int = 0
    """Where the next limited scan of the fleet begins."""
    short: set[str] = field(default_factory=set)
    """Models a replica of which no node took."""
    first: set[str] = field(default_factory=set)
    """Models put first in this try: they take the slowest room that fits (not the fast room
    a lighter model gains most from), their speed scored the other way round."""
    left: dict[str, tuple[_Wants, list[list[Profile]], int]] = field(default_factory=dict)
    """Model -> its wants, the replicas (their profiles) no node took, and how many started."""

    @functools.cached_property
    def states(self) -> dict[str, NodeState]:
        """Every node's free room, kept as replicas stop and start (made when first asked: a
        steady pass, where every model runs as it should, never asks)."""
        return self.view()

    @functools.cached_property
    def index(self) -> Index:
        """The fleet's nodes each kind of need skips all pass long (`placement.Index`)."""
        return Index(self.states, self.now, self.policy.stale_s)


@dataclass
class _Wants:
    """One model's replicas to start, and what they are placed beside."""

    model: Model
    tries: list[list[Profile]]
    """For each replica to start, the profiles to try, best first."""
    kept: list[ReplicaState]
    """Its live replicas that stay (and those placed in this pass)."""
    stale: list[ReplicaState]
    failed: list[ReplicaState]
    """Oldest first."""
    fingerprints: dict[str, str] = field(default_factory=dict)

    @property
    def failures(self) -> int:
        """Failed starts in a row, counting those recorded."""
        return max((r.failures + 1 for r in self.failed), default=0)


def reconcile(desired: Desired, actual: Actual, now: float, policy: Policy = Policy(), *, ids: Iterator[str]) -> Plan:
    """Compare what the catalog asks with what runs; say what to start and stop.

    A node silent for `policy.stale_s` (suspect) gets nothing new; silent for `policy.lost_s`
    (lost) its replicas are given up and replaced elsewhere; silence counts only while the
    scheduler could hear (`actual.deaf_s`: not while away from NATS or hearing no node). A node
    never heard of counts as lost once the inventory has been listening (`actual.known_since`)
    for `lost_s`. An on-demand model runs while asked for within its idle timeout. New replicas
    take their ids from `ids`. Replicas being stopped (`actual.stopping`) hold their room until they stopped;
    a ready one stopped now drains for `policy.drain_s`, and a start waits for the stops of
    this plan on its nodes.
    """
    silent = {n: silence(v.last_seen, v.deaf_s, now, actual.deaf_s) for n, v in actual.nodes.items()}
    early = _lost(actual, now, policy.lost_s, silent)
    gone = {s.replica.id for s in early}
    replicas = [r for r in actual.replicas if r.id not in gone]
    by_model: dict[str, list[ReplicaState]] = {}
    for r in replicas:
        by_model.setdefault(r.model, []).append(r)
        if r.state == "draining":  # left by a scheduler that stopped halfway: finish the stop
            early.append(Stop(replica=r, reason="it was being stopped"))
        elif r.model not in desired.models:
            early.append(Stop(replica=r, reason=f"model '{r.model}' was removed from the catalog"))
    drawn: list[str] = []
    first: set[str] = set()
    best: Plan | None = None
    for _ in range(max(policy.tries, 1)):
        fleet = _Fleet(desired, actual, now, policy, early, replicas, by_model, silent)
        plan, short = _try(fleet, first, _replay(ids, drawn))
        if best is None or _worth(plan) > _worth(best):
            best = plan
        if short <= first or not plan.starts:  # nothing new to put first, or no start took room from it
            break
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
    silent: dict[str, float]
    """Each node's silence now (`silence`)."""


def _try(fleet: _Fleet, first: set[str], ids: Iterator[str]) -> tuple[Plan, set[str]]:
    """One try of the pass from the fleet as it is, the models in `first` first: its plan, and
    the models it left short."""
    desired, actual, now, policy = fleet.desired, fleet.actual, fleet.now, fleet.policy
    plan = Plan(stops=list(fleet.early))
    # One view of every node's free room for the whole pass, kept as replicas stop and start; a
    # node is heard of last as long ago as its silence (`health`'s rule: suspect past stale_s).
    silent = fleet.silent
    nodes = {n: (v.info, now - silent[n], v.weights) for n, v in actual.nodes.items()}

    def view() -> dict[str, NodeState]:
        states = node_states(nodes, fleet.replicas, policy.reserve_mb)
        for r in actual.stopping:
            hold(states, r)
        for stop in fleet.early:  # the stops made after free their room themselves
            if stop.replica.state in LIVE:
                release(states, stop.replica)
        return states

    run = _Pass(desired.models, desired.demand, actual.weights, actual.shapes, now, policy, ids, view, first=first)
    for name, model in sorted(desired.models.items(), key=lambda kv: _turn(kv[1], actual, first)):
        if (part := _for_model(model, fleet.by_model.get(name, []), run)) is not None:
            plan.absorb(part)
    _repair(plan, run)
    if plan.starts:
        improve(plan, run.states, now, policy, actual.weights, actual.shapes)
    return plan, run.short


def _turn(model: Model, actual: Actual, first: set[str]) -> tuple[int, bool, int, str]:
    """When a model is placed in a try: its class (higher first); those put first; the bytes a
    token reads (fewest first); its name."""
    shape = actual.shapes.get(model.source)
    read = shape.active_bytes if shape is not None else actual.weights.get(model.source, 0)
    return (-CLASS_RANK[model.capacity_class], model.name not in first, read, model.name)


def _worth(plan: Plan) -> tuple[int, float]:
    """How a try's plan ranks: replicas started, then their predicted tokens a second."""
    return len(plan.starts), sum(s.replica.tokens_per_s or 0.0 for s in plan.starts)


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


def _lost(actual: Actual, now: float, lost_s: float, silent: dict[str, float]) -> list[Stop]:
    """Live replicas on a lost node (one across nodes is lost with any of them). A node's silence
    (`silent`) is the time since it was last heard less the time the scheduler was deaf since
    (`Hearing`)."""
    unheard = silence(actual.known_since, actual.known_deaf_s, now, actual.deaf_s)
    stops = []
    for r in actual.replicas:
        if r.state not in LIVE:
            continue
        worst = max(spans(r), key=lambda n: silent.get(n, unheard)) if r.workers else r.node
        if (longest := silent.get(worst, unheard)) > lost_s:
            why = f"node '{worst}' lost: no heartbeat for {longest:.0f}s"
            stops.append(Stop(replica=r, reason=why, reachable=silent.get(r.node, unheard) <= lost_s))
    return stops


def _for_model(model: Model, mine: list[ReplicaState], run: _Pass) -> Plan | None:
    """One model's part of the plan (None: nothing to do)."""
    want = wanted(model.scaling, run.now, run.demand.get(model.name))
    if _steady(model, mine, want):
        return None
    plan, wants = _rollout(model, mine, run, want)
    if wants.tries and not _held_back(wants, run, plan):
        _start_missing(wants, run, plan)
    return plan


def _steady(model: Model, mine: list[ReplicaState], want: int) -> bool:
    """Whether a model runs as it should: as many live replicas as it wants, none stale, its
    profiles not counted (then `_rollout` would stop and start nothing)."""
    if len(mine) != want or any(r.state not in LIVE for r in mine) or wanted_counts(model) is not None:
        return False
    current = {p.name: fingerprint_of(model, p) for p in model.profiles}
    return all(current.get(r.profile) == r.fingerprint for r in mine)


def _rollout(model: Model, mine: list[ReplicaState], run: _Pass, want: int) -> tuple[Plan, _Wants]:
    """What to stop of a model's replicas (their room freed for this pass) and what to start,
    `want` of them running."""
    counts = wanted_counts(model)
    current = {p.name: fingerprint_of(model, p) for p in model.profiles}
    live = [r for r in mine if r.state in LIVE]
    stale = [r for r in live if current.get(r.profile) != r.fingerprint]
    if stale:
        stale.sort(key=lambda r: r.updated)
    fresh = [r for r in live if r not in stale] if stale else live
    plan = Plan(stops=surplus(model, want, stale, fresh, counts))
    for stop in plan.stops:
        release(run.states, stop.replica)
    running = len(live) - len(plan.stops)
    missing = want - running
    if stale and want and all(r.state == "ready" for r in fresh) and len(fresh) < want <= running:
        missing += 1  # surge: the replacement starts beside the stale replica it replaces
    stopping = {s.replica.id for s in plan.stops}
    kept = [r for r in live if r.id not in stopping] if stopping else list(live)
    failed = [r for r in mine if r.state == "failed"]
    if failed:
        failed.sort(key=lambda r: r.updated)
    tries = wanted_profiles(model, kept, stale, missing, counts)
    return plan, _Wants(model=model, tries=tries, kept=kept, stale=stale, failed=failed, fingerprints=current)


def _held_back(wants: _Wants, run: _Pass, plan: Plan) -> bool:
    """Whether the model waits (backing off after failures, or its file unconfirmed), and why."""
    name, failed = wants.model.name, wants.failed
    if failed and run.now < (until := failed[-1].updated + backoff_s(wants.failures)):
        wait = until - run.now
        plan.unplaced[name] = (
            f"backing off after {wants.failures} failures, next try in {wait:.0f}s: {failed[-1].error}"
        )
        plan.backoff_until[name] = until
        return True
    if wants.model.source not in run.weights:
        plan.unplaced[name] = f"the mirror has not confirmed it holds '{wants.model.source}'"
        return True
    return False


def _start_missing(wants: _Wants, run: _Pass, plan: Plan) -> None:
    """Place each missing replica on the first of its profiles that fits; the first that fits
    nowhere ends the model's turn, saying why for each profile and node."""
    started = 0
    for i, profiles in enumerate(wants.tries):
        reasons: list[str] = []
        for profile in profiles:
            why = _place_one(wants, profile, run, plan)
            if not why:
                started += 1
                break
            reasons.append(f"profile '{profile.name}': {why}" if len(profiles) > 1 else why)
        else:
            surge = " (a replacement starts beside the replica it replaces; `--in-place` stops that one first)"
            stale_surge = wants.stale and wants.model.rollout == "surge"
            plan.unplaced[wants.model.name] = " | ".join(reasons) + (surge if stale_surge else "")
            run.short.add(wants.model.name)
            run.left[wants.model.name] = (wants, wants.tries[i:], started)
            break
    if started:  # replaced now: the failed records go
        plan.stops.extend(Stop(replica=r, reason="replaced after failure") for r in wants.failed)


def _repair(plan: Plan, run: _Pass) -> None:
    """The replicas the pass left unplaced, model by model in turn: each where a node can be
    cleared for it by moving starts of this pass elsewhere (`make_room`), on the first of its
    profiles that can be; on their own profiles first, else on their models' fallbacks."""
    for name, (wants, left, started) in run.left.items():
        placed = 0
        for profiles in left:
            if not any(_room_made(wants, profiles, run, plan, fall_back) for fall_back in (False, True)):
                break
            placed += 1
        if placed == len(left):  # still short in `run.short`: the next try puts it first
            del plan.unplaced[name]
        if placed and not started:  # replaced now: the failed records go
            plan.stops.extend(Stop(replica=r, reason="replaced after failure") for r in wants.failed)


def _room_made(wants: _Wants, profiles: list[Profile], run: _Pass, plan: Plan, fall_back: bool) -> bool:
    """Whether one replica was placed on the first of `profiles` room could be made for."""
    model = wants.model
    for profile in profiles:
        need = need_of(profile, run.weights[model.source], run.shapes.get(model.source), model.context)
        if make_room(plan, run.states, run.now, run.policy, run.weights, run.shapes, need, fall_back=fall_back):
            return not _place_one(wants, profile, run, plan)
    return False


def _place_one(wants: _Wants, profile: Profile, run: _Pass, plan: Plan) -> str:
    """Place one replica of `profile` (taking a lower class's room if need be) and add its
    start to the plan; "" if it was placed, else why no node took it."""
    model, policy = wants.model, run.policy
    need = need_of(profile, run.weights[model.source], run.shapes.get(model.source), model.context)
    scoring = policy.scoring
    if model.name in run.first:
        scoring = msgspec.structs.replace(scoring, speed=-scoring.speed)
    how = Search(
        stale_s=policy.stale_s,
        weights=scoring,
        peers=wants.kept,
        limit=policy.score_nodes,
        start=run.scan,
        index=run.index,
    )
    where, why = place(need, model, run.states, run.now, how)
    run.scan += len(why) + max(policy.score_nodes, 1)
    if where is None and (taken := _preempt(need, model, run)):
        where, victims = taken
        gave = f"gave room to {model.capacity_class} model '{model.name}'"
        for victim in victims:
            release(run.states, victim)
            plan.stops.append(Stop(replica=victim, reason=f"preempted: {gave}", drain=False))
            plan.held[victim.model] = gave
    if where is None:
        return "; ".join(f"{n}: {w}" for n, w in why.items()) or "no nodes registered"
    replica = ReplicaState(
        id=next(run.ids),
        model=model.name,
        profile=profile.name,
        node=where.node,
        memory_mb=need.memory_mb,
        cores=profile.cpu_cores or 0,
        gpus=where.cards,
        workers=where.workers,
        failures=wants.failures,
        fingerprint=wants.fingerprints[profile.name],
        estimate_mb=need.estimate_mb,
        tokens_per_s=round(speed_of(need, run.states[where.node]), 1),
        updated=run.now,
    )
    claim(run.states, replica)
    wants.kept.append(replica)
    plan.starts.append(Start(replica=replica, model=model, profile=profile))
    return ""


def _preempt(need: Need, model: Model, run: _Pass) -> tuple[Placement, list[ReplicaState]] | None:
    """Replicas of a lower class whose room would let `need` fit, and where: the lowest class
    first, the newest of it first; None when none would (or the model is of the lowest class).

    One replica's room where that is enough: only its nodes change by its going, so only they
    are tried again. A replica across nodes takes as many as it needs, in that order, and of
    those only the ones on the nodes it gets give up their room."""
    rank, models, states = CLASS_RANK[model.capacity_class], run.models, run.states
    how = Search(stale_s=run.policy.stale_s, weights=run.policy.scoring)
    victims = list(
        {
            r.id: r
            for n in states.values()
            for r in n.replicas
            if r.model in models and r.model != model.name and CLASS_RANK[models[r.model].capacity_class] < rank
        }.values()
    )
    victims.sort(key=lambda r: (CLASS_RANK[models[r.model].capacity_class], -r.updated))
    if need.profile.nodes == 1:
        for victim in victims:
            trial = {n: _copy(states[n]) for n in spans(victim) if n in states}
            release(trial, victim)
            where, _ = place(need, model, trial, run.now, how)
            if where:
                return where, [victim]
        return None
    trial, taken = dict(states), []
    for victim in victims:
        for n in spans(victim):
            if n in states and trial[n] is states[n]:
                trial[n] = _copy(states[n])
        release(trial, victim)
        taken.append(victim)
        where, _ = place(need, model, trial, run.now, how)
        if where:
            got = {where.node, *(w.node for w in where.workers)}
            return where, [v for v in taken if got.intersection(spans(v))]
    return None


def _copy(n: NodeState) -> NodeState:
    return msgspec.structs.replace(n, replicas=list(n.replicas))
