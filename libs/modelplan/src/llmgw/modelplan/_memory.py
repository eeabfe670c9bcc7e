"""How much memory a way of running takes: weights, the KV cache for the context, a compute
buffer, and a stated margin."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from llmgw.gguf import Header
from llmgw.proto import ModelFacts, Shape

__all__ = [
    "KV_CACHE_TYPES",
    "Memory",
    "Shape",
    "active_type_bytes",
    "bytes_by_type",
    "compute_buffer_bytes",
    "experts_host_bytes",
    "facts_from_gguf",
    "kv_bytes_per_token",
    "kv_per_1000_mb",
    "kv_read_bytes",
    "kv_read_half_way",
    "llamacpp_kv_bytes",
    "llamacpp_memory",
    "shape_from_config",
    "shape_from_gguf",
    "splits_kv_heads",
    "vllm_block_bytes",
    "vllm_memory",
]

KvCache = Literal["f32", "f16", "bf16", "q8_0", "q4_0"]
KV_CACHE_TYPES: dict[str, float] = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
"""Bytes an element of the KV cache takes, by llama.cpp's cache type (q8_0: 32 in 34 bytes)."""

MARGIN_SHARE = 0.05
"""Margin over weights and KV: allocator slack, fragmentation."""
MARGIN_BYTES = 256 * 2**20
"""And a fixed margin: the engine's own code, threads and buffers."""
UBATCH = 512
"""llama.cpp's default micro-batch: the compute buffer is sized for it."""
VLLM_BLOCK = 16
"""Tokens in one vLLM KV block."""
VLLM_ACTIVATION_BYTES = 2 * 2**30
"""What vLLM keeps per card beside weights and KV (activations, CUDA graphs): about 2 GiB."""


def facts_from_gguf(h: Header) -> ModelFacts:
    """What a GGUF header says a model is: its shape, quantization and trained context."""
    return ModelFacts(
        shape=shape_from_gguf(h), quant=h.file_type, trained_context=h.context_length, embedding=h.embedding
    )


SWA_EVERY = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2}
"""Architectures whose layers llama.cpp runs on a sliding window: of each run of this many
layers, all but the last attend only to the window (its `set_swa_pattern`). Others with a window
in their header (a llama with one, as Mistral 7B v0.1 has) run every layer whole."""


def _swa_layers(h: Header) -> int:
    every = SWA_EVERY.get(h.architecture, 0)
    if not (every and h.sliding_window):
        return 0
    return sum(1 for layer in range(h.block_count) if layer % every < every - 1)


def shape_from_gguf(h: Header) -> Shape:
    """The shape of a GGUF model."""
    return Shape(
        layers=h.block_count,
        embedding=h.embedding_length,
        feed_forward=h.feed_forward_length,
        heads=h.head_count,
        kv_heads=h.head_count_kv,
        key_length=h.key_length,
        value_length=h.value_length,
        vocab=h.vocab_size,
        parameters=h.parameters,
        weight_bytes=h.tensor_bytes,
        active_bytes=h.active_bytes,
        type_bytes=dict(h.type_bytes),
        experts=h.expert_count,
        experts_used=h.expert_used_count,
        expert_bytes=h.expert_bytes,
        first_expert_layer=h.first_expert_layer,
        sliding_window=h.sliding_window,
        swa_layers=_swa_layers(h),
    )


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_DTYPE_TYPE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def shape_from_config(config: dict, weight_bytes: int) -> Shape:
    """The shape of a safetensors model from its Hugging Face config.json and its files' size."""
    text = config.get("text_config", config)  # multimodal configs keep the language model inside
    try:
        heads = int(text["num_attention_heads"])
        embedding = int(text["hidden_size"])
        layers = int(text["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"config.json lacks {exc}: not a decoder model's config") from None
    head_dim = int(text.get("head_dim") or embedding // heads)
    experts = int(text.get("num_local_experts") or text.get("num_experts") or 0)
    used = int(text.get("num_experts_per_tok") or 0)
    dtype = str(text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
    active = weight_bytes
    if experts and used and used < experts:
        active = int(weight_bytes * (used / experts + 0.1))  # no tensor list here: a tenth for what all read
    ff = int(text.get("moe_intermediate_size") or text.get("intermediate_size") or 0)
    return Shape(
        layers=layers,
        embedding=embedding,
        feed_forward=ff,
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        key_length=head_dim,
        value_length=head_dim,
        vocab=int(text.get("vocab_size") or 0),
        parameters=weight_bytes // _DTYPE_BYTES.get(dtype, 2),
        weight_bytes=weight_bytes,
        active_bytes=active,
        type_bytes={_DTYPE_TYPE[dtype]: weight_bytes} if dtype in _DTYPE_TYPE else {},
        experts=experts,
        experts_used=used,
    )


def bytes_by_type(type_bytes: Mapping[str, int], part: int) -> dict[str, int]:
    """`part` bytes split by tensor type in `type_bytes`'s proportions (a share of a model read a
    token: across nodes, or its experts on a host); empty where the types are unknown."""
    total = sum(type_bytes.values())
    return {t: n * part // total for t, n in type_bytes.items()} if total else {}


def active_type_bytes(shape: Shape) -> dict[str, int]:
    """What one token reads by tensor type: each type's bytes at the share of the weights a token
    reads (a model of experts reads its experts' share of each)."""
    if not shape.weight_bytes:
        return {}
    return {t: n * shape.active_bytes // shape.weight_bytes for t, n in shape.type_bytes.items()}


def kv_bytes_per_token(shape: Shape, cache: str = "f16") -> float:
    """Bytes one token of context costs in the KV cache (every layer's keys and values)."""
    if cache not in KV_CACHE_TYPES:
        raise ValueError(f"KV cache type '{cache}' is not one of {', '.join(KV_CACHE_TYPES)}")
    return shape.layers * shape.kv_heads * (shape.key_length + shape.value_length) * KV_CACHE_TYPES[cache]


def kv_read_bytes(shape: Shape, depth: int, cache: str = "f16") -> int:
    """Bytes of KV cache one generated token reads with `depth` tokens before it: each layer's
    keys and values of all of them, but a sliding-window layer's of its window only."""
    windowed = shape.swa_layers if shape.sliding_window else 0
    cells = (shape.layers - windowed) * depth + windowed * min(depth, shape.sliding_window)
    return int(kv_bytes_per_token(shape, cache) * cells / max(shape.layers, 1))


def kv_read_half_way(shape: Shape, context: int, slots: int) -> int:
    """The KV a reply half-way into its slot (of `context` shared by `slots`) reads for each
    token: what the speed of a way is reckoned at."""
    return kv_read_bytes(shape, context // max(slots, 1) // 2)


def vllm_block_bytes(shape: Shape, dtype_bytes: int = 2) -> int:
    """Bytes of one vLLM KV block (16 tokens) over the whole model, before tensor parallelism."""
    return VLLM_BLOCK * shape.layers * shape.kv_heads * (shape.key_length + shape.value_length) * dtype_bytes


def compute_buffer_bytes(shape: Shape, context: int, slots: int = 1) -> int:
    """llama.cpp's compute buffer for one micro-batch of 512 rows: per row 4-byte logits over the
    vocabulary, 2-byte attention scores over a slot's context, and the widest activations (12 bytes
    a unit of the feed-forward, times the experts a token uses, and of the wider of embedding
    and attention), and 1000 bytes.

    Fitted to what llama-server reports (`CPU compute buffer size`) for models of varied widths
    and four layers or more; within 10% on each (tests/test_plan.py checks three).
    """
    per_slot = context // max(slots, 1)
    width = max(shape.embedding, shape.heads * shape.key_length)
    feed_forward = shape.feed_forward * max(shape.experts_used, 1)  # each row runs its experts
    return UBATCH * (4 * shape.vocab + 2 * per_slot + 12 * feed_forward + 12 * width + 1000)


class Memory(msgspec.Struct, frozen=True, kw_only=True):
    """Bytes one replica takes, where it takes them (per card for cards)."""

    weights: int
    kv: int
    compute: int
    margin: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.margin

    @property
    def mib(self) -> int:
        return -(-self.total // 2**20)


def experts_host_bytes(shape: Shape, cpu_moe: int) -> int:
    """Bytes of routed experts `--n-cpu-moe cpu_moe` keeps in host memory: those of the layers
    before `cpu_moe` that hold experts (the leading dense layers hold none)."""
    moved = min(max(cpu_moe, 0), shape.layers) - shape.first_expert_layer
    if moved <= 0 or not shape.expert_bytes:
        return 0
    return shape.expert_bytes * moved // max(shape.layers - shape.first_expert_layer, 1)


def _pad256(n: int) -> int:
    return -(-n // 256) * 256


def llamacpp_kv_bytes(shape: Shape, context: int, slots: int = 1, cache: str = "f16") -> int:
    """llama.cpp's KV cache for `context` (-c) shared by `slots` (-np): the whole context on every
    layer, but on a sliding-window layer the window and a micro-batch, padded to 256 cells, in
    one stream for all slots or one a slot (the larger: llama-server splits it by slot unless
    told to unify)."""
    if not (shape.swa_layers and shape.sliding_window):
        return int(kv_bytes_per_token(shape, cache) * context)
    slots = max(slots, 1)
    unified = _pad256(min(context, shape.sliding_window * slots + UBATCH))
    split = slots * _pad256(min(context // slots, shape.sliding_window + UBATCH))
    cells = (shape.layers - shape.swa_layers) * context + shape.swa_layers * max(unified, split)
    return int(kv_bytes_per_token(shape, cache) * cells / shape.layers)


def kv_per_1000_mb(shape: Shape, context: int, slots: int = 1) -> float:
    """What 1000 tokens of context cost in llama.cpp's KV cache (f16), MiB, at this context: with
    sliding-window layers the cost of a token depends on the context it is in."""
    return llamacpp_kv_bytes(shape, context, slots) * 1000 / max(context, 1) / 2**20


def llamacpp_memory(
    shape: Shape, context: int, slots: int = 1, cards: int = 0, cache: str = "f16", cpu_moe: int = 0
) -> Memory:
    """llama.cpp: all on the CPU (cards=0), or its layers split evenly over `cards` cards (per card).

    `context` is llama-server's -c, shared by its `slots` (-np). On cards, `cpu_moe` layers'
    experts stay in host memory (`--n-cpu-moe`): out of the cards' weights (`experts_host_bytes`).
    """
    share = max(cards, 1)
    weights = (shape.weight_bytes - (experts_host_bytes(shape, cpu_moe) if cards else 0)) // share
    kv = llamacpp_kv_bytes(shape, context, slots, cache) // share
    return Memory(
        weights=weights,
        kv=kv,
        compute=compute_buffer_bytes(shape, context, slots),
        margin=int((weights + kv) * MARGIN_SHARE) + MARGIN_BYTES,
    )


def splits_kv_heads(shape: Shape, tensor_parallel: int) -> bool:
    """Tensor parallel over n cards splits the KV heads evenly (or replicates them evenly)."""
    kv = shape.kv_heads
    return tensor_parallel <= 1 or kv % tensor_parallel == 0 or tensor_parallel % kv == 0


def vllm_memory(shape: Shape, context: int, tensor_parallel: int = 1) -> Memory:
    """vLLM, per card: its weights' share, activations, and KV blocks for one full context.

    vLLM takes a pool of the card (--gpu-memory-utilization) and fills what is left after weights
    and activations with KV blocks; this is the least such a pool must hold.
    """
    blocks = -(-context // VLLM_BLOCK)
    weights = shape.weight_bytes // tensor_parallel
    kv = blocks * vllm_block_bytes(shape) // tensor_parallel
    return Memory(weights=weights, kv=kv, compute=VLLM_ACTIVATION_BYTES, margin=int((weights + kv) * MARGIN_SHARE))
