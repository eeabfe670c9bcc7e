"""The catalog's rules, without I/O: what makes a model acceptable."""

from __future__ import annotations

from llmgw.bus import BadRequest
from llmgw.proto import Model

__all__ = ["check_model"]


def check_model(model: Model) -> None:
    """Raise BadRequest saying what is wrong with `model` beyond its schema."""
    names = [p.name for p in model.profiles]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BadRequest(f"model '{model.name}': profile names must be unique; repeated: {', '.join(dupes)}")
    if model.scaling.min > model.scaling.max:
        raise BadRequest(
            f"model '{model.name}': scaling min {model.scaling.min} is above max {model.scaling.max}; raise max or lower min"
        )
    for p in model.profiles:
        if p.engine == "llamacpp" and not model.source.endswith(".gguf"):
            raise BadRequest(
                f"model '{model.name}' profile '{p.name}': llama.cpp serves GGUF files; source '{model.source}' is not a .gguf"
            )
