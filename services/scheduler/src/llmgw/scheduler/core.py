"""Reconcile, pure: no I/O and no clock (`now` is passed in). Placement is `placement.py`'s chain.

For every model: stop replicas of removed models and those left draining; replace stale
replicas (another fingerprint) one at a time; keep each counted profile at its count, starting
those short before stopping those over so a change of split never runs fewer; otherwise keep
the scaling's number, each new replica on the highest-priority profile that fits.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from llmgw.proto import Model, ModelStatus, NodeInfo, Profile, ReplicaState, Scaling, fingerprint
from llmgw.scheduler.placement import (
    LIVE,
    NodeState,
    Placement,
    Weights,
    claim,
    need_of,
    node_states,
    place,
    release,
    spans,
)

__all__ = ["NodeView", "Plan", "Start", "Stop", "backoff_s", "lost", "lost_workers", "reconcile", "status", "wanted"]


class NodeView(msgspec.Struct, kw_only=True):
    """A node as the inventory knows it."""

    info: NodeInfo
    last_seen: float
    """Unix time of its last heartbeat or registration."""
    weights: list[str] = msgspec.field(default_factory=list)
    """Sources its cache holds (from its last heartbeat)."""


class Start(msgspec.Struct, kw_only=True):
    """Start this replica."""

    replica: ReplicaState
    model: Model
    profile: Profile


class Stop(msgspec.Struct, kw_only=True):
    """Stop this replica, for this reason."""

    replica: ReplicaState
    reason: str
    reachable: bool = True
    """False for a replica on a lost node: its record goes without asking its agent."""
    drain: bool = True
    """Give in-flight requests the drain grace first (a ready replica); False where its room
    is needed at once (an in-place replacement)."""


class Plan(msgspec.Struct, kw_only=True):
    """What to do now, and why a model could not be placed."""

    starts: list[Start] = msgspec.field(default_factory=list)
    stops: list[Stop] = msgspec.field(default_factory=list)
    unplaced: dict[str, str] = msgspec.field(default_factory=dict)
    """Model name -> why no node took it (each node's reason)."""
    backoff_until: dict[str, float] = msgspec.field(default_factory=dict)
    """Model name -> when its next try is, while it backs off."""
    held: dict[str, str] = msgspec.field(default_factory=dict)
    """Model name -> the higher-class model it gave a replica's room to in this pass."""


CLASS_RANK = {"batch": 0, "standard": 1, "critical": 2}
"""Capacity classes: a replica of a higher class may take the room of a lower one's."""


def _preempt(
    need,
    model: Model,
    models: dict[str, Model],
    states: dict[str, NodeState],
    now: float,
    stale_s: float,
    scoring: Weights,
) -> tuple[Placement, list[ReplicaState]] | None:
    """Replicas of a lower class whose room would let `need` fit, and where: the lowest class
    first, the newest of it first; None when none would (or the model is of the lowest class).

    One replica's room where that is enough: only its nodes change by its going, so only they
    are tried again. A replica across nodes takes as many as it needs, in that order, and of
    those only the ones on the nodes it gets give up their room."""
    rank = CLASS_RANK[model.capacity_class]
    victims = list(
        {
            r.id: r
            for n in states.values()
            for r in n.replicas
            if r.model in models and r.model != model.name and CLASS_RANK[models[r.model].capacity_class] < rank
        }.values()
    )
    victims.sort(key=lambda r: (CLASS_RANK[models[r.model].capacity_class], -r.updated))

    def copy(n: NodeState) -> NodeState:
        return msgspec.structs.replace(n, replicas=list(n.replicas))

    if need.profile.nodes == 1:
        for victim in victims:
            trial = {n: copy(states[n]) for n in spans(victim) if n in states}
            release(trial, victim)
            where, _ = place(need, model, trial, now, stale_s, scoring)
            if where:
                return where, [victim]
        return None
    trial, taken = dict(states), []
    for victim in victims:
        for n in spans(victim):
            if n in states and trial[n] is states[n]:
                trial[n] = copy(states[n])
        release(trial, victim)
        taken.append(victim)
        where, _ = place(need, model, trial, now, stale_s, scoring)
        if where:
            got = {where.node, *(w.node for w in where.workers)}
            return where, [v for v in taken if got.intersection(spans(v))]
    return None


def wanted(scaling: Scaling, now: float, last_asked: float | None = None) -> int:
    """Replicas kept running now: the window of the schedule that holds at this UTC time of day
    (a window may run past midnight), else the scaling's min; with an idle timeout, at least
    one while the model was asked for within it (scaled to zero after, woken by a request)."""
    base = scaling.min
    minute = int(now // 60) % (24 * 60)
    for w in scaling.schedule:
        start, end = (int(t[:2]) * 60 + int(t[3:]) for t in (w.start, w.end))
        inside = start <= minute < end if start <= end else (minute >= start or minute < end)
        if inside:
            base = w.min
            break
    if scaling.idle_timeout_s is not None and last_asked is not None and now - last_asked < scaling.idle_timeout_s:
        return max(base, 1)
    return base


def status(
    model: Model, replicas: list[ReplicaState], plan: Plan, now: float, held: str = "", last_asked: float | None = None
) -> ModelStatus:
    """A model's status from what runs and what this pass could not do; `held` is why it gave
    room to a higher class (kept by the shell until the model runs whole again)."""
    ready = sum(1 for r in replicas if r.model == model.name and r.state == "ready")
    want = wanted(model.scaling, now, last_asked)
    reason = plan.unplaced.get(model.name, "")
    if model.stopped is not None:
        state = "stopped"
    elif held and ready < want:
        state, reason = "held", held + (f"; {reason}" if reason else "")
    elif model.name in plan.backoff_until:
        state = "backing-off"
    elif reason:
        state = "parked"
    elif ready < want:
        state = "starting"
    elif want == 0 and model.scaling.idle_timeout_s is not None:
        state = "idle"
        reason = (
            (f"scaled to zero: not asked for in {model.scaling.idle_timeout_s:g}s; the first request wakes it")
            if last_asked
            else "on demand: the first request starts it"
        )
    else:
        state = "running"
    return ModelStatus(
        model=model.name,
        state=state,
        ready=ready,
        wanted=want,
        reason=reason,
        until=plan.backoff_until.get(model.name, 0.0),
    )


def backoff_s(failures: int, base: float = 5.0, cap: float = 300.0) -> float:
    """Seconds to wait before replacing a model's replica after `failures` failures in a row."""
    return min(cap, base * 2 ** max(0, failures - 1))


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


def _surplus(
    model: Model, want: int, stale: list[ReplicaState], fresh: list[ReplicaState], counts: dict[str, int] | None
) -> list[Stop]:
    """Replicas to stop: stale ones whose replacements are ready, then any beyond what is wanted.

    Stale replicas are replaced one at a time. With a surge rollout a stale replica stops only
    once a fresh one stands ready for it; in place, one stale replica stops while no fresh one
    is starting, and only at full strength. Counted profiles over their count give up replicas
    only while the ready ones left still make the total.
    """
    stops = []
    ready = sum(r.state == "ready" for r in fresh)
    starting = len(fresh) - ready
    extra = max(0, ready + len(stale) - want)
    if model.rollout == "in-place" and stale and not starting and len(fresh) + len(stale) >= want:
        extra = max(extra, 1)  # only at full strength: a failed replacement never takes a second one down
    for r in stale[:extra]:
        stops.append(
            Stop(
                replica=r,
                reason="stale (context, cards, engine or a restart): replaced one at a time",
                drain=model.rollout != "in-place",
            )
        )
    newest_first = sorted(fresh, key=lambda r: (r.state == "ready", -r.updated))  # those still starting go first
    if counts is None:
        over = max(0, len(fresh) - want)
        stops += [
            Stop(replica=r, reason=f"model '{model.name}' runs {len(fresh)}, wants {want}") for r in newest_first[:over]
        ]
        return stops
    ready_left = ready + len(stale) - len(stops)
    for profile, count in counts.items():
        mine = [r for r in newest_first if r.profile == profile]
        for r in mine[: max(0, len(mine) - count)]:
            if r.state == "ready" and ready_left - 1 < want:
                continue  # the short profiles' replicas are not ready yet: keep this one until they are
            ready_left -= r.state == "ready"
            stops.append(Stop(replica=r, reason=f"profile '{profile}' runs {len(mine)}, its count is {count}"))
    return stops


def _wanted_profiles(
    model: Model, live: list[ReplicaState], stale: list[ReplicaState], missing: int, counts: dict[str, int] | None
) -> list[list[Profile]]:
    """For each replica to start, the profiles to try, best first."""
    by_priority = sorted(model.profiles, key=lambda p: -p.priority)
    if counts is None:
        return [by_priority] * missing
    out = []
    for p in by_priority:
        short = counts.get(p.name, 0) - sum(1 for r in live if r.profile == p.name and r not in stale)
        out += [[p]] * max(0, short)
    if len(out) < missing and stale:  # a surge replacement goes where the stale replica ran
        first = next(p for p in model.profiles if p.name == stale[0].profile)
        out.append([first])
    return out


def reconcile(
    models: dict[str, Model],
    nodes: dict[str, NodeView],
    replicas: list[ReplicaState],
    weights: dict[str, int],
    now: float,
    ids: Iterator[str],
    stale_s: float = 10.0,
    reserve_mb: int = 512,
    scoring: Weights = Weights(),
    lost_s: float = 30.0,
    known_since: float = 0.0,
    demand: dict[str, float] | None = None,
    score_nodes: int = 100,
) -> Plan:
    """Compare what the catalog asks with what runs; say what to start and stop.

    `weights` maps a source to its size in bytes (absent: the mirror does not hold it). A node
    silent for `stale_s` (suspect) gets nothing new; silent for `lost_s` (lost) its replicas are
    given up and replaced elsewhere. A node never heard of counts as lost once the inventory has
    been listening (`known_since`) for `lost_s`. `demand` is when each model was last asked for
    (the router's word): an on-demand model runs while asked for within its idle timeout. At
    most `score_nodes` nodes that fit are scored for each replica (0: every one).
    """
    demand = demand or {}
    plan = Plan()
    gone = []
    for r in replicas:
        if r.state not in LIVE:
            continue
        silent = {n: now - nodes[n].last_seen if n in nodes else now - known_since for n in spans(r)}
        worst = max(silent, key=lambda n: silent[n])
        if silent[worst] > lost_s:  # a replica across nodes is lost with any of them
            gone.append(r.id)
            plan.stops.append(
                Stop(
                    replica=r,
                    reason=f"node '{worst}' lost: no heartbeat for {silent[worst]:.0f}s",
                    reachable=silent[r.node] <= lost_s,
                )
            )
    replicas = [r for r in replicas if r.id not in gone]
    by_model: dict[str, list[ReplicaState]] = {}
    for r in replicas:
        by_model.setdefault(r.model, []).append(r)
        if r.state == "draining":  # left by a scheduler that stopped halfway: finish the stop
            plan.stops.append(Stop(replica=r, reason="it was being stopped"))
        elif r.model not in models:
            plan.stops.append(Stop(replica=r, reason=f"model '{r.model}' was removed from the catalog"))
    # One view of every node's free room for the whole pass, kept as replicas stop and start.
    states = node_states({n: (v.info, v.last_seen, v.weights) for n, v in nodes.items()}, replicas, reserve_mb)
    for stop in plan.stops:
        if stop.replica.state in LIVE:
            release(states, stop.replica)
    scan = 0  # where the next limited scan of the fleet begins
    # Higher classes first, so a critical model takes room before a batch one asks for it.
    for name, model in sorted(models.items(), key=lambda kv: (-CLASS_RANK[kv[1].capacity_class], kv[0])):
        mine = by_model.get(name, [])
        failed = sorted((r for r in mine if r.state == "failed"), key=lambda r: r.updated)
        want = wanted(model.scaling, now, demand.get(name))
        counted = any(p.replicas is not None for p in model.profiles) and model.stopped is None
        counts = {p.name: p.replicas or 0 for p in model.profiles} if counted else None
        current = {p.name: fingerprint(model, p) for p in model.profiles}
        live = [r for r in mine if r.state in LIVE]
        stale = sorted((r for r in live if current.get(r.profile) != r.fingerprint), key=lambda r: r.updated)
        fresh = [r for r in live if r not in stale]
        stops = _surplus(model, want, stale, fresh, counts)
        plan.stops.extend(stops)
        for stop in stops:
            release(states, stop.replica)
        running = len(live) - len(stops)
        missing = want - running
        if stale and want and not any(r.state != "ready" for r in fresh) and len(fresh) < want <= running:
            missing += 1  # surge: the replacement starts beside the stale replica it replaces
        stopping = {s.replica.id for s in stops}
        kept = [r for r in live if r.id not in stopping]
        tries = _wanted_profiles(model, kept, stale, missing, counts)[: max(missing, 0) if counts is None else None]
        if not tries:
            continue
        failures = max((r.failures + 1 for r in failed), default=0)
        if failed and now < failed[-1].updated + backoff_s(failures):
            wait = failed[-1].updated + backoff_s(failures) - now
            plan.unplaced[name] = f"backing off after {failures} failures, next try in {wait:.0f}s: {failed[-1].error}"
            plan.backoff_until[name] = failed[-1].updated + backoff_s(failures)
            continue
        if model.source not in weights:
            plan.unplaced[name] = f"the mirror has not confirmed it holds '{model.source}'"
            continue
        started = 0
        for profiles in tries:
            reasons: list[str] = []
            for profile in profiles:
                need = need_of(profile, weights[model.source])
                where, why = place(
                    need, model, states, now, stale_s, scoring, peers=kept, limit=score_nodes, start=scan
                )
                scan += len(why) + max(score_nodes, 1)
                if where is None:
                    taken = _preempt(need, model, models, states, now, stale_s, scoring)
                    if taken:
                        where, victims = taken
                        gave = f"gave room to {model.capacity_class} model '{name}'"
                        for victim in victims:
                            release(states, victim)
                            plan.stops.append(Stop(replica=victim, reason=f"preempted: {gave}", drain=False))
                            plan.held[victim.model] = gave
                if where:
                    replica = ReplicaState(
                        id=next(ids),
                        model=name,
                        profile=profile.name,
                        node=where.node,
                        memory_mb=need.memory_mb,
                        cores=profile.cpu_cores or 0,
                        gpus=where.cards,
                        workers=where.workers,
                        failures=failures,
                        fingerprint=current[profile.name],
                        updated=now,
                    )
                    claim(states, replica)
                    kept.append(replica)
                    plan.starts.append(Start(replica=replica, model=model, profile=profile))
                    started += 1
                    break
                reasons.append("; ".join(f"{n}: {w}" for n, w in why.items()) or "no nodes registered")
                if len(profiles) > 1:
                    reasons[-1] = f"profile '{profile.name}': {reasons[-1]}"
            else:
                surge = " (a replacement starts beside the replica it replaces; `--in-place` stops that one first)"
                plan.unplaced[name] = " | ".join(reasons) + (surge if stale and model.rollout == "surge" else "")
                break
        if started:  # replaced now: the failed records go
            plan.stops.extend(Stop(replica=r, reason="replaced after failure") for r in failed)
    return plan
