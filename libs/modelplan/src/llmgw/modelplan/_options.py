"""Every way each file of a model runs on a fleet, with its memory and speed, ranked best first."""

from __future__ import annotations

from typing import Literal, NamedTuple

import msgspec

from llmgw.modelplan._experts import experts_on_host_mb, fewest_cpu_moe_layers, hybrid_tokens_per_second
from llmgw.modelplan._memory import (
    Shape,
    active_type_bytes,
    kv_per_1000_mb,
    kv_read_half_way,
    llamacpp_memory,
    splits_kv_heads,
    vllm_memory,
)
from llmgw.modelplan._speed import DEFAULT_CPU, card_of, cpu_threads, cpu_tokens_per_second, gpu_tokens_per_second
from llmgw.proto import CpuCalibration, NodeInfo

__all__ = ["CardGroup", "FileFacts", "NodeFacts", "Option", "node_facts", "options"]

VLLM_UTILISATION = 0.9
"""vLLM's --gpu-memory-utilization: the pool it takes of a card."""
CARD_USABLE = 0.95
"""Share of a card llama.cpp may fill (the driver and the context keep the rest)."""


class FileFacts(msgspec.Struct, frozen=True, kw_only=True):
    """One file (or set of files) of a model: a quantisation, with its shape."""

    name: str
    format: Literal["gguf", "safetensors"]
    quant: str = ""
    shape: Shape


class CardGroup(msgspec.Struct, frozen=True, kw_only=True):
    """A node's cards of one class."""

    cls: str
    """Its class ("h100-80g")."""
    memory_mb: int
    count: int
    free: int
    """Cards no replica holds now."""
    bandwidth_gbs: float = 0.0
    """Overrides the datasheet table."""


class NodeFacts(msgspec.Struct, frozen=True, kw_only=True):
    """A node as a plan sees it."""

    name: str
    cpus: int
    memory_total_mb: int
    memory_available_mb: int
    membw_all_gbs: float = 0.0
    membw_one_gbs: float = 0.0
    cards: list[CardGroup] = msgspec.field(default_factory=list)
    engines: list[str] = msgspec.field(default_factory=lambda: ["llamacpp"])
    calibration: CpuCalibration | None = None


FREE_CARD_MB = 1024
"""A card with less than this in use counts as free."""


def node_facts(info: NodeInfo) -> NodeFacts:
    """A node as its agent reported it; its cards grouped by class."""
    groups: dict[str, CardGroup] = {}
    for gpu in info.gpus:
        g = groups.get(gpu.cls) or CardGroup(cls=gpu.cls, memory_mb=gpu.memory_total_mb, count=0, free=0)
        groups[gpu.cls] = msgspec.structs.replace(
            g, count=g.count + 1, free=g.free + (gpu.memory_used_mb < FREE_CARD_MB)
        )
    return NodeFacts(
        name=info.node,
        cpus=info.cpus,
        memory_total_mb=info.memory_total_mb,
        memory_available_mb=info.memory_available_mb,
        membw_all_gbs=info.membw_all_gbs or 0.0,
        membw_one_gbs=info.membw_one_gbs or 0.0,
        engines=sorted(info.engines) or ["llamacpp"],
        cards=list(groups.values()),
        calibration=info.cpu_calibration,
    )


class Option(msgspec.Struct, frozen=True, kw_only=True):
    """One way to run one file: engine, where, how many cards, memory, speed."""

    file: str
    engine: Literal["llamacpp", "vllm"]
    device: str
    """'cpu' or a card class."""
    cards: int
    """Cards one replica takes (0 on the CPU)."""
    tensor_parallel: bool
    threads: int
    """CPU threads (on the CPU)."""
    need_mb: int
    """Memory it needs: host RAM on the CPU, per card on cards."""
    have_mb: int
    """What the best node for it has: available RAM, or one card's memory."""
    node: str
    """The node where it answers fastest (free now, if any is)."""
    nodes_free: int
    """Nodes where it fits now."""
    nodes_fit: int
    """Nodes where it fits at all (when their memory or cards are free)."""
    tokens_per_second: float
    kv_per_1000_mb: float
    """What 1000 tokens of context cost in KV cache, MiB (whole model; at the context planned,
    where sliding-window layers keep only their window)."""
    cpu_moe_layers: int = 0
    """On cards: layers whose experts stay in host memory (llama.cpp's --n-cpu-moe); 0: none."""
    host_mb: int = 0
    """On cards: host memory those experts take, MiB (the CPU's share of the work)."""

    @property
    def free_now(self) -> bool:
        return self.nodes_free > 0


class _Seen(NamedTuple):
    """One way on one node: what it takes there and how fast it answers."""

    key: tuple[str, str, int, bool]
    """Engine, device, cards, tensor parallel."""
    threads: int
    need: int
    have: int
    free: bool
    tps: float
    cpu_moe: int = 0
    host_mb: int = 0


def _cpu_way(f: FileFacts, node: NodeFacts, context: int, slots: int, threads: int | None) -> _Seen | None:
    if f.format != "gguf" or "llamacpp" not in node.engines:
        return None
    need = llamacpp_memory(f.shape, context, slots).mib
    if need > node.memory_total_mb:
        return None
    t = cpu_threads(threads, node.cpus)
    tps = cpu_tokens_per_second(
        f.shape.active_bytes,
        node.membw_all_gbs,
        node.membw_one_gbs,
        t,
        node.calibration or DEFAULT_CPU,
        active_type_bytes(f.shape),
        f.shape.layers,
    )
    free = need <= node.memory_available_mb
    return _Seen(("llamacpp", "cpu", 0, False), t, need, node.memory_available_mb, free, tps)


def _llamacpp_on_cards(  # noqa: PLR0913 - the file, the node and its cards, how many, the context, the slots, threads
    f: FileFacts, node: NodeFacts, group: CardGroup, n: int, context: int, slots: int, threads: int | None
) -> _Seen | None:
    """llama.cpp on `n` cards of `group`: every layer there, or (a model of experts too large for
    them) the fewest layers' experts in host memory, if the node has the memory for them."""
    card = card_of(group.cls)
    bandwidth = group.bandwidth_gbs or (card.bandwidth_gbs if card else 0.0)
    kv_at_depth = kv_read_half_way(f.shape, context, slots)
    moe = fewest_cpu_moe_layers(f.shape, context, slots, n, group.memory_mb * CARD_USABLE)
    if moe < 0:
        return None
    need = llamacpp_memory(f.shape, context, slots, cards=n, cpu_moe=moe).mib
    if not moe:
        tps = gpu_tokens_per_second(f.shape.active_bytes, kv_at_depth, bandwidth, n, tensor_parallel=False)
        return _Seen(("llamacpp", group.cls, n, False), 0, need, group.memory_mb, n <= group.free, tps)
    host = experts_on_host_mb(f.shape, moe)
    if host > node.memory_total_mb:
        return None
    t = cpu_threads(threads, node.cpus)
    rates = (node.membw_all_gbs, node.membw_one_gbs, t)
    tps = hybrid_tokens_per_second(f.shape, moe, kv_at_depth, bandwidth, rates, node.calibration or DEFAULT_CPU)
    free = n <= group.free and host <= node.memory_available_mb
    return _Seen(("llamacpp", group.cls, n, False), t, need, group.memory_mb, free, tps, moe, host)


def _card_ways(f: FileFacts, node: NodeFacts, context: int, slots: int, threads: int | None):
    kv_at_depth = kv_read_half_way(f.shape, context, slots)
    for group in node.cards:
        card = card_of(group.cls)
        bandwidth = group.bandwidth_gbs or (card.bandwidth_gbs if card else 0.0)
        n = 1
        while n <= group.count:
            if f.format == "gguf" and "llamacpp" in node.engines:
                way = _llamacpp_on_cards(f, node, group, n, context, slots, threads)
                if way:
                    yield way
            if f.format == "safetensors" and "vllm" in node.engines and splits_kv_heads(f.shape, n):
                need = vllm_memory(f.shape, context, n).mib
                if need <= group.memory_mb * VLLM_UTILISATION:
                    tps = gpu_tokens_per_second(f.shape.active_bytes, kv_at_depth, bandwidth, n, tensor_parallel=True)
                    yield _Seen(("vllm", group.cls, n, True), 0, need, group.memory_mb, n <= group.free, tps)
            n *= 2


class _Best:
    """One way's best node so far, and how many nodes it fits (now, and at all)."""

    def __init__(self) -> None:
        self.rank: tuple[bool, float] | None = None
        self.node, self.way = "", None
        self.free = self.fit = 0

    def see(self, node: str, way: _Seen) -> None:
        self.fit += 1
        self.free += way.free
        if self.rank is None or (way.free, way.tps) > self.rank:
            self.rank = (way.free, way.tps)
            self.node, self.way = node, way


def options(
    files: list[FileFacts], nodes: list[NodeFacts], context: int, slots: int = 1, threads: int | None = None
) -> list[Option]:
    """Every way each file runs on `nodes`, best first: free now, then fastest, then fewest cards.

    A way is an engine on the CPU or on n cards of one class; it is reported once, on the node
    where it answers fastest (preferring nodes where it fits now), with how many nodes it fits.
    `threads` are a CPU replica's (default: half a node's cores).
    """
    out = []
    for f in files:
        best: dict[tuple[str, str, int, bool], _Best] = {}
        for node in nodes:
            ways = list(_card_ways(f, node, context, slots, threads))
            cpu = _cpu_way(f, node, context, slots, threads)
            if cpu:
                ways.append(cpu)
            for way in ways:
                best.setdefault(way.key, _Best()).see(node.name, way)
        kv_1000 = kv_per_1000_mb(f.shape, context, slots)
        for (engine, device, cards, tp), b in best.items():
            w = b.way
            assert w is not None  # every _Best has seen a way
            out.append(
                Option(
                    file=f.name,
                    engine=engine,
                    device=device,
                    cards=cards,
                    tensor_parallel=tp,
                    threads=w.threads,
                    need_mb=w.need,
                    have_mb=w.have,
                    node=b.node,
                    nodes_free=b.free,
                    nodes_fit=b.fit,
                    tokens_per_second=round(w.tps, 2),
                    kv_per_1000_mb=round(kv_1000, 2),
                    cpu_moe_layers=w.cpu_moe,
                    host_mb=w.host_mb,
                )
            )
    out.sort(key=lambda o: (not o.free_now, -o.tokens_per_second, o.cards))
    return out
