"""Whether an adapter the mirror holds was made for a model's weights it holds: a GGUF LoRA
(llama.cpp's) checked against the weights' header, tensor by tensor."""

from __future__ import annotations

from pathlib import Path

from llmgw.bus import BadRequest
from llmgw.gguf import GGUFError, check_lora
from llmgw.proto.mirror import AdapterCheck, AdapterFacts

__all__ = ["adapter_facts"]


def adapter_facts(ask: AdapterCheck, adapter: Path, base: Path) -> AdapterFacts:
    """(Reads both files' headers.) What the adapter at `adapter` is, for the weights at `base`;
    BadRequest saying what is wrong: not a GGUF LoRA adapter, or one made for other weights."""
    if base.suffix != ".gguf" or adapter.suffix != ".gguf":
        raise BadRequest(
            f"{ask.source} is not a GGUF LoRA adapter for GGUF weights: llama.cpp loads those (convert a PEFT "
            "adapter with llama.cpp's convert_lora_to_gguf.py)"
        )
    try:
        lora = check_lora(adapter, base)
    except GGUFError as exc:
        raise BadRequest(str(exc).replace(str(adapter), ask.source).replace(str(base), ask.base)) from None
    return AdapterFacts(
        source=ask.source,
        architecture=lora.architecture,
        rank=lora.rank,
        alpha=lora.alpha,
        tensors=lora.tensors,
        size=adapter.stat().st_size,
    )
