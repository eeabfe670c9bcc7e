"""What a replica needs and what each node has free: needs, node states, claims and releases."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import msgspec

from llmgw.modelplan import KV_CACHE_TYPES, Memory, Shape, card_room, experts_on_host_mb, llamacpp_memory
from llmgw.proto import GpuInfo, Model, NodeInfo, Profile, ReplicaState, Worker

__all__ = [
    "CARD_HEADROOM_MB",
    "LIVE",
    "STARTING",
    "Need",
    "NodeState",
    "Placement",
    "Rooms",
    "claim",
    "domain_of",
    "hold",
    "kv_cache_type",
    "longest_context",
    "need_for",
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


# gc=False: never part of a reference cycle (a profile, a shape, figures)
class Need(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one replica of a profile takes."""

    profile: Profile
    memory_mb: int
    """Host memory (a CPU profile), claimed on the node."""
    cards: int
    card_mb: int
    """Memory each card must have free."""
    read_bytes: int
    """What a token reads: for the speed scorer."""
    card_choice: str = ""
    """All that decides which of a node's free cards it takes: what `llmgw.modelplan`'s card
    rules read (the profile's count, class, card memory and compute, and the memory each card
    must have free), written out. Needs alike in it take alike cards: a node keeps its choice
    for each (a string: its hash is worked out once, not on every node a scan asks)."""
    estimate_mb: int = 0
    """All one replica takes, MiB: host memory on the CPU, every card's together on cards."""
    sizing: str = ""
    """What the need is made of (weights, KV for the context, buffers), for a parked model's reason."""
    shape: Shape | None = None
    """The model's shape, where its GGUF header was read: what `longest_context` reckons with."""
    context: int = 0


# gc=False: never part of a reference cycle; a pass holds one per node (see llmgw.proto.NodeInfo)
class NodeState(msgspec.Struct, kw_only=True, gc=False):
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
    chosen: dict[str, list[GpuInfo] | None] | None = None
    """`Need.card_choice` -> the cards such a replica takes here (None: too few free): the
    filter, the scorers and the placement ask in turn, placement after placement. Dropped
    (never changed in place: a trial copy shares it) whenever the free cards change."""
    replicas: list[ReplicaState] = msgspec.field(default_factory=list)
    """Live replicas placed here, or with a worker here (every model)."""


class Rooms(dict[str, NodeState]):
    """Every node's state by name, as `node_states` makes them: `claim`, `hold` and `release`
    tell the watcher (a pass's `placement.Index`, which keeps their free room in arrays) of each
    node they change. A copy (`dict(rooms)`, a trial) is a plain dict nobody watches.

    The watcher is held weakly: it holds the rooms, and a cycle between them would keep a whole
    pass's fleet alive until the garbage collector's next full pass."""

    watch: weakref.WeakMethod | None = None

    def watched_by(self, changed: Callable[[str], None]) -> weakref.WeakMethod:
        """Tell the bound method `changed` of each node changed from now on; the watch (while
        `watch` is it, no other watcher took over)."""
        self.watch = weakref.WeakMethod(changed)
        return self.watch


def _told(nodes: dict[str, NodeState], name: str) -> None:
    """Tell whoever watches `nodes` that node `name` changed."""
    watch = getattr(nodes, "watch", None)
    if watch is not None and (changed := watch()) is not None:
        changed(name)


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """Where a replica goes: the node and the cards it holds there (and, across nodes, its workers)."""

    node: str
    cards: list[str] = msgspec.field(default_factory=list)
    scores: dict[str, float] = msgspec.field(default_factory=dict)
    workers: list[Worker] = msgspec.field(default_factory=list)


_CACHE_FLAGS = {"-ctk": "k", "--cache-type-k": "k", "-ctv": "v", "--cache-type-v": "v"}


def kv_cache_type(profile: Profile) -> str:
    """The KV cache's element type the profile's engine args give (-ctk/-ctv): the wider of
    keys' and values', f16 where neither is given or a type is not one modelplan knows."""
    given = []
    for i, arg in enumerate(profile.args):
        flag, eq, value = arg.partition("=")
        if flag in _CACHE_FLAGS:
            given.append(value if eq else (profile.args[i + 1] if i + 1 < len(profile.args) else ""))
    known = [t for t in given if t in KV_CACHE_TYPES]
    if not known or len(known) < len(given):
        return "f16"
    return max(known, key=lambda t: KV_CACHE_TYPES[t])


def _estimate(profile: Profile, shape: Shape, context: int) -> Memory:
    """The modelplan estimate for a llama.cpp replica, on each of its cards (or nodes' shares)."""
    parts = max(profile.gpus, 1) * profile.nodes
    moe = profile.cpu_moe_layers if profile.gpus else 0
    return llamacpp_memory(shape, context, profile.slots, parts, kv_cache_type(profile), cpu_moe=moe)


def _says(m: Memory, context: int, slots: int, per: str) -> str:
    mib = 2**20
    return (
        f"weights {m.weights // mib} MiB + KV {m.kv // mib} MiB for a context of {context} in {slots} slots"
        f" + buffers {(m.compute + m.margin) // mib} MiB{per}"
    )


def longest_context(need: Need, have_mb: int) -> int:
    """The longest context (a multiple of 256) whose replica would fit in `have_mb` (on each
    card, on cards), shorter than the need's; 0 where even 256 would not, or no shape is known."""
    if need.shape is None or need.profile.host_memory_mb is not None and not need.cards:
        return 0
    low, high = 0, need.context // 256
    while low < high:
        mid = (low + high + 1) // 2
        if _estimate(need.profile, need.shape, mid * 256).mib <= have_mb:
            low = mid
        else:
            high = mid - 1
    return low * 256 if low * 256 < need.context else 0


def need_of(profile: Profile, weights_bytes: int, shape: Shape | None = None, context: int = 4096) -> Need:
    """What one replica of `profile` takes on each of its nodes for a file of `weights_bytes`.

    With the model's shape (its GGUF header) and llama.cpp: `llmgw.modelplan`'s estimate, the
    one `llmgw plan` gives: weights, the KV cache for `context` shared by the profile's slots at
    its cache type, compute buffers and a margin; on cards, each card's share; across nodes,
    each node's. The profile's host memory, where it gives one, is a CPU replica's; on cards with
    experts in host memory (`cpu_moe_layers`), those experts' memory is the node's to reserve.
    Without a shape (or on vLLM): on the CPU the profile's host memory, else the weights plus
    10% and 256 MiB; on cards the weights split over them plus 10% and a headroom each.
    """
    if shape is not None and profile.engine == "llamacpp":
        m = _estimate(profile, shape, context)
        per = " on each card" if profile.gpus else (" on each node" if profile.nodes > 1 else "")
        sized = {"sizing": _says(m, context, profile.slots, per), "shape": shape, "context": context}
        read = shape.active_bytes // profile.nodes
        if profile.gpus:
            host = profile.host_memory_mb
            if host is None:
                host = experts_on_host_mb(shape, profile.cpu_moe_layers)
            if profile.cpu_moe_layers:
                sized["sizing"] += f", and {host} MiB of experts in host memory"
            return _on_cards(profile, m.mib, read, host, **sized)
        memory = profile.host_memory_mb if profile.host_memory_mb is not None else m.mib
        return Need(profile=profile, memory_mb=memory, cards=0, card_mb=0, read_bytes=read, estimate_mb=memory, **sized)
    share = weights_bytes // profile.nodes
    if profile.gpus:
        per_card = int(share * 1.1 / profile.gpus / 2**20) + CARD_HEADROOM_MB
        return _on_cards(profile, per_card, share, profile.host_memory_mb or 0)
    memory = profile.host_memory_mb if profile.host_memory_mb is not None else int(share * 1.1 / 2**20) + 256
    return Need(profile=profile, memory_mb=memory, cards=0, card_mb=0, read_bytes=share, estimate_mb=memory)


def need_for(model: Model, profile: Profile, weights: dict[str, int], shapes: dict[str, Shape]) -> Need:
    """`need_of` one replica of `model`'s `profile`, its file's size (`weights`) and shape
    (`shapes`, where its header was read) by its source, at the model's context."""
    return need_of(profile, weights[model.source], shapes.get(model.source), model.context)


def _on_cards(profile: Profile, per_card: int, read: int, host_mb: int, **sized) -> Need:
    return Need(
        profile=profile,
        memory_mb=host_mb,
        cards=profile.gpus,
        card_mb=per_card,
        read_bytes=read,
        card_choice=repr((profile.gpus, profile.gpu_class, profile.min_card_mb, profile.min_compute, per_card)),
        estimate_mb=per_card * profile.gpus,
        **sized,
    )


def node_states(
    nodes: dict[str, tuple[NodeInfo, float, list[str]]], replicas: list[ReplicaState], reserve_mb: int
) -> Rooms:
    """Each node's free capacity, by node name in order: available memory less the claims of
    replicas still starting and a reserve; cards no live replica holds and no foreign process
    crowds (`llmgw.modelplan.FOREIGN_LIMIT_MB`)."""
    out = Rooms()
    for name, (info, seen, held) in sorted(nodes.items()):
        out[name] = NodeState(
            info=info,
            last_seen=seen,
            weights=held,
            free_mb=info.memory_available_mb - reserve_mb,
            free_cards=[g for g in info.gpus if card_room(g) is not None],
        )
    held: dict[str, set[str]] = {}  # the cards each node's replicas hold: its free cards filtered once
    for r in replicas:
        if r.state not in LIVE:
            continue
        starting = r.state in STARTING
        for name in spans(r):
            n = out.get(name)
            if n is None:
                continue
            piece = r if name == r.node else _piece(r, name)
            n.replicas.append(r)
            n.cores_held += piece.cores
            if starting:
                n.free_mb -= piece.memory_mb
            if piece.gpus:
                held.setdefault(name, set()).update(piece.gpus)
    for name, cards in held.items():
        n = out[name]
        n.free_cards = [g for g in n.free_cards if g.uuid not in cards]
    return out


def domain_of(n: NodeState, label: str) -> str:
    """The node's failure domain: its `label`'s value, else its own name."""
    return n.info.labels.get(label, n.info.node)


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
        _told(nodes, name)


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
        _told(nodes, name)


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
        _told(nodes, name)
