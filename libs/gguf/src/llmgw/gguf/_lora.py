"""LoRA adapters as llama.cpp loads them: whether an adapter file was made for a model's weights
(the checks llama.cpp makes when it loads one, done from the two headers before any replica
tries), and a small random one written for a test model.

An adapter holds, for each weight it adapts (`blk.0.attn_q.weight`), two low-rank matrices
`<weight>.lora_a` and `<weight>.lora_b`; in GGML's order (the row's length first) A is
[columns of the weight, rank] and B is [rank, rows of the weight].
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

import gguf
from llmgw.gguf._header import read_tensors, split_parts
from llmgw.gguf._sources import GGUFError

__all__ = ["Lora", "check_lora", "write_random_lora"]

_A, _B = ".lora_a", ".lora_b"
_EMBEDDINGS = "token_embd.weight"
"""The one weight llama.cpp reads the other way round (a lookup, not a product): A and B swap."""


class Lora(NamedTuple):
    """What an adapter is, once it fits its base."""

    architecture: str
    rank: int
    """The largest rank of its pairs."""
    alpha: float
    """Its LoRA alpha; 0 where the file does not say."""
    tensors: int
    """The base's weights it adapts."""


def _pairs(name: str, dims: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Adapted weight -> the dimensions of its A and B; GGUFError where a half is missing."""
    pairs = {}
    for tensor in dims:
        if tensor.endswith(_A):
            weight = tensor.removesuffix(_A)
            if weight + _B not in dims:
                raise GGUFError(f"{name}: '{tensor}' has no '{weight}{_B}' beside it; the adapter is damaged")
            pairs[weight] = (dims[tensor], dims[weight + _B])
        elif tensor.endswith(_B) and tensor.removesuffix(_B) + _A not in dims:
            raise GGUFError(
                f"{name}: '{tensor}' has no '{tensor.removesuffix(_B)}{_A}' beside it; the adapter is damaged"
            )
    return pairs


def _misfit(weight: str, a: tuple[int, ...], b: tuple[int, ...], base: tuple[int, ...]) -> str:
    """Why A and B do not fit the base's weight (llama.cpp's own checks), or empty."""
    if len(a) != 2 or len(b) != 2 or len(base) < 2:
        return f"'{weight}' is {len(base)}-dimensional in the model and its A and B are not matrices"
    if weight == _EMBEDDINGS:
        a, b = b, a
    if a[1] != b[0]:
        return f"'{weight}': A's rank {a[1]} is not B's {b[0]}"
    if (a[0], b[1]) != base[:2]:
        return f"'{weight}' is {base[0]}x{base[1]} in the model, and the adapter changes a {a[0]}x{b[1]} one"
    return ""


def check_lora(adapter: str | Path, base: str | Path) -> Lora:
    """The adapter at `adapter` as it applies to the model at `base` (both local GGUF files);
    GGUFError saying what is wrong where it is not a LoRA adapter, or one made for other weights."""
    name = Path(adapter).name
    meta, dims = read_tensors(adapter)
    kind, lora = meta.get("general.type", ""), meta.get("adapter.type", "")
    if kind != "adapter" or lora != "lora":
        said = (
            "a model"
            if kind in ("", "model")
            else f"general.type '{kind}'"
            if kind != "adapter"
            else f"a '{lora}' adapter"
        )
        raise GGUFError(f"{name} is not a LoRA adapter: its header says it is {said}")
    base_meta, base_dims = read_tensors(base)
    for part in split_parts(str(base))[1:]:  # a split model's tensors are in all its parts
        base_dims.update(read_tensors(part)[1])
    arch, base_arch = str(meta.get("general.architecture", "")), str(base_meta.get("general.architecture", ""))
    if arch != base_arch:
        raise GGUFError(f"{name} is an adapter for a '{arch}' model; {Path(base).name} is a '{base_arch}' one")
    pairs = _pairs(name, dims)
    if not pairs:
        raise GGUFError(f"{name} holds no LoRA pair ('<weight>{_A}' and '<weight>{_B}'); it adapts nothing")
    for weight, (a, b) in sorted(pairs.items()):
        if weight not in base_dims:
            raise GGUFError(f"{name} adapts '{weight}', which {Path(base).name} does not have: it is for another model")
        if why := _misfit(weight, a, b, base_dims[weight]):
            raise GGUFError(f"{name} was made for another model: {why}")
    alpha = meta.get("adapter.lora.alpha", 0.0)
    rank = max(a[1] if w != _EMBEDDINGS else b[1] for w, (a, b) in pairs.items())
    return Lora(arch, rank, float(alpha) if isinstance(alpha, int | float) else 0.0, len(pairs))


def write_random_lora(
    path: str | Path,
    base: str | Path,
    targets: Sequence[str] = ("attn_q", "attn_v"),
    rank: int = 4,
    strength: float = 0.05,
    seed: int = 0,
) -> Path:
    """Write, atomically, a LoRA adapter of random low-rank matrices for the model at `base`:
    one pair for each of its layers' `targets` weights (`blk.N.<target>.weight`), the entries
    normal with deviation `strength` (the larger, the more it changes the model's answers)."""
    path = Path(path)
    meta, dims = read_tensors(base)
    arch = str(meta.get("general.architecture", ""))
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path.with_name(f".{path.name}.{os.getpid()}.part")), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    chosen = sorted(t for t in dims if t.startswith("blk.") and t.split(".")[2] in targets and t.endswith(".weight"))
    if not chosen:
        raise GGUFError(f"{Path(base).name} has no weight named {', '.join(targets)} in its layers")
    for weight in chosen:
        columns, rows = dims[weight][:2]
        writer.add_tensor(weight + _A, (rng.standard_normal((rank, columns)) * strength).astype(np.float32))
        writer.add_tensor(weight + _B, (rng.standard_normal((rows, rank)) * strength).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(writer.path, path)
    return path
