"""Whether an adapter the mirror holds was made for a model's weights it holds: a GGUF LoRA
(llama.cpp) by both headers, tensor by tensor; a PEFT adapter (vLLM) by its adapter_config.json."""

from __future__ import annotations

from pathlib import Path

import msgspec

from llmgw.bus import BadRequest
from llmgw.gguf import GGUFError, check_lora
from llmgw.proto.mirror import AdapterCheck, AdapterFacts

__all__ = ["adapter_facts"]

_PEFT_CONFIG = "adapter_config.json"


def adapter_facts(ask: AdapterCheck, adapter: Path, base: Path) -> AdapterFacts:
    """(Reads both files' headers.) What the adapter at `adapter` is, for the weights at `base`;
    BadRequest saying what is wrong: not an adapter, one for other weights, or one whose kind
    the weights' engine does not load."""
    size = adapter.stat().st_size
    if base.suffix == ".gguf":
        if adapter.suffix != ".gguf":
            raise BadRequest(f"{ask.source} is not a GGUF file: llama.cpp loads GGUF LoRA adapters for {ask.base}")
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
            size=size,
        )
    config = adapter.parent / _PEFT_CONFIG
    try:
        said = msgspec.json.decode(config.read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise BadRequest(
            f"{ask.source} is not in a PEFT adapter's folder (its {_PEFT_CONFIG} does not read: {exc}); vLLM loads "
            "an adapter's folder as `peft` saves it"
        ) from None
    if not isinstance(said, dict) or said.get("peft_type", "LORA") != "LORA":
        raise BadRequest(f"{ask.source}: its {_PEFT_CONFIG} is not a LoRA adapter's")
    rank = said.get("r", 0)
    alpha = said.get("lora_alpha", 0)
    modules = said.get("target_modules") or []
    return AdapterFacts(
        source=ask.source,
        architecture=str(said.get("base_model_name_or_path", "")),
        rank=rank if isinstance(rank, int) and rank >= 0 else 0,
        alpha=float(alpha) if isinstance(alpha, int | float) else 0.0,
        tensors=len(modules) if isinstance(modules, list) else 0,
        size=size,
    )
