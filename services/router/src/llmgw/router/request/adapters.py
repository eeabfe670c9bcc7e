"""Requests for a model's LoRA adapter (`MODEL:ADAPTER`), without I/O: which adapter a name asks
for, the 404 that lists the attached ones, and the body each engine takes to apply one.

llama-server loads every adapter of its model at start (`--lora`, none applied); each request
says the scale of each by id, in the order the replica loaded them (`ReplicaState.adapters`).
A request that names no adapter sets every one to 0: an explicit list is the only way this
llama-server leaves the others out.
"""

from __future__ import annotations

from llmgw.proto import Model, ReplicaState
from llmgw.router.errors import ModelNotFound

__all__ = ["SEPARATOR", "adapter_of", "engine_body", "no_such_adapter"]

SEPARATOR = ":"
"""Between a model's name and its adapter's (neither may hold one)."""


def adapter_of(asked: str) -> str:
    """The adapter a requested name asks for ("" for the model alone)."""
    return asked.partition(SEPARATOR)[2]


def no_such_adapter(asked: str, model: Model) -> ModelNotFound:
    """The 404 for `MODEL:ADAPTER` where the model (`model`, looked up by its part of `asked`)
    has no such adapter, naming those it has (said only to a key that may use the model)."""
    base, _, adapter = asked.partition(SEPARATOR)
    attached = ", ".join(f"'{model.name}{SEPARATOR}{a.name}'" for a in model.adapters)
    said = (
        f"it has {attached}" if attached else f"it has none (`llmgw ctl model adapters {model.name} add` attaches one)"
    )
    return ModelNotFound(f"The model '{base}' has no adapter '{adapter}'; {said}.", "model")


def engine_body(body: dict, model: Model, adapter: str, replica: ReplicaState) -> dict:
    """`body` as `replica`'s llama-server takes it to apply `adapter` ("" for none) of `model`; a
    client's own `lora` field is dropped (an adapter is asked for by name, and only so)."""
    if "lora" in body:
        body = {k: v for k, v in body.items() if k != "lora"}
    if not replica.adapters:
        return body
    scale = next((a.scale for a in model.adapters if a.name == adapter), 0.0)
    lora = [{"id": i, "scale": scale if name == adapter else 0.0} for i, name in enumerate(replica.adapters)]
    return {**body, "lora": lora}
