"""Placement as a declared chain of small plugins: filters say why a node cannot take a replica,
scorers rank those that can (each normalised to 0-100, then weighted). Pure: no I/O, no clock.

A replica's need is its profile's: host memory and cores on the CPU, or a number of free cards
of a class with enough memory each. Capacity is what is free now: memory the node reports as
available less what replicas still starting here have claimed, and cards no replica holds and
no foreign process fills.

A profile across several nodes needs that many nodes that each fit its share (the weights split
between them), within one rack (row, site) where it says so: the nodes scored best together.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import msgspec

from llmgw.modelplan import DEFAULT_CPU, card_fits, card_of, cpu_threads, cpu_tokens_per_second, gpu_tokens_per_second
from llmgw.proto import GpuInfo, Model, NodeInfo, Profile, ReplicaState, Worker

__all__ = [
    "FILTERS",
    "SCORERS",
    "Need",
    "NodeState",
    "Placement",
    "Weights",
    "claim",
    "need_of",
    "node_states",
    "place",
    "release",
    "spans",
]

LIVE = ("pending", "fetching", "starting", "ready")
STARTING = ("pending", "fetching", "starting")
FOREIGN_LIMIT_MB = 1024
"""A card holding more than this for processes not ours is not free."""
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


class NodeState(msgspec.Struct, kw_only=True):
    """A node as placement sees it now."""

    info: NodeInfo
    last_seen: float
    weights: list[str] = msgspec.field(default_factory=list)
    free_mb: int = 0
    free_cards: list[GpuInfo] = msgspec.field(default_factory=list)
    cores_held: int = 0
    """Cores the live replicas here reserve."""
    fitting: tuple[Need, list[GpuInfo]] | None = None
    """The free cards that fit the need last asked about: the filter and the scorers ask in turn."""
    replicas: list[ReplicaState] = msgspec.field(default_factory=list)
    """Live replicas placed here, or with a worker here (every model)."""


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """Where a replica goes: the node and the cards it holds there (and, across nodes, its workers)."""

    node: str
    cards: list[str] = msgspec.field(default_factory=list)
    scores: dict[str, float] = msgspec.field(default_factory=dict)
    workers: list[Worker] = msgspec.field(default_factory=list)


class Weights(msgspec.Struct, frozen=True, kw_only=True):
    """How much each scorer counts; `pack` chooses binpack (fill nodes) or spread (leave room)."""

    speed: float = 3.0
    pack: float = 1.0
    weights_present: float = 1.0
    domain_spread: float = 1.0
    mode: Literal["binpack", "spread"] = "spread"
    domain: str = "rack"
    """The label whose values are failure domains."""


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
        )
    memory = profile.host_memory_mb if profile.host_memory_mb is not None else int(share * 1.1 / 2**20) + 256
    return Need(profile=profile, memory_mb=memory, cards=0, card_mb=0, read_bytes=share)


def node_states(
    nodes: dict[str, tuple[NodeInfo, float, list[str]]], replicas: list[ReplicaState], reserve_mb: int
) -> dict[str, NodeState]:
    """Each node's free capacity, by node name in order: available memory less the claims of
    replicas still starting and a reserve; cards no live replica holds."""
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
            n.fitting = None


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
            back = {g.uuid for g in n.free_cards} | set(piece.gpus)
            n.free_cards = [g for g in n.info.gpus if g.uuid in back]
            n.fitting = None


# -- filters: None if the node can take it, else why not -------------------------------------
Filter = Callable[[Need, NodeState, float, float], str | None]


def _ready(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    age = now - n.last_seen
    return f"no heartbeat for {age:.0f}s" if age > stale_s else None


def _labels(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if not need.profile.node_selector:
        return None
    wrong = [f"{k}={v}" for k, v in need.profile.node_selector.items() if n.info.labels.get(k) != v]
    return f"lacks the labels {', '.join(wrong)}" if wrong else None


def _engine(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if n.info.engines and need.profile.engine not in n.info.engines:
        return f"has no {need.profile.engine} (has {', '.join(sorted(n.info.engines))})"
    if need.profile.nodes > 1 and n.info.engines and f"{need.profile.engine}-rpc" not in n.info.engines:
        return f"has no {need.profile.engine} RPC worker, which a replica across nodes needs (-DGGML_RPC=ON)"
    return None


def _fitting_cards(need: Need, n: NodeState) -> list[GpuInfo]:
    """Free cards of the profile's class (any, if it names none) with the memory each needs."""
    if n.fitting is not None and n.fitting[0] is need:
        return n.fitting[1]
    p = need.profile
    if p.min_card_mb or p.min_compute:
        out = [
            g
            for g in n.free_cards
            if card_fits(p, g) is None and g.memory_total_mb - g.memory_foreign_mb >= need.card_mb
        ]
    else:
        out = [
            g
            for g in n.free_cards
            if (not p.gpu_class or g.cls == p.gpu_class)  # the common case, inline
            and g.memory_total_mb - g.memory_foreign_mb >= need.card_mb
        ]
    n.fitting = (need, out)
    return out


def _cards(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if not need.cards:
        return None
    fit = _fitting_cards(need, n)
    if not _enough(fit, need.cards):
        wanted = need.profile.gpu_class or "any class"
        unfit = next((why for g in n.info.gpus if (why := card_fits(need.profile, g))), None)
        return (
            f"needs {need.cards} free {wanted} cards of {need.card_mb} MiB; has {len(fit)} "
            f"(of {len(n.info.gpus)})" + (f"; its cards: {unfit}" if unfit else "")
        )
    return None


def _memory(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if need.memory_mb > n.free_mb:
        return f"needs {need.memory_mb} MiB, {max(n.free_mb, 0)} MiB free"
    return None


def _cores(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    cores, free = need.profile.cpu_cores, n.info.cpus - n.cores_held
    if cores and cores > free:
        return f"needs {cores} cores, {max(free, 0)} of {n.info.cpus} free"
    return None


def _keep_within(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    label = need.profile.keep_within
    if label and label not in n.info.labels:
        return f"has no '{label}' label, and this profile keeps its nodes within one {label}"
    return None


FILTERS: list[tuple[str, Filter]] = [
    ("ready", _ready),
    ("labels", _labels),
    ("engine", _engine),
    ("cards", _cards),
    ("memory", _memory),
    ("cores", _cores),
    ("keep_within", _keep_within),
]
"""The filter chain, in order; the first that refuses a node gives its reason."""


def _enough(cards: list[GpuInfo], count: int) -> bool:
    """Some class has `count` of these cards."""
    if len(cards) < count:
        return False
    seen: dict[str, int] = {}
    for g in cards:
        seen[g.cls] = seen.get(g.cls, 0) + 1
        if seen[g.cls] >= count:
            return True
    return False


def _best_class(cards: list[GpuInfo], count: int) -> list[GpuInfo] | None:
    """`count` cards of one class, those linked to most of the others first; None if no class has enough."""
    by_class: dict[str, list[GpuInfo]] = {}
    for g in cards:
        by_class.setdefault(g.cls, []).append(g)
    for group in by_class.values():
        if len(group) >= count:
            if count == 1 or not any(g.nvlink_peers for g in group):
                return group[:count]
            uuids = {c.uuid for c in group}
            return sorted(group, key=lambda g: -len(uuids.intersection(g.nvlink_peers)))[:count]
    return None


# -- scorers: a raw figure, higher is better; normalised across the candidates ---------------
Scorer = Callable[[Need, NodeState, Model, Weights, dict[str, int]], float]


def _speed(need: Need, n: NodeState, model: Model, w: Weights, domains: dict[str, int]) -> float:
    """Tokens a second of one reply this way on this node (modelplan): its cards' bandwidth, or
    its memory's and the threads the replica is given, calibrated where the agent reports it."""
    if need.cards:
        cards = _best_class(_fitting_cards(need, n), need.cards) or []
        return _card_speed(need.read_bytes, cards[0].cls if cards else "", need.cards, need.profile.engine == "vllm")
    threads = cpu_threads(need.profile.cpu_cores, n.info.cpus)
    return cpu_tokens_per_second(
        need.read_bytes,
        n.info.membw_all_gbs or 0.0,
        n.info.membw_one_gbs,
        threads,
        n.info.cpu_calibration or DEFAULT_CPU,
    )


@functools.lru_cache(maxsize=4096)
def _card_speed(read_bytes: int, cls: str, cards: int, tensor_parallel: bool) -> float:
    """The same on every node with these cards: worked out once."""
    card = card_of(cls) if cls else None
    return gpu_tokens_per_second(
        read_bytes, 0, card.bandwidth_gbs if card else 0.0, cards, tensor_parallel=tensor_parallel
    )


def _pack(need: Need, n: NodeState, model: Model, w: Weights, domains: dict[str, int]) -> float:
    """Binpack prefers the node left fullest; spread the one left emptiest (a card counts 1 GiB)."""
    left = n.free_mb - need.memory_mb + 1024 * (len(n.free_cards) - need.cards)
    return -left if w.mode == "binpack" else left


def _weights_present(need: Need, n: NodeState, model: Model, w: Weights, domains: dict[str, int]) -> float:
    """The node already holds the file: no fetch."""
    return 1.0 if model.source in n.weights else 0.0


def _domain_spread(need: Need, n: NodeState, model: Model, w: Weights, domains: dict[str, int]) -> float:
    """Fewer replicas of this model in the node's failure domain is better (a preference only)."""
    return -float(domains.get(_domain(n, w), 0))


def _domain(n: NodeState, w: Weights) -> str:
    return n.info.labels.get(w.domain, n.info.node)


SCORERS: list[tuple[str, Scorer, Callable[[Weights], float]]] = [
    ("speed", _speed, lambda w: w.speed),
    ("pack", _pack, lambda w: w.pack),
    ("weights", _weights_present, lambda w: w.weights_present),
    ("domain", _domain_spread, lambda w: w.domain_spread),
]
"""The scorers and their weights."""


def _normalise(raw: list[float]) -> list[float]:
    """Onto 0-100 across the candidates: the best 100, the worst 0 (all 100 when they tie)."""
    lo, hi = min(raw), max(raw)
    if hi == lo:
        return [100.0] * len(raw)
    scale = 100.0 / (hi - lo)
    return [(v - lo) * scale for v in raw]


def _fits(
    need: Need, nodes: dict[str, NodeState], now: float, stale_s: float, limit: int, start: int
) -> tuple[list[str], dict[str, str]]:
    """The nodes that pass every filter (at most `limit`, scanning from the `start`-th and
    wrapping), and why each refused node refused (filter: reason)."""
    reasons: dict[str, str] = {}
    fit = []
    names = list(nodes)
    if start % max(len(names), 1):
        names = names[start % len(names) :] + names[: start % len(names)]
    for name in names:
        n = nodes[name]
        for label, f in FILTERS:
            why = f(need, n, now, stale_s)
            if why:
                reasons[name] = f"{label}: {why}"
                break
        else:
            fit.append(name)
            if limit and len(fit) >= limit:
                break
    return fit, reasons


def _scores(
    need: Need, model: Model, nodes: dict[str, NodeState], fit: list[str], w: Weights, peers: list[ReplicaState] | None
) -> tuple[list[float], dict[str, list[float]]]:
    """Each fitting node's weighted total and each scorer's normalised part."""
    if peers is None:
        peers = [r for n in nodes.values() for r in n.replicas if r.model == model.name]
    domains: dict[str, int] = {}
    for r in peers:
        d = _domain(nodes[r.node], w) if r.node in nodes else r.node
        domains[d] = domains.get(d, 0) + 1
    candidates = [nodes[n] for n in fit]
    total = [0.0] * len(fit)
    parts: dict[str, list[float]] = {}
    for label, scorer, weight in SCORERS:
        if weight(w):
            parts[label] = normalised = _normalise([scorer(need, n, model, w, domains) for n in candidates])
            total = [t + weight(w) * s for t, s in zip(total, normalised, strict=True)]
    return total, parts


def _cards_for(need: Need, n: NodeState) -> list[str]:
    return [g.uuid for g in _best_class(_fitting_cards(need, n), need.cards) or []] if need.cards else []


def place(
    need: Need,
    model: Model,
    nodes: dict[str, NodeState],
    now: float,
    stale_s: float,
    w: Weights = Weights(),
    peers: list[ReplicaState] | None = None,
    limit: int = 0,
    start: int = 0,
) -> tuple[Placement | None, dict[str, str]]:
    """The best node for one replica (the best nodes, for a profile across several), or None;
    and why each refused node refused (filter: reason).

    `peers` are the model's live replicas (for the domain spread; default: found on `nodes`).
    With a `limit`, the scan stops at that many nodes that fit, starting at the `start`-th node
    and wrapping (Kubernetes' percentage of nodes to score): a big fleet is not scored whole for
    every replica, and successive placements look at different nodes.
    """
    if need.profile.nodes > 1:
        return _place_across(need, model, nodes, now, stale_s, w, peers)
    fit, reasons = _fits(need, nodes, now, stale_s, limit, start)
    if not fit:
        return None, reasons
    total, parts = _scores(need, model, nodes, fit, w, peers)
    i = max(range(len(fit)), key=lambda i: (total[i], fit[i]))
    best = fit[i]
    return Placement(
        node=best, cards=_cards_for(need, nodes[best]), scores={k: round(v[i], 1) for k, v in parts.items()}
    ), reasons


def _place_across(
    need: Need,
    model: Model,
    nodes: dict[str, NodeState],
    now: float,
    stale_s: float,
    w: Weights,
    peers: list[ReplicaState] | None,
) -> tuple[Placement | None, dict[str, str]]:
    """`need.profile.nodes` nodes that each fit a share, within one value of its `keep_within`
    label if it has one: in the group whose best nodes score highest together, those nodes. The
    engine runs on the best of them, workers on the rest. Every fitting node is scored."""
    count, label = need.profile.nodes, need.profile.keep_within
    fit, reasons = _fits(need, nodes, now, stale_s, 0, 0)
    total, parts = _scores(need, model, nodes, fit, w, peers) if fit else ([], {})
    score = dict(zip(fit, total, strict=True))
    groups: dict[str, list[str]] = {}
    for name in fit:
        groups.setdefault(nodes[name].info.labels[label] if label else "", []).append(name)
    best: list[str] = []
    for members in groups.values():
        members.sort(key=lambda n: (-score[n], n))
        if len(members) >= count and (not best or sum(score[n] for n in members[:count]) > sum(score[n] for n in best)):
            best = members[:count]
    if not best:
        most = max(groups.items(), key=lambda kv: len(kv[1]), default=("", []))
        where = f" within one {label} (most in one: {len(most[1])}, {label}={most[0]})" if label and fit else ""
        reasons["together"] = f"nodes: needs {count} nodes that fit{where}; {len(fit)} fit"
        return None, reasons
    head = best[0]
    i = fit.index(head)
    workers = [
        Worker(node=n, memory_mb=need.memory_mb, cores=need.profile.cpu_cores or 0, gpus=_cards_for(need, nodes[n]))
        for n in best[1:]
    ]
    return Placement(
        node=head,
        cards=_cards_for(need, nodes[head]),
        workers=workers,
        scores={k: round(v[i], 1) for k, v in parts.items()},
    ), reasons
