"""Placement as a declared chain of small plugins: filters say why a node cannot take a replica,
scorers rank those that can (each normalised to 0-100, then weighted). Pure: no I/O, no clock.

A replica's need is its profile's: host memory and cores on the CPU, or a number of free cards
of a class with enough memory each. Capacity is what is free now: memory the node reports as
available less what replicas still starting here have claimed, and cards no replica holds and
no foreign process fills.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from llmgw.modelplan import DEFAULT_CPU, card_of, cpu_threads, cpu_tokens_per_second, gpu_tokens_per_second
from llmgw.proto import GpuInfo, Model, NodeInfo, Profile, ReplicaState

__all__ = [
    "FILTERS",
    "SCORERS",
    "Need",
    "NodeState",
    "Placement",
    "Weights",
    "need_of",
    "node_states",
    "place",
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
    replicas: list[ReplicaState] = msgspec.field(default_factory=list)
    """Live replicas placed here (every model)."""


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """Where a replica goes: the node and the cards it holds there."""

    node: str
    cards: list[str] = msgspec.field(default_factory=list)
    scores: dict[str, float] = msgspec.field(default_factory=dict)


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
    """What one replica of `profile` takes for a file of `weights_bytes`.

    On the CPU: the profile's host memory, else the weights plus 10% and 256 MiB. On cards: the
    weights split over them plus 10% and a headroom each.
    """
    if profile.gpus:
        per_card = int(weights_bytes * 1.1 / profile.gpus / 2**20) + CARD_HEADROOM_MB
        return Need(profile=profile, memory_mb=profile.host_memory_mb or 0, cards=profile.gpus, card_mb=per_card,
                    read_bytes=weights_bytes)
    memory = profile.host_memory_mb if profile.host_memory_mb is not None else int(weights_bytes * 1.1 / 2**20) + 256
    return Need(profile=profile, memory_mb=memory, cards=0, card_mb=0, read_bytes=weights_bytes)


def node_states(nodes: dict[str, tuple[NodeInfo, float, list[str]]], replicas: list[ReplicaState],
                reserve_mb: int, freed: dict[str, int] | None = None) -> dict[str, NodeState]:
    """Each node's free capacity: available memory (plus what stops in this plan give back) less
    the claims of replicas still starting and a reserve; cards no live replica holds."""
    out = {}
    for name, (info, seen, held) in nodes.items():
        here = [r for r in replicas if r.node == name and r.state in LIVE]
        claimed = sum(r.memory_mb for r in here if r.state in STARTING)
        taken = {u for r in here for u in r.gpus}
        free_cards = [g for g in info.gpus if g.uuid not in taken and g.memory_foreign_mb < FOREIGN_LIMIT_MB]
        out[name] = NodeState(info=info, last_seen=seen, weights=held, replicas=here, free_cards=free_cards,
                              free_mb=info.memory_available_mb + (freed or {}).get(name, 0) - claimed - reserve_mb)
    return out


# -- filters: None if the node can take it, else why not -------------------------------------
Filter = Callable[[Need, NodeState, float, float], str | None]


def _ready(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    age = now - n.last_seen
    return f"no heartbeat for {age:.0f}s" if age > stale_s else None


def _labels(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    wrong = [f"{k}={v}" for k, v in need.profile.node_selector.items() if n.info.labels.get(k) != v]
    return f"lacks the labels {', '.join(wrong)}" if wrong else None


def _engine(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if n.info.engines and need.profile.engine not in n.info.engines:
        return f"has no {need.profile.engine} (has {', '.join(sorted(n.info.engines))})"
    return None


def _fitting_cards(need: Need, n: NodeState) -> list[GpuInfo]:
    """Free cards of the profile's class (any, if it names none) with the memory each needs."""
    return [g for g in n.free_cards if (not need.profile.gpu_class or g.cls == need.profile.gpu_class)
            and g.memory_total_mb - g.memory_foreign_mb >= need.card_mb]


def _cards(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if not need.cards:
        return None
    fit = _fitting_cards(need, n)
    if _best_class(fit, need.cards) is None:
        wanted = need.profile.gpu_class or "any class"
        return (f"needs {need.cards} free {wanted} cards of {need.card_mb} MiB; has {len(fit)} "
                f"(of {len(n.info.gpus)})")
    return None


def _memory(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    if need.memory_mb > n.free_mb:
        return f"needs {need.memory_mb} MiB, {max(n.free_mb, 0)} MiB free"
    return None


def _cores(need: Need, n: NodeState, now: float, stale_s: float) -> str | None:
    cores = need.profile.cpu_cores
    held = sum(r.cores for r in n.replicas)
    if cores and cores > n.info.cpus - held:
        return f"needs {cores} cores, {max(n.info.cpus - held, 0)} of {n.info.cpus} free"
    return None


FILTERS: list[tuple[str, Filter]] = [
    ("ready", _ready), ("labels", _labels), ("engine", _engine), ("cards", _cards), ("memory", _memory),
    ("cores", _cores),
]
"""The filter chain, in order; the first that refuses a node gives its reason."""


def _best_class(cards: list[GpuInfo], count: int) -> list[GpuInfo] | None:
    by_class: dict[str, list[GpuInfo]] = {}
    for g in cards:
        by_class.setdefault(g.cls, []).append(g)
    for group in by_class.values():
        if len(group) >= count:
            return sorted(group, key=lambda g: -len(set(g.nvlink_peers) & {c.uuid for c in group}))[:count]
    return None


# -- scorers: a raw figure, higher is better; normalised across the candidates ---------------
Scorer = Callable[[Need, NodeState, Model, Weights, dict[str, int]], float]


def _speed(need: Need, n: NodeState, model: Model, w: Weights, domains: dict[str, int]) -> float:
    """Tokens a second of one reply this way on this node (modelplan): its cards' bandwidth, or
    its memory's and the threads the replica is given, calibrated where the agent reports it."""
    if need.cards:
        cards = _best_class(_fitting_cards(need, n), need.cards) or []
        card = card_of(cards[0].cls) if cards else None
        return gpu_tokens_per_second(need.read_bytes, 0, card.bandwidth_gbs if card else 0.0, need.cards,
                                     tensor_parallel=need.profile.engine == "vllm")
    threads = cpu_threads(need.profile.cpu_cores, n.info.cpus)
    return cpu_tokens_per_second(need.read_bytes, n.info.membw_all_gbs or 0.0, n.info.membw_one_gbs, threads,
                                 n.info.cpu_calibration or DEFAULT_CPU)


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
    ("speed", _speed, lambda w: w.speed), ("pack", _pack, lambda w: w.pack),
    ("weights", _weights_present, lambda w: w.weights_present), ("domain", _domain_spread, lambda w: w.domain_spread),
]
"""The scorers and their weights."""


def _normalise(raw: dict[str, float]) -> dict[str, float]:
    lo, hi = min(raw.values()), max(raw.values())
    return {k: 100.0 if hi == lo else 100.0 * (v - lo) / (hi - lo) for k, v in raw.items()}


def place(need: Need, model: Model, nodes: dict[str, NodeState], now: float, stale_s: float,
          w: Weights = Weights()) -> tuple[Placement | None, dict[str, str]]:
    """The best node for one replica, or None; and why each refused node refused (filter: reason)."""
    reasons: dict[str, str] = {}
    fit = []
    for name, n in sorted(nodes.items()):
        for label, f in FILTERS:
            why = f(need, n, now, stale_s)
            if why:
                reasons[name] = f"{label}: {why}"
                break
        else:
            fit.append(name)
    if not fit:
        return None, reasons
    domains: dict[str, int] = {}
    for n in nodes.values():
        d = _domain(n, w)
        domains[d] = domains.get(d, 0) + sum(1 for r in n.replicas if r.model == model.name)
    total = dict.fromkeys(fit, 0.0)
    scores: dict[str, dict[str, float]] = {n: {} for n in fit}
    for label, scorer, weight in SCORERS:
        raw = {n: scorer(need, nodes[n], model, w, domains) for n in fit}
        for n, s in _normalise(raw).items():
            scores[n][label] = round(s, 1)
            total[n] += weight(w) * s
    best = max(fit, key=lambda n: (total[n], n))
    cards = [g.uuid for g in _best_class(_fitting_cards(need, nodes[best]), need.cards) or []] if need.cards else []
    return Placement(node=best, cards=cards, scores=scores[best]), reasons
