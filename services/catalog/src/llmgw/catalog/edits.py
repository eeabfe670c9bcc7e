"""Every change an operator makes to a model (`catalog.model.change`), without I/O: what the
model becomes, checked by the catalog's rules (core.py).

Stopping keeps the scaling (counts included) in `stopped`; starting brings it back exactly so.
A change that restarts replicas (context, cards, resources) replaces them one at a time, each
new one ready before the old one stops, or in place where asked.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import assert_never

import msgspec

from llmgw.catalog.core import check_model, counts_of
from llmgw.modelplan import NodeFacts
from llmgw.proto import Adapter, Model, ModelChange, Profile, Scaling
from llmgw.proto.catalog import (
    MOST_ADAPTERS,
    RestartModel,
    ScaleModel,
    SetAdapters,
    SetAliases,
    SetClass,
    SetContext,
    SetGpus,
    SetOwner,
    SetReplicas,
    SetResources,
    StartModel,
    StopModel,
)
from llmgw.proto.errors import BadRequest, Conflict

__all__ = [
    "apply_change",
    "check_resources",
    "restart",
    "scale",
    "set_adapters",
    "set_aliases",
    "set_context",
    "set_gpus",
    "set_replicas",
    "set_resources",
    "start",
    "stop",
    "strip_gpu_args",
]

# llama.cpp flags that put layers on cards; a CPU profile derived from a GPU one drops them.
_GPU_FLAGS = {"--n-gpu-layers", "-ngl", "--split-mode", "-sm", "--tensor-split", "-ts", "--main-gpu", "-mg"}


def strip_gpu_args(args: list[str]) -> list[str]:
    """`args` without the flags that put layers on cards, in `--flag value` and `--flag=value` forms."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in _GPU_FLAGS:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def _cpu_profile_from(model: Model, memory_mb: int, cores: int | None) -> Profile:
    source = next((p for p in model.profiles if p.engine == "llamacpp"), None)
    if source is None:
        engines = ", ".join(sorted({p.engine for p in model.profiles}))
        raise BadRequest(f"model '{model.name}' is served by {engines}, not llama.cpp; only llama.cpp runs on CPUs")
    return msgspec.structs.replace(
        source,
        name="cpu",
        args=strip_gpu_args(source.args),
        gpus=0,
        host_memory_mb=memory_mb,
        cpu_cores=cores,
        priority=min(p.priority for p in model.profiles) - 1,
        replicas=0,
        gpu_class="",
        min_card_mb=0,
        min_compute="",
        tensor_parallel=1,
        cpu_moe_layers=0,
    )


def set_replicas(
    model: Model, counts: dict[str, int], cpu_memory_mb: int | None = None, cpu_cores: int | None = None
) -> Model:
    """Replicas per profile set; profiles not named keep their count; the scaling becomes the sum."""
    profiles = list(model.profiles)
    if cpu_memory_mb is not None:
        if any(p.gpus == 0 for p in profiles):
            cpu = next(p.name for p in profiles if p.gpus == 0)
            raise BadRequest(
                f"model '{model.name}' already has a CPU profile '{cpu}'; set its count instead of --cpu-memory"
            )
        profiles.append(_cpu_profile_from(model, cpu_memory_mb, cpu_cores))
    known = {p.name for p in profiles}
    unknown = sorted(set(counts) - known)
    if unknown:
        raise BadRequest(
            f"model '{model.name}' has no profile {', '.join(unknown)}; its profiles: {', '.join(sorted(known))}"
        )
    profiles = [msgspec.structs.replace(p, replicas=counts.get(p.name, p.replicas or 0)) for p in profiles]
    total = sum(p.replicas for p in profiles)
    if total == 0:
        raise BadRequest(f"model '{model.name}': every count would be zero; to run nothing, stop the model instead")
    return msgspec.structs.replace(model, profiles=profiles, scaling=Scaling(min=total, max=total), stopped=None)


def scale(model: Model, scaling: Scaling) -> Model:
    """A new scaling (starting a stopped model); another total ends the counts per profile."""
    counts = counts_of(model)
    profiles = model.profiles
    if counts is not None and (scaling.min, scaling.max) != (sum(counts.values()),) * 2:
        profiles = [msgspec.structs.replace(p, replicas=None) for p in profiles]
    return msgspec.structs.replace(model, profiles=profiles, scaling=scaling, stopped=None)


def stop(model: Model) -> Model:
    """Stopped: nothing runs; the scaling (and counts) are kept for start."""
    if model.stopped is not None:
        raise Conflict(f"model '{model.name}' is already stopped; `start` brings it back")
    return msgspec.structs.replace(model, stopped=model.scaling, scaling=Scaling(min=0, max=0))


def start(model: Model) -> Model:
    """Back exactly as it was when stopped."""
    if model.stopped is None:
        raise Conflict(f"model '{model.name}' is not stopped")
    return msgspec.structs.replace(model, scaling=model.stopped, stopped=None)


def set_context(model: Model, context: int | None, max_output: int | None) -> Model:
    """A new context length and/or longest answer (the answer must fit in the context)."""
    if context is None and max_output is None:
        raise BadRequest(f"model '{model.name}': give a context, a max_output, or both")
    changed = msgspec.structs.replace(
        model, context=context or model.context, max_output=max_output or model.max_output
    )
    if changed.max_output and changed.max_output >= changed.context:
        raise BadRequest(
            f"model '{model.name}': max_output {changed.max_output} does not fit in context {changed.context}; "
            "lower it or raise the context"
        )
    return changed


def set_gpus(model: Model, gpus: dict[str, int]) -> Model:
    """GPUs per replica on the profiles named; a CPU profile cannot get cards, nor a GPU one lose them all."""
    names = {p.name: p for p in model.profiles}
    for name, count in gpus.items():
        if name not in names:
            raise BadRequest(f"model '{model.name}' has no profile {name}; its profiles: {', '.join(sorted(names))}")
        if names[name].gpus == 0 or count == 0:
            raise BadRequest(
                f"model '{model.name}' profile '{name}': GPUs change between card counts only; "
                "a CPU profile is its own profile (see `replicas --cpu-memory`)"
            )
    return msgspec.structs.replace(
        model, profiles=[msgspec.structs.replace(p, gpus=gpus.get(p.name, p.gpus)) for p in model.profiles]
    )


def set_resources(model: Model, profile: str, memory_mb: int | None, cores: int | None) -> Model:
    """A profile's host memory and cores per replica (`None`: unchanged); at least one is given."""
    names = {p.name: p for p in model.profiles}
    if profile not in names:
        raise BadRequest(f"model '{model.name}' has no profile {profile}; its profiles: {', '.join(sorted(names))}")
    if memory_mb is None and cores is None:
        raise BadRequest(
            f"model '{model.name}' profile '{profile}': say what to change: its memory, its cores, or both"
        )
    old = names[profile]
    new = msgspec.structs.replace(
        old,
        host_memory_mb=old.host_memory_mb if memory_mb is None else memory_mb,
        cpu_cores=old.cpu_cores if cores is None else cores,
    )
    return msgspec.structs.replace(model, profiles=[new if p.name == profile else p for p in model.profiles])


def check_resources(change: SetResources, nodes: list[NodeFacts]) -> None:
    """Raise BadRequest where no node of the fleet has the memory or the cores a replica of the
    change would reserve, naming the node with the most; with no node registered, taken."""
    if not nodes:
        return
    if change.memory_mb is not None:
        big = max(nodes, key=lambda n: n.memory_total_mb)
        if change.memory_mb > big.memory_total_mb:
            raise BadRequest(
                f"model '{change.name}' profile '{change.profile}': {change.memory_mb / 1024:.1f} GiB is more memory "
                f"than any node has; the most is {big.memory_total_mb / 1024:.1f} GiB on {big.name}: "
                f"ask for {big.memory_total_mb // 1024} GiB or less"
            )
    if change.cores is not None:
        big = max(nodes, key=lambda n: n.cpus)
        if change.cores > big.cpus:
            raise BadRequest(
                f"model '{change.name}' profile '{change.profile}': {change.cores} cores is more than any node has; "
                f"the most is {big.cpus} on {big.name}: ask for {big.cpus} or fewer"
            )


def set_aliases(model: Model, add: list[str], remove: list[str]) -> Model:
    """Aliases added and dropped (dropping one it does not have is refused)."""
    missing = sorted(set(remove) - set(model.aliases))
    if missing:
        raise BadRequest(
            f"model '{model.name}' has no alias {', '.join(missing)}; its aliases: {', '.join(model.aliases) or 'none'}"
        )
    aliases = [a for a in model.aliases if a not in remove] + [a for a in add if a not in model.aliases]
    return msgspec.structs.replace(model, aliases=aliases)


def set_adapters(model: Model, add: list[Adapter], remove: list[str]) -> Model:
    """Adapters detached (each by name or source) and attached (one of a name attached already
    replaced: a new scale, say); at most `MOST_ADAPTERS` in all."""
    if not add and not remove:
        raise BadRequest(f"model '{model.name}': say what to change: adapters to add, to remove, or both")
    attached = ", ".join(f"{a.name} ({a.source})" for a in model.adapters) or "none"
    missing = [r for r in remove if not any(r in (a.name, a.source) for a in model.adapters)]
    if missing:
        raise BadRequest(f"model '{model.name}' has no adapter {', '.join(missing)}; its adapters: {attached}")
    names = [a.name for a in add]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise BadRequest(f"model '{model.name}': adapter {', '.join(dupes)} is added twice; name each once")
    added = {a.name: a for a in add}  # one attached already keeps its place (a new scale restarts nothing)
    kept = [added.pop(a.name, a) for a in model.adapters if a.name not in remove and a.source not in remove]
    adapters = kept + list(added.values())
    if len(adapters) > MOST_ADAPTERS:
        raise BadRequest(
            f"model '{model.name}' would have {len(adapters)} adapters; a model loads at most {MOST_ADAPTERS}: "
            "remove some first"
        )
    return msgspec.structs.replace(model, adapters=adapters)


def restart(model: Model) -> Model:
    """Every replica started again, one at a time: a new generation makes each one stale."""
    if model.stopped is not None:
        raise Conflict(f"model '{model.name}' is stopped: nothing runs to restart; `start` brings it back")
    return msgspec.structs.replace(model, generation=model.generation + 1)


def apply_change(model: Model, change: ModelChange, allowed: Collection[str] = ()) -> Model:
    """The model after `change`, checked (`allowed`: as `check_model` takes it)."""
    match change:
        case StopModel():
            changed = stop(model)
        case StartModel():
            changed = start(model)
        case RestartModel(in_place=in_place):
            changed = _rolled(restart(model), in_place)
        case ScaleModel(scaling=scaling):
            changed = scale(model, scaling)
        case SetReplicas(counts=counts, cpu_memory_mb=memory_mb, cpu_cores=cores):
            changed = set_replicas(model, counts, memory_mb, cores)
        case SetContext(context=context, max_output=max_output, in_place=in_place):
            changed = _rolled(set_context(model, context, max_output), in_place)
        case SetGpus(gpus=gpus, in_place=in_place):
            changed = _rolled(set_gpus(model, gpus), in_place)
        case SetResources(profile=profile, memory_mb=memory_mb, cores=cores, in_place=in_place):
            changed = _rolled(set_resources(model, profile, memory_mb, cores), in_place)
        case SetClass() | SetOwner() | SetAliases():
            changed = _named(model, change)
        case SetAdapters(add=add, remove=remove, in_place=in_place):
            changed = _rolled(set_adapters(model, add, remove), in_place)
        case _:
            assert_never(change)
    check_model(changed, allowed)
    return changed


def _named(model: Model, change: SetClass | SetOwner | SetAliases) -> Model:
    """The model after a change that restarts nothing: its class, owner or aliases."""
    match change:
        case SetClass(capacity_class=capacity_class):
            return msgspec.structs.replace(model, capacity_class=capacity_class)
        case SetOwner(owner=owner):
            return msgspec.structs.replace(model, owner=owner)
        case SetAliases(add_aliases=add, remove_aliases=remove):
            return set_aliases(model, add, remove)
        case _:
            assert_never(change)


def _rolled(model: Model, in_place: bool) -> Model:
    """`model` with the way its stale replicas are replaced: in place, or each new one beside the old."""
    return msgspec.structs.replace(model, rollout="in-place" if in_place else "surge")
