"""After a try's greedy pass, a local improvement of what it starts: a replica moved to a node
where it answers faster, or two replicas trading places (nodes, or card classes on one node),
wherever the predicted tokens a second of the replicas started rise and every filter still
passes. Each keeps its profile (the highest-priority one that fitted stays its profile), and
none moves away from a node holding its file or into a failure domain holding more of its
model than the one it leaves. Pure and deterministic: the starts in plan order, the nodes in
name order; a change is made only where the total strictly rises, so it ends."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from llmgw.modelplan import Shape
from llmgw.proto import ReplicaState
from llmgw.scheduler.core._plan import Plan, Policy
from llmgw.scheduler.placement import Need, NodeState, cards_for, claim, fits, need_of, release, spans, speed_of

__all__ = ["SWEEPS", "improve"]

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


class _Improver:
    """The moves and trades of one try's starts, over the pass's node states."""

    def __init__(
        self, starts: list, spots: list[_Spot], states: dict[str, NodeState], now: float, stale_s: float, domain: str
    ):
        self.starts, self.spots, self.states = starts, spots, states
        self.now, self.stale_s, self.domain = now, stale_s, domain
        self.moves = True
        self.domains: dict[tuple[str, str], int] = {}
        for n in states.values():
            for r in n.replicas:
                if r.node == n.info.node:
                    key = (r.model, self._domain(r.node))
                    self.domains[key] = self.domains.get(key, 0) + 1

    def _domain(self, node: str) -> str:
        n = self.states.get(node)
        return n.info.labels.get(self.domain, node) if n is not None else node

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
    only by trades (a move would unpack). Only where a sweep's checks (the starts times the
    starts and the nodes) are within `policy.improve` and speed counts; only the starts on one
    node where no stop of the plan frees room (a start there may be what the room was freed for).
    `weights` and `shapes` are the files' sizes and shapes, for the starts' needs."""
    starts = plan.starts
    if not starts or len(starts) * (len(starts) + len(states)) > policy.improve or policy.scoring.speed <= 0:
        return
    freed = {node for stop in plan.stops for node in spans(stop.replica)}
    spots = [
        _Spot(
            i, need_of(s.profile, weights[s.model.source], shapes.get(s.model.source), s.model.context), s.model.source
        )
        for i, s in enumerate(starts)
        if s.profile.nodes == 1 and s.replica.node not in freed
    ]
    improver = _Improver(starts, spots, states, now, policy.stale_s, policy.scoring.domain)
    improver.moves = policy.scoring.mode != "binpack"
    for _ in range(SWEEPS):
        if not improver.sweep():
            break
