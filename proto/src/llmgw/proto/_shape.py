"""What a model is, as the memory and speed estimates need it: its shape (from a GGUF header or a
config.json), and the facts the mirror reads once from a file it holds (`FileInfo.facts`)."""

from __future__ import annotations

import msgspec

__all__ = ["ModelFacts", "Shape"]


class Shape(msgspec.Struct, frozen=True, kw_only=True):
    """What the memory and speed estimates need of a model, from a GGUF header or a config.json."""

    layers: int
    embedding: int
    feed_forward: int = 0
    heads: int
    kv_heads: int
    key_length: int
    value_length: int
    vocab: int = 0
    parameters: int = 0
    weight_bytes: int = 0
    """Bytes of every weight."""
    active_bytes: int = 0
    """Bytes one token reads (the experts' share for a model of experts)."""
    type_bytes: dict[str, int] = msgspec.field(default_factory=dict)
    """Bytes of every weight by tensor type ("Q4_1": ...): each type's arithmetic costs its own."""
    experts: int = 0
    experts_used: int = 0
    expert_bytes: int = 0
    """Of `weight_bytes`, the routed experts' tensors: what llama.cpp's --n-cpu-moe may keep in
    host memory (0: a dense model, or a config.json, which does not say)."""
    first_expert_layer: int = 0
    """The first layer holding routed experts (the ones before it are dense)."""
    sliding_window: int = 0
    """Tokens a sliding-window layer attends to (0: none)."""
    swa_layers: int = 0
    """Of `layers`, those attending only to the sliding window (llama.cpp keeps only the window
    of their KV): where the architecture's pattern is known, else 0 (every layer whole)."""


class ModelFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a model file's header says, read once by the mirror that holds it."""

    shape: Shape
    quant: str = ""
    """Its file type ("Q4_1", "F16", "mixed")."""
    trained_context: int = 0
    """The context it was trained for (0: the file does not say)."""
    embedding: bool = False
    """An embedding model (its pooling in the header): it answers /v1/embeddings, never chats."""
