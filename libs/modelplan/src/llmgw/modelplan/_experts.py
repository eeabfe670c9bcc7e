"""A model of experts on cards with some layers' experts in host memory (llama.cpp's
`--n-cpu-moe N`): how many layers must move for the rest to fit, what each side holds, and how
fast a reply is when the card reads the dense part and the CPU the moved experts.

llama.cpp keeps the routed experts' tensors (`blk.i.ffn_*_exps`) of layers 0..N-1 in host memory
and runs them on the CPU; attention, shared experts, routing and the other layers' experts stay
on the cards. A token reads every dense weight and `experts_used` of `experts` of each layer's
experts, so moving experts costs memory bandwidth at the host's rate for their active share only:
the open way to serve a model of experts larger than its card.
"""

from __future__ import annotations

from llmgw.modelplan._memory import (
    MARGIN_BYTES,
    MARGIN_SHARE,
    Shape,
    bytes_by_type,
    experts_host_bytes,
    llamacpp_memory,
)
from llmgw.modelplan._speed import (
    DEFAULT_CPU,
    GpuConstants,
    cpu_compute_seconds,
    cpu_read_gbs,
)
from llmgw.proto import CpuCalibration

__all__ = [
    "HOP_S",
    "experts_on_host_mb",
    "fewest_cpu_moe_layers",
    "has_experts",
    "hybrid_tokens_per_second",
]

HOP_S = 0.00002
"""Seconds a token loses at each layer whose experts run on the CPU: its activations go to the
host and back (a few kilobytes over PCIe, and a synchronisation). Assumed, not measured here."""


def has_experts(shape: Shape) -> bool:
    """Whether the shape is a model of experts whose experts' tensors are known (a GGUF header)."""
    return shape.expert_bytes > 0 and shape.experts > 0 and 0 < shape.experts_used < shape.experts


def experts_on_host_mb(shape: Shape, cpu_moe: int) -> int:
    """Host memory, MiB, a replica with `cpu_moe` layers' experts there takes: those experts, a
    margin as on a card, and the host's compute buffers (the same fixed margin)."""
    moved = experts_host_bytes(shape, cpu_moe)
    if not moved:
        return 0
    return -(-(moved + int(moved * MARGIN_SHARE) + MARGIN_BYTES) // 2**20)


def fewest_cpu_moe_layers(
    shape: Shape, context: int, slots: int, cards: int, card_room_mb: float, cache: str = "f16"
) -> int:
    """The fewest layers whose experts must go to host memory for the rest to fit `cards` cards
    of `card_room_mb` each (more on the card is faster); 0 where all fits on the cards already,
    -1 where even every layer's experts moved leaves too much (the dense part does not fit), the
    model has no experts to move, or it would take more than one card: llama.cpp splits the
    layers evenly over the cards and `--n-cpu-moe` relieves the first layers, the first card's,
    so the last card would hold its layers' experts whole."""
    if llamacpp_memory(shape, context, slots, cards=cards, cache=cache).mib <= card_room_mb:
        return 0
    if not has_experts(shape) or cards != 1:
        return -1
    if llamacpp_memory(shape, context, slots, cards, cache, cpu_moe=shape.layers).mib > card_room_mb:
        return -1
    low, high = shape.first_expert_layer + 1, shape.layers  # high fits; find the least that does
    while low < high:
        mid = (low + high) // 2
        if llamacpp_memory(shape, context, slots, cards, cache, cpu_moe=mid).mib <= card_room_mb:
            high = mid
        else:
            low = mid + 1
    return high


def hybrid_tokens_per_second(  # noqa: PLR0913 - the model and its split, the card's side, the host's side
    shape: Shape,
    cpu_moe: int,
    kv_read_bytes: int,
    bandwidth_gbs: float,
    host: tuple[float, float | None, int],
    k: CpuCalibration = DEFAULT_CPU,
    g: GpuConstants = GpuConstants(),
) -> float:
    """Tokens a second of one reply with `cpu_moe` layers' experts on the CPU: the card reads the
    dense part, the other experts' active share and the KV cache at its rate (as
    `gpu_tokens_per_second`); the host's threads read the moved experts' active share at their
    rate and do its arithmetic (as `cpu_tokens_per_second`); a hop each moved layer. `host` is the
    node's (whole machine's GB/s, one core's GB/s, threads). 0 where a rate is unknown.

    One card's time is counted (layers split over cards run one after another, as on cards)."""
    all_gbs, core_gbs, threads = host
    moved = experts_host_bytes(shape, cpu_moe)
    share = shape.experts_used / shape.experts if shape.experts else 1.0
    host_read = int(moved * share)
    card_read = max(shape.active_bytes - host_read, 0)
    rate = cpu_read_gbs(all_gbs, core_gbs, threads, k)
    if bandwidth_gbs <= 0 or (host_read and rate <= 0):
        return 0.0
    card_s = (card_read + kv_read_bytes) / (bandwidth_gbs * 1e9 * g.efficiency) + g.token_fixed_s
    if not host_read:
        return 1 / card_s
    layers = min(cpu_moe, shape.layers) - shape.first_expert_layer
    types = bytes_by_type(shape.type_bytes, host_read) or {"": host_read}  # unknown types: the unmeasured cost
    host_s = host_read / (rate * 1e9) + cpu_compute_seconds(types, threads, k)
    host_s += layers * ((k.layer_sync_s if threads > 1 else 0.0) + HOP_S)
    return 1 / (card_s + host_s)
