"""The placement benchmark's fleets: CPU-only nodes of different memory rates and core counts, and
nodes with 1-4 cards of one of four classes (one in five with two classes); models of 1B to 70B
parameters (Q4_0 or Q8_0, a context of 8,192), most with a card profile and a CPU fallback, some
CPU-only or card-only, wanting 1-3 replicas each. A replica's need, whether a node takes it and
its predicted tokens a second are the scheduler's own (`need_for`, the filter chain, `speed_of`)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import msgspec

from llmgw.modelplan import Shape
from llmgw.proto import GpuInfo, Model, NodeInfo, Profile, ReplicaState, Scaling
from llmgw.scheduler.core import NodeView, Policy
from llmgw.scheduler.placement import FILTERS, Need, NodeState, node_states, speed_of
from llmgw.scheduler.placement import need_for as placement_need

__all__ = ["NOW", "POLICY", "Fleet", "draw", "empty", "need_for", "passes", "total", "way_of", "way_tps"]

NOW = 1_000_000.0
POLICY = Policy()
CLASSES = [("h100-80g", 81559), ("a100-40g", 40960), ("l40s-48g", 46068), ("l4-24g", 23034)]
# name: (parameters, layers, embedding, feed forward, heads, kv heads, head length)
SIZES = {
    "1b": (1.24e9, 16, 2048, 8192, 32, 8, 64),
    "3b": (3.2e9, 28, 3072, 8192, 24, 8, 128),
    "8b": (8.0e9, 32, 4096, 14336, 32, 8, 128),
    "14b": (14.8e9, 48, 5120, 13824, 40, 8, 128),
    "32b": (32.8e9, 64, 5120, 27648, 40, 8, 128),
    "70b": (70.6e9, 80, 8192, 28672, 64, 8, 128),
}
QUANTS = {"Q4_0": 0.5625, "Q8_0": 1.0625}
"""Bytes a parameter."""


@dataclass
class Fleet:
    """A drawn fleet and catalog: what `reconcile` takes."""

    nodes: dict[str, NodeView]
    models: dict[str, Model]
    weights: dict[str, int]
    shapes: dict[str, Shape]

    @property
    def replicas(self) -> int:
        """Replicas the catalog asks for."""
        return sum(m.scaling.min for m in self.models.values())


def _node(name: str, rng: random.Random, card_share: float) -> NodeView:
    gpus: list[GpuInfo] = []
    if rng.random() < card_share:
        kinds = rng.sample(CLASSES, 2 if rng.random() < 0.2 else 1)
        for cls, mem in kinds:
            gpus += [
                GpuInfo(index=len(gpus) + k, uuid=f"{name}-{len(gpus) + k}", name=cls, cls=cls, memory_total_mb=mem)
                for k in range(rng.choice([1, 2, 4]))
            ]
    total = rng.choice([32, 64, 128, 256]) * 1024
    info = NodeInfo(
        node=name,
        hostname=name,
        cpus=rng.choice([8, 16, 32, 64]),
        memory_total_mb=total,
        memory_available_mb=total,
        gpus=gpus,
        engines={"llamacpp": "1"},
        membw_all_gbs=rng.uniform(20, 300),
        membw_one_gbs=rng.uniform(6, 14),
        labels={"rack": f"r{rng.randrange(4)}"},
    )
    return NodeView(info=info, last_seen=NOW)


def _model(i: int, rng: random.Random, weights: dict[str, int], shapes: dict[str, Shape]) -> Model:
    size = rng.choice(list(SIZES))
    quant = rng.choice(list(QUANTS))
    params, layers, emb, ff, heads, kv, head = SIZES[size]
    nbytes = int(params * QUANTS[quant])
    source = f"org/{size}-{i}/model-{quant}.gguf"
    weights[source] = nbytes
    shapes[source] = Shape(
        layers=layers,
        embedding=emb,
        feed_forward=ff,
        heads=heads,
        kv_heads=kv,
        key_length=head,
        value_length=head,
        vocab=128256,
        parameters=int(params),
        weight_bytes=nbytes,
        active_bytes=nbytes,
        type_bytes={quant: nbytes},
    )
    cores = {"1b": 4, "3b": 4, "8b": 8, "14b": 8, "32b": 16, "70b": 16}[size]
    cpu = Profile(name="cpu", cpu_cores=cores)
    cards = Profile(name="gpu", gpus=2 if size == "70b" else 1, priority=10)
    profiles = rng.choice([[cards, cpu], [cards, cpu], [cards, cpu], [cpu], [cards]])
    want = rng.choice([1, 1, 2, 3])
    return Model(name=f"m{i:05d}", source=source, context=8192, profiles=profiles, scaling=Scaling(min=want, max=want))


def draw(nodes: int, replicas: int, seed: int, card_share: float = 0.5) -> Fleet:
    """A fleet of `nodes` and a catalog of models asking for `replicas` replicas in all."""
    rng = random.Random(seed)
    views = {f"node-{i:05d}": _node(f"node-{i:05d}", rng, card_share) for i in range(nodes)}
    models: dict[str, Model] = {}
    weights: dict[str, int] = {}
    shapes: dict[str, Shape] = {}
    left = replicas
    while left > 0:
        m = _model(len(models), rng, weights, shapes)
        if m.scaling.min > left:
            m = msgspec.structs.replace(m, scaling=Scaling(min=left, max=left))
        models[m.name] = m
        left -= m.scaling.min
    return Fleet(nodes=views, models=models, weights=weights, shapes=shapes)


def need_for(f: Fleet, model: Model, profile: Profile) -> Need:
    """A replica's need, as `reconcile` works it out."""
    return placement_need(model, profile, f.weights, f.shapes)


def empty(info: NodeInfo, cls: str = "") -> NodeState:
    """The node with nothing on it as placement sees it, its cards of class `cls` only (if given)."""
    state = node_states({info.node: (info, NOW, [])}, [], POLICY.reserve_mb)[info.node]
    if cls:
        state.free_cards = [g for g in state.free_cards if g.cls == cls]
    return state


def passes(need: Need, state: NodeState) -> bool:
    return all(f(need, state, NOW, POLICY.stale_s) is None for _, f in FILTERS)


def total(f: Fleet, placed: list[ReplicaState]) -> float:
    """The scheduler's predicted tokens a second of the replicas placed, summed."""
    return sum(way_tps(f, f.models[r.model], *way_of(f, r)[1:]) for r in placed)


def way_of(f: Fleet, r: ReplicaState) -> tuple[str, str, str, str]:
    cls = next((g.cls for g in f.nodes[r.node].info.gpus if r.gpus and g.uuid == r.gpus[0]), "")
    return (r.model, r.profile, r.node, cls)


def way_tps(f: Fleet, model: Model, profile: str, node: str, cls: str) -> float:
    need = need_for(f, model, next(p for p in model.profiles if p.name == profile))
    return speed_of(need, empty(f.nodes[node].info, cls))
