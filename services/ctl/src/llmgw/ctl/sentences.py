"""One sentence for each change `llmgw ctl` makes: what changed, and what happens next; without
I/O."""

from __future__ import annotations

from typing import assert_never

from llmgw.proto import Model, ModelChange, ModelEntry, PurgeReport, Scaling
from llmgw.proto.catalog import (
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

__all__ = ["added", "purged", "removed", "said"]

_CLASS = {
    "critical": "it may take room from standard and batch models",
    "standard": "it may take room from batch models, and critical ones from it",
    "batch": "critical and standard models may take its room",
}


def _replicas(scaling: Scaling) -> str:
    """'1 replica', '3 replicas', '1..3 replicas'."""
    if scaling.min != scaling.max:
        return f"{scaling.min}..{scaling.max} replicas"
    return f"{scaling.min} replica" + ("" if scaling.min == 1 else "s")


def _counts(model: Model) -> str:
    """' (gpu=2, cpu=1)' when counted per profile, else ''."""
    counts = [f"{p.name}={p.replicas}" for p in model.profiles if p.replicas is not None]
    return f" ({', '.join(counts)})" if counts else ""


def _rollout(model: Model) -> str:
    """How its stale replicas are replaced."""
    if model.rollout == "in-place":
        return "each stops before its replacement starts"
    return "each replacement is ready before the old one stops"


def _reserves(m: Model, name: str) -> str:
    """What a replica of profile `name` reserves now, in words."""
    p = next(p for p in m.profiles if p.name == name)
    memory = f"{p.host_memory_mb / 1024:.1f} GiB" if p.host_memory_mb else "the estimate's memory"
    cores = f"{p.cpu_cores} cores" if p.cpu_cores else "half a node's cores"
    return f"a replica of profile {name} reserves {memory} and {cores}"


def said(change: ModelChange, entry: ModelEntry) -> str:
    """What `change` did to the model (now `entry`) and what happens next."""
    m = entry.model
    n = m.name
    match change:
        case StopModel():
            return f"Stopped {n}: its replicas stop; `llmgw ctl model start {n}` brings back {_replicas(m.stopped)}."
        case StartModel():
            return f"Started {n}: the scheduler brings back {_replicas(m.scaling)}{_counts(m)}."
        case RestartModel():
            return f"Restarting {n} (generation {m.generation}): its replicas start again one at a time; {_rollout(m)}."
        case ScaleModel():
            return f"{n} now runs {_replicas(m.scaling)}: the scheduler starts or stops replicas to match."
        case SetReplicas():
            return f"{n} now runs {_replicas(m.scaling)}{_counts(m)}: those short start first, then those over stop."
        case SetContext(context=None):
            return f"{n}: max output {m.max_output}, applied at once; no replica restarts."
        case SetContext():
            return (
                f"{n}: context {m.context}, max output {m.max_output or 'unset'}; "
                f"its replicas restart one at a time, {_rollout(m)}."
            )
        case SetGpus(gpus=gpus):
            cards = ", ".join(f"profile {p.name} takes {p.gpus} GPUs a replica" for p in m.profiles if p.name in gpus)
            return f"{n}: {cards}; its replicas restart one at a time, {_rollout(m)}."
        case SetResources(profile=name):
            return f"{n}: {_reserves(m, name)}; its replicas restart one at a time, {_rollout(m)}."
        case SetClass() | SetOwner() | SetAliases():
            return _nothing_restarts(change, m)
        case SetAdapters():
            names = ", ".join(f"{n}:{a.name}" for a in m.adapters) or "none"
            return f"{n}: adapters {names}; where the set changed, its replicas load it one at a time, {_rollout(m)}."
        case _:
            assert_never(change)


def _nothing_restarts(change: SetClass | SetOwner | SetAliases, m: Model) -> str:
    """What a change that restarts no replica did."""
    n = m.name
    match change:
        case SetClass():
            return f"{n} is now class {m.capacity_class}: {_CLASS[m.capacity_class]}; nothing restarts."
        case SetOwner():
            return f"{n} is now owned by {m.owner}; nothing restarts." if m.owner else f"{n} has no owner now."
        case SetAliases():
            return f"{n}: aliases {', '.join(m.aliases) or 'none'}; routers answer to them at once, nothing restarts."


def added(entry: ModelEntry) -> str:
    """What `llmgw ctl model add` put in the catalog and what the scheduler does with it."""
    m = entry.model
    if m.stopped:
        then = f"it is stopped; `llmgw ctl model start {m.name}` runs it"
    elif m.scaling.min == 0 and m.scaling.idle_timeout_s:
        then = f"none runs until a request asks for it (then up to {_replicas(Scaling(min=1, max=m.scaling.max))})"
    else:
        then = f"the scheduler places {_replicas(m.scaling)}{_counts(m)}"
    return f"{m.name} is in the catalog: {then}; `llmgw ctl models` shows how it is doing."


def removed(entry: ModelEntry) -> str:
    """What `llmgw ctl model remove` did."""
    return f"Removed {entry.model.name} from the catalog: its replicas stop; its files stay (`--purge` deletes them)."


def purged(report: PurgeReport) -> str:
    """What a purge deleted and what it kept, and why."""
    said = [f"Removed {report.entry.model.name} from the catalog."]
    by_source: dict[str, list[str]] = {}
    for d in report.deleted:
        by_source.setdefault(d.source, []).append(d.where)
    said += [f"Deleted {source} from {', '.join(sorted(where))}." for source, where in by_source.items()]
    said += [f"Kept {k.source} ({k.where}): {k.why}." for k in report.kept]
    if not report.deleted and not report.kept:
        said.append(f"No copy of {report.entry.model.source} was found to delete.")
    return " ".join(said)
