"""The catalog's rules, without I/O: what makes a model acceptable, and every change to one.

Replicas per profile: when any profile of a model has a count, each profile runs exactly
its count and the scaling is their sum (min and max alike). Stopping keeps the scaling
(counts included) in `stopped`; starting brings it back exactly so.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import assert_never

import msgspec

from llmgw.modelplan import check_engine_args
from llmgw.proto import (
    FileInfo,
    FilePlace,
    Model,
    ModelChange,
    ModelEntry,
    Profile,
    PurgeReport,
    Scaling,
    WeightsDeleted,
)
from llmgw.proto.catalog import (
    RestartModel,
    ScaleModel,
    SetAliases,
    SetClass,
    SetContext,
    SetGpus,
    SetOwner,
    SetReplicas,
    StartModel,
    StopModel,
)
from llmgw.proto.errors import BadRequest, BusError, Conflict

__all__ = [
    "apply_change",
    "check_catalog",
    "check_editable",
    "check_file",
    "check_model",
    "check_removable",
    "counts_of",
    "files_to_purge",
    "is_pinned",
    "restart",
    "scale",
    "set_aliases",
    "set_context",
    "set_gpus",
    "set_replicas",
    "start",
    "stop",
    "strip_gpu_args",
    "tally_purge",
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


def check_model(model: Model, allowed: Collection[str] = ()) -> None:
    """Raise BadRequest saying what is wrong with `model` beyond its schema; its engines' args and
    env keep to `llmgw.modelplan.check_engine_args`, with the flags and variables `allowed` besides
    (the catalog's `engine_args_allowed`: what chosen nodes opted into)."""
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
        _check_profile(model, p, allowed)
    if model.name in model.aliases:
        raise BadRequest(f"model '{model.name}': an alias cannot be the model's own name")
    if model.name in model.fallbacks:
        raise BadRequest(f"model '{model.name}': a model cannot fall back to itself; name another model")
    _check_counts(model)


def _check_profile(model: Model, p: Profile, allowed: Collection[str]) -> None:
    """Raise BadRequest where profile `p` cannot serve `model` as it says, or gives its engine
    what it may not (`allowed` besides the allow-list)."""
    where = f"model '{model.name}' profile '{p.name}'"
    refused = check_engine_args(p.engine, p.args, p.env, allowed)
    if refused:
        raise BadRequest(f"{where}: {'; '.join(refused)}")
    if p.engine == "llamacpp" and not model.source.endswith(".gguf"):
        raise BadRequest(f"{where}: llama.cpp serves GGUF files; source '{model.source}' is not a .gguf")
    if p.gpus and p.gpus % p.tensor_parallel:
        raise BadRequest(
            f"{where}: tensor_parallel {p.tensor_parallel} does not divide its {p.gpus} GPUs; use a divisor of {p.gpus}"
        )
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


def _check_counts(model: Model) -> None:
    """Raise BadRequest where counts per profile disagree with the scaling, or meet a schedule."""
    counts = counts_of(model)
    if counts is None:
        return
    scaling = model.stopped or model.scaling
    if scaling.schedule:
        raise BadRequest(
            f"model '{model.name}': replicas per profile and a schedule are one or the other; "
            "drop the schedule or the counts"
        )
    total = sum(counts.values())
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


def is_pinned(source: str) -> bool:
    """Whether `source` names a file fetched at a commit ('OWNER/REPO@COMMIT/FILE')."""
    return "@" in source.split("/")[1]


def check_file(model: Model, info: FileInfo) -> None:
    """400 for a model whose file (as the mirror holds it) has a GGUF header that does not read:
    no engine could load it; and for a pinned source the mirror holds but has not verified."""
    if is_pinned(model.source) and not info.verified:
        raise BadRequest(
            f"model '{model.name}': the mirror has not verified {model.source}; "
            "`llmgw ctl mirror show` says how its fetch is doing"
        )
    if info.header_error:
        raise BadRequest(
            f"model '{model.name}': its file {info.header_error}; put a GGUF model there, or name another source"
        )


def check_editable(entry: ModelEntry, revision: int | None = None) -> None:
    """Raise where `entry` may not be changed through the API: it is declared in a file, or it is
    not at the `revision` the change expects (None: any)."""
    name = entry.model.name
    if entry.declared_in:
        raise BadRequest(f"model '{name}' is declared in {entry.declared_in}; change it there and restart the catalog")
    if revision is not None and revision != entry.revision:
        raise Conflict(
            f"model '{name}' is at revision {entry.revision}, not {revision}: someone changed it since; see how "
            f"(`llmgw ctl model get {name}`) and reapply your change at revision {entry.revision}"
        )


def check_removable(name: str, others: dict[str, Model]) -> None:
    """Raise BadRequest where another model falls back to `name`."""
    leaning = sorted(n for n, m in others.items() if name in m.fallbacks)
    if leaning:
        raise BadRequest(f"model '{name}' is a fallback of {', '.join(leaning)}; remove it from their fallbacks first")


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


def tally_purge(
    entry: ModelEntry, sources: list[str], kept: list[FilePlace], answers: list[WeightsDeleted | BusError]
) -> PurgeReport:
    """What a purge of `entry` deleted and kept, from every answer to its delete of `sources` (an
    error keeps each source in an unknown place, saying why)."""
    report = PurgeReport(entry=entry, kept=list(kept))
    for answer in answers:
        if isinstance(answer, BusError):
            report.kept.extend(FilePlace(source=s, where="unknown", why=answer.message) for s in sources)
            continue
        report.deleted.extend(FilePlace(source=s, where=answer.where) for s in answer.deleted)
        report.kept.extend(answer.kept)
    return report


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
        case SetClass(capacity_class=capacity_class):
            changed = msgspec.structs.replace(model, capacity_class=capacity_class)
        case SetOwner(owner=owner):
            changed = msgspec.structs.replace(model, owner=owner)
        case SetAliases(add_aliases=add, remove_aliases=remove):
            changed = set_aliases(model, add, remove)
        case _:
            assert_never(change)
    check_model(changed, allowed)
    return changed


def _rolled(model: Model, in_place: bool) -> Model:
    """`model` with the way its stale replicas are replaced: in place, or each new one beside the old."""
    return msgspec.structs.replace(model, rollout="in-place" if in_place else "surge")
