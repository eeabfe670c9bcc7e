"""What a replica needs and what each node has free: needs, node states, claims and releases."""

from __future__ import annotations

import msgspec

from llmgw.modelplan import FOREIGN_LIMIT_MB
from llmgw.proto import GpuInfo, NodeInfo, Profile, ReplicaState, Worker

__all__ = [
    "CARD_HEADROOM_MB",
    "LIVE",
    "STARTING",
    "Need",
    "NodeState",
    "Placement",
    "claim",
    "hold",
    "need_of",
    "node_states",
    "release",
    "spans",
]

LIVE = ("pending", "fetching", "starting", "ready")
"""States of a replica that holds room."""
STARTING = ("pending", "fetching", "starting")
"""States in which a replica's memory is not yet out of what its node reports available."""
CARD_HEADROOM_MB = 1024
"""Per card beyond the weights' share: context, KV and compute buffers of a small context."""


class Need(msgspec.Struct, frozen=True, kw_only=True):
    """What one replica of a profile takes."""

    profile: Profile
    memory_mb: int
    """Host memory (a CPU profile), claimed on the node."""
    cards: int
    card_mb: int
    """Memory each card must have free."""
    read_bytes: int
    """What a token reads: for the speed scorer."""
    card_choice: tuple = ()
    """All that decides which of a node's free cards it takes: what `llmgw.modelplan`'s card
    rules read (the profile's count, class, card memory and compute, and the memory each card
    must have free). Needs alike in it take alike cards: a node keeps its choice for each."""


class NodeState(msgspec.Struct, kw_only=True):
    """A node as placement sees it now."""

    info: NodeInfo
    last_seen: float
    weights: list[str] = msgspec.field(default_factory=list)
    free_mb: int = 0
    free_cards: list[GpuInfo] = msgspec.field(default_factory=list)
    cores_held: int = 0
    """Cores the live replicas here reserve, and those being stopped."""
    stopping_cards: frozenset[str] = frozenset()
    """Cards replicas being stopped still hold: none is given back by another's release."""
    chosen: dict[tuple, list[GpuInfo] | None] | None = None
    """`Need.card_choice` -> the cards such a replica takes here (None: too few free): the
    filter, the scorers and the placement ask in turn, placement after placement. Dropped
    (never changed in place: a trial copy shares it) whenever the free cards change."""
    replicas: list[ReplicaState] = msgspec.field(default_factory=list)
    """Live replicas placed here, or with a worker here (every model)."""


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """Where a replica goes: the node and the cards it holds there (and, across nodes, its workers)."""

    node: str
    cards: list[str] = msgspec.field(default_factory=list)
    scores: dict[str, float] = msgspec.field(default_factory=dict)
    workers: list[Worker] = msgspec.field(default_factory=list)


def need_of(profile: Profile, weights_bytes: int) -> Need:
    """What one replica of `profile` takes on each of its nodes for a file of `weights_bytes`.

    On the CPU: the profile's host memory, else the weights plus 10% and 256 MiB. On cards: the
    weights split over them plus 10% and a headroom each.
    Across nodes, each node's share is the weights split evenly between them; the profile's
    host memory, where it gives one, is each node's.
    """
    share = weights_bytes // profile.nodes
    if profile.gpus:
        per_card = int(share * 1.1 / profile.gpus / 2**20) + CARD_HEADROOM_MB
        return Need(
            profile=profile,
            memory_mb=profile.host_memory_mb or 0,
            cards=profile.gpus,
            card_mb=per_card,
            read_bytes=share,
            card_choice=(profile.gpus, profile.gpu_class, profile.min_card_mb, profile.min_compute, per_card),
        )
    memory = profile.host_memory_mb if profile.host_memory_mb is not None else int(share * 1.1 / 2**20) + 256
    return Need(profile=profile, memory_mb=memory, cards=0, card_mb=0, read_bytes=share)


def node_states(
    nodes: dict[str, tuple[NodeInfo, float, list[str]]], replicas: list[ReplicaState], reserve_mb: int
) -> dict[str, NodeState]:
    """Each node's free capacity, by node name in order: available memory less the claims of
    replicas still starting and a reserve; cards no live replica holds and no foreign process
    crowds (`llmgw.modelplan.FOREIGN_LIMIT_MB`)."""
    out = {}
    for name, (info, seen, held) in sorted(nodes.items()):
        out[name] = NodeState(
            info=info,
            last_seen=seen,
            weights=held,
            free_mb=info.memory_available_mb - reserve_mb,
            free_cards=[g for g in info.gpus if g.memory_foreign_mb < FOREIGN_LIMIT_MB],
        )
    for r in replicas:
        if r.state in LIVE:
            claim(out, r)
    return out


def spans(r: ReplicaState) -> list[str]:
    """The nodes a replica takes room on: its own, then its workers'."""
    return [r.node, *(w.node for w in r.workers)] if r.workers else [r.node]


def _piece(r: ReplicaState, node: str) -> ReplicaState | Worker:
    """What `r` holds on `node` (its memory_mb, cores and gpus)."""
    return r if node == r.node else next(w for w in r.workers if w.node == node)


def claim(nodes: dict[str, NodeState], r: ReplicaState) -> None:
    """Count a live replica on each of its nodes: its cores and cards, and its memory while it
    starts (a ready engine's memory is already out of what the node reports available)."""
    for name in spans(r):
        n = nodes.get(name)
        if n is None:
            continue
        piece = _piece(r, name)
        n.replicas.append(r)
        n.cores_held += piece.cores
        if r.state in STARTING:
            n.free_mb -= piece.memory_mb
        if piece.gpus:
            n.free_cards = [g for g in n.free_cards if g.uuid not in piece.gpus]
            n.chosen = None


def hold(nodes: dict[str, NodeState], r: ReplicaState) -> None:
    """Keep what a replica being stopped still holds on each of its nodes, its cores and cards,
    until its agents stopped it. Its memory is out of what the node reports available while
    its engine runs; it is no replica of the node's to score against or to preempt."""
    for name in spans(r):
        n = nodes.get(name)
        if n is None:
            continue
        piece = _piece(r, name)
        n.cores_held += piece.cores
        if piece.gpus:
            n.stopping_cards = n.stopping_cards.union(piece.gpus)
            n.free_cards = [g for g in n.free_cards if g.uuid not in piece.gpus]
            n.chosen = None


def release(nodes: dict[str, NodeState], r: ReplicaState) -> None:
    """Give back what a replica being stopped holds on each of its nodes: a ready one's memory
    returns when its engine stops, a starting one's claim at once; either way it is free for
    this plan."""
    for name in spans(r):
        n = nodes.get(name)
        if n is None:
            continue
        piece = _piece(r, name)
        n.replicas = [x for x in n.replicas if x.id != r.id]
        n.free_mb += piece.memory_mb
        n.cores_held -= piece.cores
        if piece.gpus:
            back = {g.uuid for g in n.free_cards} | (set(piece.gpus) - n.stopping_cards)
            n.free_cards = [g for g in n.info.gpus if g.uuid in back]
            n.chosen = None
