"""The catalog's rules, without I/O: what makes a model acceptable, and every change to one.

Replicas per profile: when any profile of a model has a count, each profile runs exactly
its count and the scaling is their sum (min and max alike). Stopping keeps the scaling
(counts included) in `stopped`; starting brings it back exactly so.
"""

from __future__ import annotations

import msgspec

from llmgw.bus import BadRequest, Conflict
from llmgw.proto import FilePlace, Model, ModelChange, Profile, Scaling

__all__ = [
    "apply_change",
    "check_catalog",
    "check_model",
    "counts_of",
    "files_to_purge",
    "restart",
    "scale",
    "set_aliases",
    "set_context",
    "set_gpus",
    "set_replicas",
    "start",
    "stop",
    "strip_gpu_args",
]

# llama.cpp flags that put layers on cards; a CPU profile derived from a GPU one drops them.
_GPU_FLAGS = {"--n-gpu-layers", "-ngl", "--split-mode", "-sm", "--tensor-split", "-ts", "--main-gpu", "-mg"}


def counts_of(model: Model) -> dict[str, int] | None:
    """Replicas per profile, or None when the model is not counted per profile."""
    if all(p.replicas is None for p in model.profiles):
        return None
    return {p.name: p.replicas or 0 for p in model.profiles}


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in counts.items())


def check_model(model: Model) -> None:
    """Raise BadRequest saying what is wrong with `model` beyond its schema."""
    names = [p.name for p in model.profiles]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BadRequest(f"model '{model.name}': profile names must be unique; repeated: {', '.join(dupes)}")
    for scaling, what in ((model.scaling, "scaling"), (model.stopped, "stopped scaling")):
        if scaling is not None and scaling.min > scaling.max:
            raise BadRequest(
                f"model '{model.name}': {what} min {scaling.min} is above max {scaling.max}; raise max or lower min"
            )
    for p in model.profiles:
        if p.engine == "llamacpp" and not model.source.endswith(".gguf"):
            raise BadRequest(
                f"model '{model.name}' profile '{p.name}': llama.cpp serves GGUF files; "
                f"source '{model.source}' is not a .gguf"
            )
    for p in model.profiles:
        if p.gpus and p.gpus % p.tensor_parallel:
            raise BadRequest(
                f"model '{model.name}' profile '{p.name}': tensor_parallel {p.tensor_parallel} does not divide its "
                f"{p.gpus} GPUs; use a divisor of {p.gpus}"
            )
    for p in model.profiles:
        where = f"model '{model.name}' profile '{p.name}'"
        if p.kv_events and p.engine != "vllm":
            raise BadRequest(
                f"{where}: kv_events is vLLM's (llama.cpp publishes none; the router learns its "
                "cache from the cached tokens it reports); drop kv_events or use engine vllm"
            )
        if p.nodes > 1 and p.engine != "llamacpp":
            raise BadRequest(f"{where}: only llama.cpp spans nodes here (RPC workers); use engine llamacpp or nodes 1")
        if (p.min_card_mb or p.min_compute or p.gpu_class) and not p.gpus:
            raise BadRequest(
                f"{where}: gpu_class, min_card_mb and min_compute say which cards it needs, and it "
                "takes none; set gpus or drop them"
            )
        if p.keep_within and p.nodes == 1:
            raise BadRequest(
                f"{where}: keep_within '{p.keep_within}' only applies to a replica across nodes; "
                "set nodes above 1 or drop keep_within"
            )
    if model.name in model.aliases:
        raise BadRequest(f"model '{model.name}': an alias cannot be the model's own name")
    if model.name in model.fallbacks:
        raise BadRequest(f"model '{model.name}': a model cannot fall back to itself; name another model")
    counts = counts_of(model)
    if counts is not None and (model.stopped or model.scaling).schedule:
        raise BadRequest(
            f"model '{model.name}': replicas per profile and a schedule are one or the other; "
            "drop the schedule or the counts"
        )
    if counts is not None:
        total = sum(counts.values())
        scaling = model.stopped or model.scaling
        if (scaling.min, scaling.max) != (total, total):
            raise BadRequest(
                f"model '{model.name}': replicas per profile add up to {total} ({_describe(counts)}) "
                f"but its scaling is min {scaling.min}, max {scaling.max}; set both to {total} or change the counts"
            )


def check_catalog(model: Model, others: dict[str, Model]) -> None:
    """Raise BadRequest where `model` clashes with the rest of the catalog (`others`, without it)."""
    taken = {alias: o.name for o in others.values() for alias in o.aliases}
    if model.name in taken:
        raise BadRequest(f"model '{model.name}': that name is an alias of model '{taken[model.name]}'")
    for alias in model.aliases:
        if alias in others:
            raise BadRequest(f"model '{model.name}': alias '{alias}' is another model's name; pick another alias")
        if alias in taken:
            raise BadRequest(f"model '{model.name}': alias '{alias}' is already an alias of model '{taken[alias]}'")
    for fallback in model.fallbacks:
        if fallback not in others:
            raise BadRequest(f"model '{model.name}': fallback '{fallback}' is not in the catalog; add it first")


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


def set_aliases(model: Model, add: list[str], remove: list[str]) -> Model:
    """Aliases added and dropped (dropping one it does not have is refused)."""
    missing = sorted(set(remove) - set(model.aliases))
    if missing:
        raise BadRequest(
            f"model '{model.name}' has no alias {', '.join(missing)}; its aliases: {', '.join(model.aliases) or 'none'}"
        )
    aliases = [a for a in model.aliases if a not in remove] + [a for a in add if a not in model.aliases]
    return msgspec.structs.replace(model, aliases=aliases)


def restart(model: Model) -> Model:
    """Every replica started again, one at a time: a new generation makes each one stale."""
    if model.stopped is not None:
        raise Conflict(f"model '{model.name}' is stopped: nothing runs to restart; `start` brings it back")
    return msgspec.structs.replace(model, generation=model.generation + 1)


def files_to_purge(model: Model, others: dict[str, Model]) -> tuple[list[str], list[FilePlace]]:
    """The files a purge of `model` deletes, and those it keeps because another model uses them."""
    users = sorted(o.name for o in others.values() if o.name != model.name and o.source == model.source)
    if users:
        return [], [FilePlace(source=model.source, where="everywhere", why=f"model {', '.join(users)} uses it")]
    return [model.source], []


def apply_change(model: Model, change: ModelChange) -> Model:
    """The model after `change`, checked."""
    action = change.action
    if action == "stop":
        changed = stop(model)
    elif action == "start":
        changed = start(model)
    elif action == "restart":
        changed = restart(model)
    elif action == "scale":
        if change.scaling is None:
            raise BadRequest('scale needs a scaling: {"min": N, "max": M}')
        changed = scale(model, change.scaling)
    elif action == "replicas":
        changed = set_replicas(model, change.counts, change.cpu_memory_mb, change.cpu_cores)
    elif action == "context":
        changed = set_context(model, change.context, change.max_output)
    elif action == "gpus":
        changed = set_gpus(model, change.gpus)
    elif action == "class":
        if change.capacity_class is None:
            raise BadRequest("class needs a capacity_class: critical, standard or batch")
        changed = msgspec.structs.replace(model, capacity_class=change.capacity_class)
    elif action == "owner":
        changed = msgspec.structs.replace(model, owner=change.owner or "")
    else:
        changed = set_aliases(model, change.add_aliases, change.remove_aliases)
    if action in ("restart", "context", "gpus"):
        changed = msgspec.structs.replace(changed, rollout="in-place" if change.in_place else "surge")
    check_model(changed)
    return changed
