"""The scorers: a raw figure per node, higher is better, normalised across the candidates to
0-100 and weighted."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import msgspec
import numpy as np

from llmgw.modelplan import (
    DEFAULT_CPU,
    active_type_bytes,
    bytes_by_type,
    card_of,
    cpu_read_gbs,
    cpu_threads,
    cpu_token_costs,
    cpu_tokens_at,
    gpu_tokens_per_second,
    hybrid_tokens_per_second,
    kv_read_half_way,
)
from llmgw.proto import CpuCalibration, Model, ReplicaState
from llmgw.scheduler.placement._filters import chosen_cards
from llmgw.scheduler.placement._room import Need, NodeState, domain_of
from llmgw.scheduler.placement._table import Table, any_cards

__all__ = ["SCORERS", "Parts", "Scorer", "Weights", "scores", "speed_of"]


class Weights(msgspec.Struct, frozen=True, kw_only=True):
    """How much each scorer counts; `pack` chooses binpack (fill nodes) or spread (leave room)."""

    speed: float = 3.0
    pack: float = 1.0
    weights_present: float = 1.0
    domain_spread: float = 1.0
    mode: Literal["binpack", "spread"] = "spread"
    domain: str = "rack"
    """The label whose values are failure domains."""


Scorer = Callable[[Need, Table, np.ndarray, Model, Weights, dict[str, int]], np.ndarray | None]
"""(need, the candidates' table, their positions in it, model, weights, replicas of the model
per failure domain) -> a raw figure for each candidate (all at once: one call per placement),
or None where it knows they all tie."""


def _speed(need: Need, t: Table, at: np.ndarray, model: Model, w: Weights, domains: dict[str, int]) -> np.ndarray:
    """Tokens a second of one reply this way on each node (modelplan): its cards' bandwidth, or
    its memory's and the threads the replica is given, calibrated where the agent reports it."""
    if need.cards and need.profile.cpu_moe_layers and need.shape:  # both sides count: node by node
        return np.array([speed_of(need, t.states[j]) for j in at.tolist()])
    if need.cards:
        vllm, k = need.profile.engine == "vllm", need.cards - 1
        if any_cards(need):  # the class the fastest k free cards are of, where they have room enough
            classes = np.where(t.fast_room[k][at] >= need.card_mb, t.fast_class[k][at], -1)
        else:
            classes = t.card_class[at]
        key = (need.read_bytes, need.cards, vllm, len(t.classes))  # each class's speed, once a pass
        per_class = t.class_speeds.get(key)
        if per_class is None:
            speeds = [_card_speed(need.read_bytes, cls, need.cards, vllm) for cls in t.classes]
            per_class = t.class_speeds[key] = np.array(speeds or [0.0])
        out = per_class[classes]
        for j in (classes < 0).nonzero()[0].tolist():  # not told by the table: the cards it takes
            out[j] = speed_of(need, t.states[at[j]])
        return out
    key = _cpu_key(need)
    known = t.speeds.get(key)  # a node's figures stay all pass: its speed is worked out once
    if known is None:
        known = t.speeds[key] = np.full(len(t.states), np.nan)
    out = known[at]
    if len(missing := np.isnan(out).nonzero()[0]):
        i = at[missing]
        figures = zip(t.all_gbs[i].tolist(), t.one_gbs[i].tolist(), t.cpus[i].tolist(), strict=True)
        out[missing] = known[i] = [_cpu_at(key, f, t.calibration[n]) for f, n in zip(figures, i.tolist(), strict=True)]
    return out


def _cpu_at(key: tuple, figures: tuple, calibration: CpuCalibration | None) -> float:
    """A CPU replica's speed (`_cpu_key`) on a node of these figures and calibration."""
    read_bytes, cores, types, layers = key
    all_gbs, one_gbs, cpus = figures
    threads = cpu_threads(cores, cpus)
    if calibration is None:
        k, costs = DEFAULT_CPU, _cpu_costs(threads, types, read_bytes, layers)
    else:  # (a calibration is no key: worked out each time)
        k, costs = calibration, _cpu_costs.__wrapped__(threads, types, read_bytes, layers, calibration)
    return cpu_tokens_at(read_bytes, cpu_read_gbs(all_gbs, one_gbs, threads, k), costs, k)


@functools.lru_cache(maxsize=4096)
def _cpu_costs(
    threads: int, types: tuple | None, read_bytes: int, layers: int, calibration: CpuCalibration | None = None
) -> tuple[float, float]:
    """What a token of the need costs beside its reading, the same on every node of as many threads."""
    type_bytes = dict(types) if types is not None else None
    return cpu_token_costs(threads, calibration or DEFAULT_CPU, type_bytes, read_bytes, layers)


def _cpu_key(need: Need) -> tuple:
    """What a CPU replica's speed takes of its need, hashable."""
    shape = need.shape
    types = tuple(bytes_by_type(active_type_bytes(shape), need.read_bytes).items()) if shape else None
    return need.read_bytes, need.profile.cpu_cores, types, shape.layers if shape else 0


def speed_of(need: Need, n: NodeState) -> float:
    """Tokens a second of one reply of `need` on node `n` (what the speed scorer ranks by)."""
    i = n.info
    if need.cards:
        cards = chosen_cards(need, n)
        cls = cards[0].cls if cards else ""
        if need.profile.cpu_moe_layers and need.shape:
            return _experts_speed(need, cls, (i.membw_all_gbs or 0.0, i.membw_one_gbs, i.cpus), i.cpu_calibration)
        return _card_speed(need.read_bytes, cls, need.cards, need.profile.engine == "vllm")
    return _cpu_at(_cpu_key(need), (i.membw_all_gbs or 0.0, i.membw_one_gbs, i.cpus), i.cpu_calibration)


def _experts_speed(need: Need, cls: str, figures: tuple, calibration: CpuCalibration | None) -> float:
    """A replica on cards with some layers' experts in host memory: the card's side and the
    node's CPU side (`hybrid_tokens_per_second`), the KV cache read half-way into a slot."""
    shape, card = need.shape, card_of(cls) if cls else None
    assert shape is not None  # only needs with a shape have experts to place
    all_gbs, one_gbs, cpus = figures
    host = (all_gbs, one_gbs, cpu_threads(need.profile.cpu_cores, cpus))
    kv = kv_read_half_way(shape, need.context, need.profile.slots)
    bandwidth = card.bandwidth_gbs if card else 0.0
    return hybrid_tokens_per_second(shape, need.profile.cpu_moe_layers, kv, bandwidth, host, calibration or DEFAULT_CPU)


@functools.lru_cache(maxsize=4096)
def _card_speed(read_bytes: int, cls: str, cards: int, tensor_parallel: bool) -> float:
    """The same on every node with these cards: worked out once."""
    card = card_of(cls) if cls else None
    return gpu_tokens_per_second(
        read_bytes, 0, card.bandwidth_gbs if card else 0.0, cards, tensor_parallel=tensor_parallel
    )


def _pack(need: Need, t: Table, at: np.ndarray, model: Model, w: Weights, domains: dict[str, int]) -> np.ndarray:
    """Binpack prefers the node left fullest; spread the one left emptiest (a card counts 1 GiB)."""
    sign, taken = (-1 if w.mode == "binpack" else 1), need.memory_mb + 1024 * need.cards
    return sign * (t.free_mb[at] + 1024 * t.cards[at] - taken)


def _weights_present(
    need: Need, t: Table, at: np.ndarray, model: Model, w: Weights, domains: dict[str, int]
) -> np.ndarray | None:
    """The node already holds the file: no fetch."""
    held = t.holding(model.source)
    return np.fromiter((i in held for i in at.tolist()), float, len(at)) if held else None


def _domain_spread(
    need: Need, t: Table, at: np.ndarray, model: Model, w: Weights, domains: dict[str, int]
) -> np.ndarray | None:
    """Fewer replicas of this model in the node's failure domain is better (a preference only)."""
    if not domains:
        return None
    out = np.zeros(len(at))
    of, number = t.domains(w.domain)
    of = of[at]
    for domain, count in domains.items():
        if (k := number.get(domain)) is not None:
            out[of == k] = -float(count)
    return out


SCORERS: list[tuple[str, Scorer, Callable[[Weights], float]]] = [
    ("speed", _speed, lambda w: w.speed),
    ("pack", _pack, lambda w: w.pack),
    ("weights", _weights_present, lambda w: w.weights_present),
    ("domain", _domain_spread, lambda w: w.domain_spread),
]
"""The scorers and their weights."""


class Parts:
    """Each scorer's part of the candidates' totals, normalised onto 0-100 across them (the best
    100, the worst 0, all 100 when they tie): read for the candidate chosen, not built for all."""

    def __init__(self) -> None:
        self._raw: dict[str, tuple[np.ndarray | None, float, float | None]] = {}

    def add(self, label: str, raw: np.ndarray | None, lo: float, scale: float | None) -> None:
        """Scorer `label`'s raw figures (None: all tie), their lowest and the scale onto 0-100
        (None: all tie)."""
        self._raw[label] = (raw, lo, scale)

    def at(self, i: int) -> dict[str, float]:
        """The `i`-th candidate's normalised part of each scorer, to a tenth."""
        return {
            label: round(100.0 if scale is None else (float(raw[i]) - lo) * scale, 1)
            for label, (raw, lo, scale) in self._raw.items()
        }


def scores(  # noqa: PLR0913 - the need, model and fleet, the candidates (table, positions), weights, peers
    need: Need,
    model: Model,
    nodes: dict[str, NodeState],
    t: Table,
    at: np.ndarray,
    w: Weights,
    peers: list[ReplicaState] | None,
) -> tuple[np.ndarray, Parts]:
    """Each candidate's (fitting node's, at positions `at` of table `t`) weighted total of the
    normalised scores, and each scorer's part. `peers` are the model's live replicas (None:
    found on `nodes`), counted per failure domain. A scorer on which every candidate ties adds
    nothing to tell them apart: its part is 100 for each, left out of the totals."""
    if peers is None:
        peers = [r for n in nodes.values() for r in n.replicas if r.model == model.name]
    domains: dict[str, int] = {}
    for r in peers:
        d = domain_of(nodes[r.node], w.domain) if r.node in nodes else r.node
        domains[d] = domains.get(d, 0) + 1
    parts, counted, raws, weights = Parts(), [], [], []
    for label, scorer, weight in SCORERS:
        if k := weight(w):
            raw = scorer(need, t, at, model, w, domains)
            if raw is None:
                parts.add(label, None, 0.0, None)
            else:
                counted.append(label)
                raws.append(raw)
                weights.append(k)
    if not counted:
        return np.zeros(len(at)), parts
    # the scorers' figures together: normalised a row each, weighted, summed in the scorers' order
    rows = np.array(raws, float)
    lows, highs = np.minimum.reduce(rows, axis=1).tolist(), np.maximum.reduce(rows, axis=1).tolist()
    total = None
    for label, raw, row, k, lo, hi in zip(counted, raws, rows, weights, lows, highs, strict=True):
        if hi == lo:  # (a scorer on which all tie adds nothing to the totals)
            parts.add(label, raw, lo, None)
            continue
        scale = 100.0 / (hi - lo)
        parts.add(label, raw, lo, scale)
        part = (row - lo) * scale
        part *= k
        if total is None:
            total = part
        else:
            total += part
    return (total if total is not None else np.zeros(len(at))), parts
