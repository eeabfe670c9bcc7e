"""The scorers: a raw figure per node, higher is better, normalised across the candidates to
0-100 and weighted."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import msgspec

from llmgw.modelplan import (
    DEFAULT_CPU,
    active_type_bytes,
    card_of,
    cpu_threads,
    cpu_tokens_per_second,
    gpu_tokens_per_second,
)
from llmgw.proto import Model, ReplicaState
from llmgw.scheduler.placement._filters import chosen_cards
from llmgw.scheduler.placement._room import Need, NodeState

__all__ = ["SCORERS", "Scorer", "Weights", "scores", "speed_of"]


class Weights(msgspec.Struct, frozen=True, kw_only=True):
    """How much each scorer counts; `pack` chooses binpack (fill nodes) or spread (leave room)."""

    speed: float = 3.0
    pack: float = 1.0
    weights_present: float = 1.0
    domain_spread: float = 1.0
    mode: Literal["binpack", "spread"] = "spread"
    domain: str = "rack"
    """The label whose values are failure domains."""


Scorer = Callable[[Need, NodeState, Model, Weights, dict[str, int]], float]
"""(need, node, model, weights, replicas of the model per failure domain) -> a raw figure."""


def _speed(need: Need, n: NodeState, model: Model, w: Weights, domains: dict[str, int]) -> float:
    """Tokens a second of one reply this way on this node (modelplan): its cards' bandwidth, or
    its memory's and the threads the replica is given, calibrated where the agent reports it."""
    if need.cards:
        cards = chosen_cards(need, n) or []
        return _card_speed(need.read_bytes, cards[0].cls if cards else "", need.cards, need.profile.engine == "vllm")
    threads = cpu_threads(need.profile.cpu_cores, n.info.cpus)
    shape = need.shape
    return cpu_tokens_per_second(
        need.read_bytes,
        n.info.membw_all_gbs or 0.0,
        n.info.membw_one_gbs,
        threads,
        n.info.cpu_calibration or DEFAULT_CPU,
        type_bytes=_share(active_type_bytes(shape), need.read_bytes) if shape else None,
        layers=shape.layers if shape else 0,
    )


def _share(type_bytes: dict[str, int], read_bytes: int) -> dict[str, int]:
    """`type_bytes` scaled to what this replica reads a token (its share, across nodes)."""
    total = sum(type_bytes.values())
    return {t: b * read_bytes // total for t, b in type_bytes.items()} if total else {}


def speed_of(need: Need, n: NodeState) -> float:
    """Tokens a second of one reply of `need` on node `n` (what the speed scorer ranks by)."""
    return _speed(need, n, None, Weights(), {})


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


def scores(
    need: Need, model: Model, nodes: dict[str, NodeState], fit: list[str], w: Weights, peers: list[ReplicaState] | None
) -> tuple[list[float], dict[str, list[float]]]:
    """Each fitting node's weighted total and each scorer's normalised part. `peers` are the
    model's live replicas (None: found on `nodes`), counted per failure domain."""
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
