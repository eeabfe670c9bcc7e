"""An operator's change to one model (`catalog.model.change`): each kind a tagged Struct of its own
(`llmgw.proto.catalog` names them)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from llmgw.proto._scaling import LEAST_CONTEXT, Scaling
from llmgw.proto._types import Name, NonNegative, Positive, Source

__all__ = [
    "MOST_ADAPTERS",
    "Adapter",
    "ChangeSpec",
    "ModelChange",
    "RestartModel",
    "ScaleModel",
    "SetAdapters",
    "SetAliases",
    "SetClass",
    "SetContext",
    "SetGpus",
    "SetOwner",
    "SetReplicas",
    "SetResources",
    "StartModel",
    "StopModel",
    "adapter_name",
]


MOST_ADAPTERS = 8
"""The most adapters one model's replicas load (each takes memory and a slot of the engine's)."""


class Adapter(Struct, kw_only=True, frozen=True):
    """A LoRA adapter a model's replicas load: clients ask for it as `MODEL:NAME`."""

    name: Name
    """What it is asked for by, after the model's name and a colon."""
    source: Source
    """Its file on the mirror: a GGUF LoRA made for the model's weights (llama.cpp's
    convert_lora_to_gguf.py makes one of a PEFT adapter)."""
    scale: Annotated[float, Meta(gt=0, le=4)] = 1.0
    """How strongly it applies (llama.cpp's LoRA scale); changed without restarting a replica."""


_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]+")


def adapter_name(source: str) -> str:
    """The name an adapter is asked for by when none is given: its file's name without `.gguf`
    (a PEFT adapter: its folder's), kept to the letters a name may hold."""
    parts = source.split("/")
    stem = parts[-1].removesuffix(".gguf") if parts[-1].endswith(".gguf") or len(parts) < 2 else parts[-2]
    return _NOT_NAME.sub("-", stem.split("@")[0]).strip("-_")[:63] or "adapter"


class ChangeSpec(Struct, kw_only=True):
    """What every change to a model says: which model, who asks, and the revision it expects.

    Each kind of change is a subclass tagged by `action` that carries only its own fields; on
    the wire a change is one flat object (`{"action": "scale", "name": "m", ..., "scaling": ...}`).
    This base is never sent alone: `ModelChange` is the union of the kinds.
    """

    name: Name
    """The model to change."""
    by: str = ""
    """Who is making the change (recorded)."""
    revision: int | None = None
    """Expected current revision; None: the latest."""


class StopModel(ChangeSpec, kw_only=True, tag_field="action", tag="stop"):
    """Stop every replica; the scaling (and counts) are kept for start."""


class StartModel(ChangeSpec, kw_only=True, tag_field="action", tag="start"):
    """Bring a stopped model back exactly as it was."""


class RestartModel(ChangeSpec, kw_only=True, tag_field="action", tag="restart"):
    """Start every replica again, one at a time."""

    in_place: bool = False
    """Stop each replica before its replacement starts (no room beside it)."""


class ScaleModel(ChangeSpec, kw_only=True, tag_field="action", tag="scale"):
    """A new scaling (a stopped model starts with it)."""

    scaling: Scaling


class SetReplicas(ChangeSpec, kw_only=True, tag_field="action", tag="replicas"):
    """Replicas per profile; the scaling becomes their sum."""

    counts: dict[str, NonNegative] = field(default_factory=dict)
    """Profile name -> replicas; profiles not named keep theirs."""
    cpu_memory_mb: Positive | None = None
    """Add a CPU profile 'cpu' reserving this much host memory."""
    cpu_cores: Positive | None = None
    """The cores that CPU profile reserves."""


class SetContext(ChangeSpec, kw_only=True, tag_field="action", tag="context"):
    """A new context length and/or longest answer."""

    context: Annotated[int, Meta(ge=LEAST_CONTEXT)] | None = None
    """The new context length (its replicas restart)."""
    max_output: Positive | None = None
    """The new longest answer (applied at once)."""
    in_place: bool = False
    """Stop each replica before its replacement starts (no room beside it)."""


class SetGpus(ChangeSpec, kw_only=True, tag_field="action", tag="gpus"):
    """GPUs per replica of the profiles named."""

    gpus: dict[str, NonNegative] = field(default_factory=dict)
    """Profile name -> GPUs per replica."""
    in_place: bool = False
    """Stop each replica before its replacement starts (no room beside it)."""


class SetResources(ChangeSpec, kw_only=True, tag_field="action", tag="resources"):
    """What one replica of a profile reserves on its node: host memory and cores."""

    profile: Name
    """The profile to change."""
    memory_mb: Positive | None = None
    """Host memory a replica reserves, MiB (a CPU replica's weights and cache; beside cards, what
    stays in host memory); None: unchanged."""
    cores: Positive | None = None
    """Cores (engine threads) a replica reserves; None: unchanged."""
    in_place: bool = False
    """Stop each replica before its replacement starts (no room beside it)."""


class SetClass(ChangeSpec, kw_only=True, tag_field="action", tag="class"):
    """The capacity class: a higher class may take room from a lower one."""

    capacity_class: Literal["critical", "standard", "batch"]


class SetOwner(ChangeSpec, kw_only=True, tag_field="action", tag="owner"):
    """The team or person responsible."""

    owner: str = ""
    """Empty: nobody."""


class SetAliases(ChangeSpec, kw_only=True, tag_field="action", tag="alias"):
    """Aliases added and dropped."""

    add_aliases: list[Name] = field(default_factory=list)
    """Names to add."""
    remove_aliases: list[Name] = field(default_factory=list)
    """Names to drop."""


class SetAdapters(ChangeSpec, kw_only=True, tag_field="action", tag="adapters"):
    """Adapters attached and detached; replicas load the new set one at a time (a new scale alone
    restarts nothing)."""

    add: list[Adapter] = field(default_factory=list)
    """Adapters to attach (one of a name attached already is replaced)."""
    remove: list[Annotated[str, Meta(max_length=400)]] = field(default_factory=list)
    """Adapters to detach, each by its name or its source."""
    in_place: bool = False
    """Stop each replica before its replacement starts (no room beside it)."""


ModelChange = Annotated[
    StopModel
    | StartModel
    | RestartModel
    | ScaleModel
    | SetReplicas
    | SetContext
    | SetGpus
    | SetResources
    | SetClass
    | SetOwner
    | SetAliases
    | SetAdapters,
    Meta(title="ModelChange"),
]
"""An operator's change to one model, by name, recorded with who made it: one of the kinds above,
told apart by `action`. Its title is the name docs/subjects.md and a 400's message give it."""
