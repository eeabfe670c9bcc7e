"""One model's part of a pass, pure: its rollout (stale replicas replaced, counted profiles kept
at their count, the scaling's number), its new replicas placed on the room the models before it
left (a lower class's room taken where nothing else would), and room made for those no node
took (`make_room`). `_reconcile.py` runs the models in turn and the tries.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from llmgw.modelplan import Shape
from llmgw.proto import Model, Profile, ReplicaState
from llmgw.scheduler.core._improve import make_room
from llmgw.scheduler.core._plan import Plan, Policy, Start, Stop
from llmgw.scheduler.core._rollout import fingerprints, surplus, wanted_counts, wanted_profiles
from llmgw.scheduler.core._status import CLASS_RANK, backoff_s, wanted
from llmgw.scheduler.placement import (
    LIVE,
    Index,
    Need,
    NodeState,
    Placement,
    Search,
    claim,
    need_for,
    place,
    release,
    spans,
    speed_of,
)

__all__ = ["Pass", "Wants", "for_model", "repair", "settled"]


@dataclass
class Pass:
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
    solver: Callable[[], Any]
    """Makes a HiGHS solver, for `exact`."""
    scan: int = 0
    """Where the next limited scan of the fleet begins."""
    short: set[str] = field(default_factory=set)
    """Models a replica of which no node took."""
    first: set[str] = field(default_factory=set)
    """Models put first in this try: they take the slowest room that fits (not the fast room
    a lighter model gains most from), their speed scored the other way round."""
    left: dict[str, tuple[Wants, list[list[Profile]], int]] = field(default_factory=dict)
    """Model -> its wants, the replicas (their profiles) no node took yet, and how many started
    (`repair` and `exact` take those they place off)."""
    needs: dict[tuple[str, str], Need] = field(default_factory=dict)
    """(model, profile) -> what one replica takes."""

    @functools.cached_property
    def states(self) -> dict[str, NodeState]:
        """Every node's free room, kept as replicas stop and start (made when first asked: a
        steady pass, where every model runs as it should, never asks)."""
        return self.view()

    def need(self, model: Model, profile: Profile) -> Need:
        """What one replica of the model's profile takes (worked out once a pass)."""
        key = (model.name, profile.name)
        need = self.needs.get(key)
        if need is None:
            need = self.needs[key] = need_for(model, profile, self.weights, self.shapes)
        return need

    @functools.cached_property
    def index(self) -> Index:
        """The fleet's free room in columns, kept as replicas are placed, and the nodes each
        kind of need skips all pass long (`placement.Index`)."""
        return Index(self.states, self.now, self.policy.stale_s)


@dataclass
class Wants:
    """One model's replicas to start, and what they are placed beside."""

    model: Model
    tries: list[list[Profile]]
    """For each replica to start, the profiles to try, best first."""
    kept: list[ReplicaState]
    """Its live replicas that stay (and those placed in this pass)."""
    stale: list[ReplicaState]
    failed: list[ReplicaState]
    """Oldest first."""
    fingerprints: Mapping[str, str] = field(default_factory=dict)
    """Each profile's fingerprint now (`fingerprints`: shared, read only)."""

    @property
    def failures(self) -> int:
        """Failed starts in a row, counting those recorded."""
        return max((r.failures + 1 for r in self.failed), default=0)

    def replica(
        self, profile: Profile, need: Need, where: Placement, run: Pass, at: NodeState | None = None
    ) -> ReplicaState:
        """A new replica of the model's `profile` placed `where` (not yet claimed); its speed that
        of node `at` (a view of it with the cards it was placed from), else of `where`'s node."""
        return ReplicaState(
            id=next(run.ids),
            model=self.model.name,
            profile=profile.name,
            node=where.node,
            memory_mb=need.memory_mb,
            cores=profile.cpu_cores or 0,
            gpus=where.cards,
            workers=where.workers,
            failures=self.failures,
            fingerprint=self.fingerprints[profile.name],
            estimate_mb=need.estimate_mb,
            tokens_per_s=round(speed_of(need, at or run.states[where.node]), 1),
            adapters=[a.name for a in self.model.adapters],
            updated=run.now,
        )

    def started(self, profile: Profile, replica: ReplicaState, plan: Plan) -> None:
        """Add the start of `replica` (claimed) to the plan and to the replicas kept."""
        self.kept.append(replica)
        plan.starts.append(Start(replica=replica, model=self.model, profile=profile))

    def replaced(self, plan: Plan) -> None:
        """Its first replica started: the records of its failed starts go."""
        plan.stops.extend(Stop(replica=r, reason="replaced after failure") for r in self.failed)


def settled(model: Model, current: int, now: float, demand: dict[str, float]) -> bool:
    """Whether a model runs as it should now, whatever the other models do, given that its
    replicas are `current` in number, every one live and of its profile's fingerprint now (only
    the caller can say so: the pass's walk judges each replica, `reconcile`): as many as it
    wants, its profiles not counted. Then `for_model` would stop and start nothing, wherever it
    came in the pass, and the pass does not ask it."""
    return current == wanted(model.scaling, now, demand.get(model.name)) and wanted_counts(model) is None


def for_model(model: Model, mine: list[ReplicaState], run: Pass) -> Plan:
    """One model's part of the plan (empty where it has nothing to do)."""
    want = wanted(model.scaling, run.now, run.demand.get(model.name))
    plan, wants = _rollout(model, mine, run, want)
    if wants.tries and not _held_back(wants, run, plan):
        _start_missing(wants, run, plan)
    return plan


def _rollout(model: Model, mine: list[ReplicaState], run: Pass, want: int) -> tuple[Plan, Wants]:
    """What to stop of a model's replicas (their room freed for this pass) and what to start,
    `want` of them running."""
    counts = wanted_counts(model)
    current = fingerprints(model)
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
    return plan, Wants(model=model, tries=tries, kept=kept, stale=stale, failed=failed, fingerprints=current)


def _held_back(wants: Wants, run: Pass, plan: Plan) -> bool:
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


def _start_missing(wants: Wants, run: Pass, plan: Plan) -> None:
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
        wants.replaced(plan)


def repair(plan: Plan, run: Pass) -> None:
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
            wants.replaced(plan)
        run.left[name] = (wants, left[placed:], started + placed)


def _room_made(wants: Wants, profiles: list[Profile], run: Pass, plan: Plan, fall_back: bool) -> bool:
    """Whether one replica was placed on the first of `profiles` room could be made for."""
    model = wants.model
    for profile in profiles:
        need = run.need(model, profile)
        if make_room(plan, run.states, run.now, run.policy, run.weights, run.shapes, need, fall_back=fall_back):
            return not _place_one(wants, profile, run, plan)
    return False


def _place_one(wants: Wants, profile: Profile, run: Pass, plan: Plan) -> str:
    """Place one replica of `profile` (taking a lower class's room if need be) and add its
    start to the plan; "" if it was placed, else why no node took it."""
    model, policy = wants.model, run.policy
    need = run.need(model, profile)
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
    replica = wants.replica(profile, need, where, run)
    claim(run.states, replica)
    wants.started(profile, replica, plan)
    return ""


def _preempt(need: Need, model: Model, run: Pass) -> tuple[Placement, list[ReplicaState]] | None:
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
