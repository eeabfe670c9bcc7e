"""After a try's greedy pass, a local improvement of what it starts: a replica moved to a node
where it answers faster, or two replicas trading places (nodes, or card classes on one node),
wherever the predicted tokens a second of the replicas started rise and every filter still
passes. Each keeps its profile (the highest-priority one that fitted stays its profile), and
none moves away from a node holding its file or into a failure domain holding more of its
model than the one it leaves. Pure and deterministic: the starts in plan order, the nodes in
name order; a change is made only where the total strictly rises, so it ends.

Where the greedy pass left a replica unplaced, `make_room` frees a node for it by moving
starts off that node, each to another node that takes it (same rules), on its own profile or
else on the next of its model's profiles that fits (as if the unplaced one had been placed
first): a light model that took the only room a heavy one fits goes elsewhere."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from llmgw.modelplan import Shape
from llmgw.proto import Model, Profile, ReplicaState
from llmgw.scheduler.core._plan import Plan, Policy, Start
from llmgw.scheduler.core._rollout import fingerprints, wanted_counts
from llmgw.scheduler.placement import (
    Need,
    NodeState,
    cards_for,
    claim,
    domain_of,
    fits,
    need_for,
    release,
    spans,
    speed_of,
)

__all__ = ["SWEEPS", "improve", "make_room", "relocated"]

SWEEPS = 4
"""Sweeps over the starts at most (each tries every move and trade)."""
_GAIN = 0.05
"""Tokens a second a change must add (the replicas' figures are rounded to 0.1)."""


@dataclass
class _Spot:
    """One start open to change: its index in the plan's starts and its need."""

    index: int
    need: Need
    source: str
    fallbacks: list[tuple[Profile, Need]] = field(default_factory=list)
    """Its model's profiles after its own (by priority, on one node) and their needs: where it
    may go when moved to make room (none for a model whose profiles are counted)."""


_Move = tuple[_Spot, ReplicaState, Profile, Need, list[tuple[Profile, Need]]]
"""A start moved to make room: its spot, and its replica, profile, need and fallbacks before."""


class _Improver:
    """The moves and trades of one try's starts, over the pass's node states."""

    def __init__(
        self, starts: list, spots: list[_Spot], states: dict[str, NodeState], now: float, stale_s: float, domain: str
    ):
        self.starts, self.spots, self.states = starts, spots, states
        self.now, self.stale_s, self.domain = now, stale_s, domain
        self.moves = True
        self.fall_back = False
        """Whether a start moved to make room may go on a fallback profile of its model."""
        self.domains: dict[tuple[str, str], int] = {}
        for n in states.values():
            for r in n.replicas:
                if r.node == n.info.node:
                    key = (r.model, self._domain(r.node))
                    self.domains[key] = self.domains.get(key, 0) + 1

    def _domain(self, node: str) -> str:
        n = self.states.get(node)
        return domain_of(n, self.domain) if n is not None else node

    def replica(self, spot: _Spot) -> ReplicaState:
        return self.starts[spot.index].replica

    def allowed(self, spot: _Spot, r: ReplicaState, to: str) -> bool:
        """Whether `r` may leave its node for `to`: not away from its file, nor into a domain
        with more of its model than the one it leaves."""
        if to == r.node:
            return True
        if spot.source in self.states[r.node].weights and spot.source not in self.states[to].weights:
            return False
        here, there = self._domain(r.node), self._domain(to)
        return here == there or self.domains.get((r.model, there), 0) <= self.domains.get((r.model, here), 0) - 1

    def put(self, spot: _Spot, r: ReplicaState, to: str) -> ReplicaState | None:
        """`r` placed anew on `to` (claimed there), or None where a filter refuses it."""
        n = self.states[to]
        if not fits(spot.need, n, self.now, self.stale_s):
            return None
        moved = msgspec.structs.replace(
            r, node=to, gpus=cards_for(spot.need, n), tokens_per_s=round(speed_of(spot.need, n), 1)
        )
        claim(self.states, moved)
        return moved

    def commit(self, spot: _Spot, old: ReplicaState, new: ReplicaState) -> None:
        self.starts[spot.index].replica = new
        if old.node != new.node:
            for node, step in ((old.node, -1), (new.node, 1)):
                key = (old.model, self._domain(node))
                self.domains[key] = self.domains.get(key, 0) + step

    def move(self, spot: _Spot) -> bool:
        """Move one replica to the node (or the card class) where it answers fastest."""
        r = self.replica(spot)
        release(self.states, r)
        best: tuple[float, str] | None = None
        for name in self.states:
            if not self.allowed(spot, r, name):
                continue
            n = self.states[name]
            if fits(spot.need, n, self.now, self.stale_s):
                speed = round(speed_of(spot.need, n), 1)
                if speed > (r.tokens_per_s or 0.0) + _GAIN and (best is None or speed > best[0]):
                    best = (speed, name)
        if best is None:
            claim(self.states, r)
            return False
        moved = self.put(spot, r, best[1])
        assert moved is not None
        self.commit(spot, r, moved)
        return True

    def swap(self, a: _Spot, b: _Spot) -> bool:
        """Let two replicas trade places where together they answer faster."""
        ra, rb = self.replica(a), self.replica(b)
        if not (self.allowed(a, ra, rb.node) and self.allowed(b, rb, ra.node)):
            return False
        before = (ra.tokens_per_s or 0.0) + (rb.tokens_per_s or 0.0)
        release(self.states, ra)
        release(self.states, rb)
        best: tuple[float, int] | None = None
        orders = ((a, ra, rb.node), (b, rb, ra.node)), ((b, rb, ra.node), (a, ra, rb.node))
        for k, order in enumerate(orders):
            placed = []
            for spot, r, to in order:
                new = self.put(spot, r, to)
                if new is None:
                    break
                placed.append(new)
            if len(placed) == 2:
                total = sum(p.tokens_per_s or 0.0 for p in placed)
                if total > before + _GAIN and (best is None or total > best[0]):
                    best = (total, k)
            for p in placed:
                release(self.states, p)
        if best is None:
            claim(self.states, ra)
            claim(self.states, rb)
            return False
        for spot, r, to in orders[best[1]]:
            new = self.put(spot, r, to)
            assert new is not None
            self.commit(spot, r, new)
        return True

    def _elsewhere(self, spot: _Spot, r: ReplicaState, away: str) -> tuple[float, str, Profile | None, Need] | None:
        """Where `r` (released) may go of the nodes but `away`: the fastest that takes it on its
        own profile, else (`fall_back`) on the first of its fallbacks that one takes (that
        profile, None for its own); its speed there."""
        for profile, need in [(None, spot.need), *(spot.fallbacks if self.fall_back else ())]:
            best: tuple[float, str] | None = None
            for name, n in self.states.items():
                if name != away and self.allowed(spot, r, name) and fits(need, n, self.now, self.stale_s):
                    speed = round(speed_of(need, n), 1)
                    if best is None or speed > best[0]:
                        best = (speed, name)
            if best is not None:
                return (*best, profile, need)
        return None

    def _relocate(self, spot: _Spot, r: ReplicaState, to: str, profile: Profile | None, need: Need) -> _Move:
        """Put `r` (released) on node `to`, on `profile` (None: its own) of need `need`."""
        start: Start = self.starts[spot.index]
        was = (spot, r, start.profile, spot.need, spot.fallbacks)
        moved = relocated(r, start.model, profile or start.profile, need, self.states[to])
        if profile is not None:
            start.profile, spot.need = profile, need
            spot.fallbacks = spot.fallbacks[[p for p, _ in spot.fallbacks].index(profile) + 1 :]
        claim(self.states, moved)
        self.commit(spot, r, moved)
        return was

    def _clear(self, node: str, need: Need) -> list[_Move] | None:
        """Move starts off `node` until `need` fits there (those that lose least first, each
        where `_elsewhere` says): the moves made, or None (and none made) where it still does
        not fit."""
        n = self.states[node]
        holds = (lambda r: r.gpus) if need.cards else (lambda r: r.memory_mb or r.cores)
        losses = []
        for spot in self.spots:
            r = self.replica(spot)
            if r.node != node or not holds(r):
                continue
            release(self.states, r)
            if (to := self._elsewhere(spot, r, node)) is not None:
                losses.append(((r.tokens_per_s or 0.0) - to[0], spot.index, spot))
            claim(self.states, r)
        moves: list[_Move] = []
        for _, _, spot in sorted(losses, key=lambda e: e[:2]):
            if fits(need, n, self.now, self.stale_s):
                break
            r = self.replica(spot)
            release(self.states, r)
            if (to := self._elsewhere(spot, r, node)) is None:
                claim(self.states, r)
                continue
            moves.append(self._relocate(spot, r, *to[1:]))
        if fits(need, n, self.now, self.stale_s):
            return moves
        self.undo(moves)
        return None

    def undo(self, moves: list[_Move]) -> None:
        """Put the moved starts back as they were, the last moved first."""
        for spot, old, profile, need, fallbacks in reversed(moves):
            new = self.replica(spot)
            release(self.states, new)
            claim(self.states, old)
            self.commit(spot, new, old)
            self.starts[spot.index].profile, spot.need, spot.fallbacks = profile, need, fallbacks

    def room_for(self, need: Need) -> bool:
        """Make room for `need` on one node by moving starts off it (`_clear`): on the node where
        its speed less what the moved ones lose is highest; whether room was made."""
        best: tuple[float, str] | None = None
        held = {self.replica(spot).node for spot in self.spots}
        for name in self.states:
            if name not in held or (moves := self._clear(name, need)) is None:
                continue
            lost = sum((old.tokens_per_s or 0.0) - (self.replica(spot).tokens_per_s or 0.0) for spot, old, *_ in moves)
            gain = speed_of(need, self.states[name]) - lost
            self.undo(moves)
            if best is None or gain > best[0]:
                best = (gain, name)
        return best is not None and self._clear(best[1], need) is not None

    def sweep(self) -> bool:
        """Every move, then every trade of two models' replicas needing as many cards; whether any was made."""
        changed = False
        for spot in self.spots:
            changed |= self.moves and self.move(spot)
        for i, a in enumerate(self.spots):
            for b in self.spots[i + 1 :]:
                if a.need.cards == b.need.cards and self.replica(a).model != self.replica(b).model:
                    changed |= self.swap(a, b)
        return changed


def relocated(r: ReplicaState, model: Model, profile: Profile, need: Need, n: NodeState) -> ReplicaState:
    """The start `r` of `model` moved to node `n` (on the cards the agent's rule takes there),
    on `profile` of need `need` (its own or another of its model's)."""
    changes = {"node": n.info.node, "gpus": cards_for(need, n), "tokens_per_s": round(speed_of(need, n), 1)}
    if profile.name != r.profile:
        changes |= {
            "profile": profile.name,
            "memory_mb": need.memory_mb,
            "cores": profile.cpu_cores or 0,
            "estimate_mb": need.estimate_mb,
            "fingerprint": fingerprints(model)[profile.name],
        }
    return msgspec.structs.replace(r, **changes)


def _improver(
    plan: Plan,
    states: dict[str, NodeState],
    now: float,
    policy: Policy,
    weights: dict[str, int],
    shapes: dict[str, Shape],
) -> _Improver | None:
    """The improver of a try's starts, or None where the pass is too big for it (one sweep's
    checks, the starts times the starts and the nodes, over `policy.improve`). Only the starts
    on one node where no stop of the plan frees room (a start there may be what the room was
    freed for) are open to change."""
    starts = plan.starts
    if not starts or len(starts) * (len(starts) + len(states)) > policy.improve:
        return None
    freed = {node for stop in plan.stops for node in spans(stop.replica)}

    def need(s: Start, profile: Profile) -> Need:
        return need_for(s.model, profile, weights, shapes)

    spots = []
    for i, s in enumerate(starts):
        if s.profile.nodes == 1 and s.replica.node not in freed:
            spot = _Spot(i, need(s, s.profile), s.model.source)
            if wanted_counts(s.model) is None:
                after = sorted(s.model.profiles, key=lambda p: -p.priority)
                after = after[[p.name for p in after].index(s.profile.name) + 1 :]
                spot.fallbacks = [(p, need(s, p)) for p in after if p.nodes == 1]
            spots.append(spot)
    return _Improver(starts, spots, states, now, policy.stale_s, policy.scoring.domain)


def improve(
    plan: Plan,
    states: dict[str, NodeState],
    now: float,
    policy: Policy,
    weights: dict[str, int],
    shapes: dict[str, Shape],
) -> None:
    """Improve a try's starts in place (`Start.replica` replaced, the node states kept in step)
    by moves and trades, until a sweep changes nothing or after `SWEEPS`; under binpack scoring
    only by trades (a move would unpack). Only in passes small enough (`_improver`) where speed
    counts. `weights` and `shapes` are the files' sizes and shapes, for the starts' needs."""
    if policy.scoring.speed <= 0 or (improver := _improver(plan, states, now, policy, weights, shapes)) is None:
        return
    improver.moves = policy.scoring.mode != "binpack"
    for _ in range(SWEEPS):
        if not improver.sweep():
            break


def make_room(  # noqa: PLR0913 - improve's arguments and the need
    plan: Plan,
    states: dict[str, NodeState],
    now: float,
    policy: Policy,
    weights: dict[str, int],
    shapes: dict[str, Shape],
    need: Need,
    *,
    fall_back: bool = False,
) -> bool:
    """Make a node take `need` (a replica that fits nowhere) by moving starts of the plan off it,
    each to another node that takes it: where the replica's speed less what the moved ones lose
    is highest; with `fall_back`, a moved one may go on a lower-priority profile of its model.
    Whether room was made (then a placement of `need` finds that node). Only in passes small
    enough (`_improver`), for a replica on one node."""
    if need.profile.nodes != 1 or (improver := _improver(plan, states, now, policy, weights, shapes)) is None:
        return False
    improver.fall_back = fall_back
    return improver.room_for(need)
