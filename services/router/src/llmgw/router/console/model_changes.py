"""Every change an operator makes to a model from its card (model_pages.py draws the card and
routes its forms here): each takes the model as the catalog has it now and the revision posted,
checks that a number is a number in range, and asks the catalog, which decides every rule."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar.response import Response

from llmgw.proto import (
    Adapter,
    Model,
    ModelEntry,
    ModelPurge,
    ModelRef,
    Profile,
    PurgeReport,
    Scaling,
    catalog,
)
from llmgw.proto.bounds import (
    MOST_CARDS,
    MOST_CONTEXT,
    MOST_CORES,
    MOST_CPU_MB,
    MOST_IDLE_S,
    MOST_OWNER,
    MOST_REPLICAS,
    MOST_SCALE,
)
from llmgw.proto.catalog import (
    LEAST_CONTEXT,
    RestartModel,
    ScaleModel,
    SetAdapters,
    SetClass,
    SetContext,
    SetGpus,
    SetOwner,
    SetReplicas,
    SetResources,
    StartModel,
    StopModel,
    adapter_name,
)
from llmgw.router.console.web import PREFIX, Refused, View

__all__ = ["ACTIONS"]

_CLASSES = ("critical", "standard", "batch")
_KEPT_SAID = 3
"""Files kept that the note after a purge names one by one (it travels in a cookie)."""


def _spec(view: View, entry: ModelEntry, revision: int) -> dict[str, Any]:
    return {"name": entry.model.name, "by": view.by, "revision": revision}


def _path(name: str) -> str:
    return f"{PREFIX}/models/{name}"


def _replicas(view: View, n: int) -> str:
    return view.t("model.n_replicas.one" if n == 1 else "model.n_replicas.other", n=n)


async def _change(view: View, change: Any, said: Callable[[Model], str]) -> Response:
    """Ask the catalog for `change`; back to the card saying what `said` makes of the model after
    it, and what the catalog warned of."""
    after: ModelEntry = await view.ask(catalog.MODEL_CHANGE, change)
    return view.done(_path(after.model.name), " ".join([said(after.model), *after.warnings]))


async def _stop(view: View, entry: ModelEntry, revision: int) -> Response:
    return await _change(
        view,
        StopModel(**_spec(view, entry, revision)),
        lambda m: view.t("model.msg.stopped", name=m.name, replicas=_replicas(view, m.stopped.max)),
    )


async def _start(view: View, entry: ModelEntry, revision: int) -> Response:
    return await _change(
        view,
        StartModel(**_spec(view, entry, revision)),
        lambda m: view.t("model.msg.started", name=m.name, replicas=_replicas(view, m.scaling.max)),
    )


async def _restart(view: View, entry: ModelEntry, revision: int) -> Response:
    return await _change(
        view,
        RestartModel(**_spec(view, entry, revision), in_place=_in_place(view)),
        lambda m: view.t("model.msg.restarting", name=m.name, replicas=_replicas(view, m.scaling.max)),
    )


def _in_place(view: View) -> bool:
    """Whether the form asks for each replica to be stopped before its replacement starts."""
    return view.form.get("in_place", "") == "1"


def _on(view: View, profile: Profile) -> str:
    """A profile as its replicas field is labelled: on CPUs, or on cards."""
    if profile.gpus:
        return view.t("model.split.on_cards", profile=profile.name, cards=profile.gpus)
    return view.t("model.split.on_cpu", profile=profile.name)


async def _scale(view: View, entry: ModelEntry, revision: int) -> Response:
    """Replicas per profile, and a CPU profile added ("also on CPUs") with replicas there: asked
    of the catalog whenever posted, which refuses it in its own words where it does not apply."""
    m = entry.model
    counts = {
        p.name: view.number(f"replicas.{p.name}", 0, MOST_REPLICAS, label=_on(view, p))
        for p in m.profiles
        if view.form.get(f"replicas.{p.name}", "").strip()  # empty: as it is
    }
    cpu: dict[str, int | None] = {}
    added = view.number("cpu_replicas", 0, MOST_REPLICAS, 0, view.t("model.split.add_cpu"))
    if added:
        counts["cpu"] = added
        cpu["cpu_memory_mb"] = view.number("cpu_memory_mb", 1, MOST_CPU_MB, label=view.t("model.split.cpu_memory"))
        cpu["cpu_cores"] = view.number("cpu_cores", 1, MOST_CORES, 0, view.t("model.split.cpu_cores")) or None

    def said(after: Model) -> str:
        runs = ", ".join(view.t("model.msg.on", n=p.replicas or 0, profile=p.name) for p in after.profiles)
        return view.t("model.msg.replicas", name=after.name, runs=runs)

    return await _change(view, SetReplicas(**_spec(view, entry, revision), counts=counts, **cpu), said)


async def _context(view: View, entry: ModelEntry, revision: int) -> Response:
    """A new context and/or longest answer (a field left empty, or as it was, is kept)."""
    m = entry.model
    context = view.number("context", LEAST_CONTEXT, MOST_CONTEXT, m.context, view.t("model.context"))
    longest = view.number("max_output", 1, MOST_CONTEXT, m.max_output or 0, view.t("model.max_output"))
    change = SetContext(
        **_spec(view, entry, revision),
        in_place=_in_place(view),
        context=context if context != m.context else None,
        max_output=longest if longest and longest != m.max_output else None,
    )
    if change.context is None and change.max_output is None:
        return view.done(_path(m.name), view.t("model.msg.same"))

    def said(after: Model) -> str:
        longest = view.num(after.max_output) if after.max_output else view.t("model.max_output.none")
        if change.context is None:
            return view.t("model.msg.max_output", name=after.name, max_output=longest)
        key = "model.msg.context_stopped" if after.stopped else "model.msg.context"
        replicas = _replicas(view, after.scaling.max)
        return view.t(key, name=after.name, context=view.num(after.context), max_output=longest, replicas=replicas)

    return await _change(view, change, said)


async def _gpus(view: View, entry: ModelEntry, revision: int) -> Response:
    """Cards a replica of each card profile takes (those as they were are left out)."""
    asked = {
        p.name: view.number(f"gpus.{p.name}", 1, MOST_CARDS, label=view.t("model.gpus.label", profile=p.name))
        for p in entry.model.profiles
        if p.gpus and f"gpus.{p.name}" in view.form
    }
    now = {p.name: p.gpus for p in entry.model.profiles}
    changed = {name: n for name, n in asked.items() if n != now[name]}
    if not changed:
        return view.done(_path(entry.model.name), view.t("model.msg.same"))

    def said(after: Model) -> str:
        cards = ", ".join(view.t("model.msg.cards_on", profile=p, n=n) for p, n in changed.items())
        return view.t("model.msg.gpus", name=after.name, cards=cards, replicas=_replicas(view, after.scaling.max))

    return await _change(view, SetGpus(**_spec(view, entry, revision), gpus=changed, in_place=_in_place(view)), said)


async def _resources(view: View, entry: ModelEntry, revision: int) -> Response:
    """The host memory and cores a replica of one profile reserves (a field left empty is kept)."""
    profiles = {p.name: p for p in entry.model.profiles}
    name = view.form.get("profile", "")
    if name not in profiles:
        raise Refused(400, view.t("model.err.profile", profile=name, profiles=", ".join(profiles)))
    p = profiles[name]
    memory = view.number("memory_mb", 1, MOST_CPU_MB, 0, view.t("model.resources.memory")) or None
    cores = view.number("cores", 1, MOST_CORES, 0, view.t("model.resources.cores")) or None
    memory = None if memory == p.host_memory_mb else memory
    cores = None if cores == p.cpu_cores else cores
    if memory is None and cores is None:
        return view.done(_path(entry.model.name), view.t("model.msg.same"))
    change = SetResources(
        **_spec(view, entry, revision), profile=name, memory_mb=memory, cores=cores, in_place=_in_place(view)
    )

    def said(after: Model) -> str:
        q = next(x for x in after.profiles if x.name == name)
        reserves = view.t(
            "model.profile.reserves_cpu",
            cores=q.cpu_cores or view.t("model.profile.half_cores"),
            memory=view.mib(q.host_memory_mb) if q.host_memory_mb else view.t("model.profile.memory_reckoned"),
        )
        return view.t(
            "model.msg.resources",
            name=after.name,
            profile=name,
            reserves=reserves,
            replicas=_replicas(view, after.scaling.max),
        )

    return await _change(view, change, said)


async def _scaling(view: View, entry: ModelEntry, revision: int) -> Response:
    """Replicas kept running and most at once, and the idle time of an on-demand model (0: none);
    its schedule is kept. Not for a stopped model: a new scaling starts it (start it first)."""
    m = entry.model
    if m.stopped is not None:
        raise Refused(409, view.t("model.err.scaling_stopped", name=m.name))
    now = m.scaling
    least = view.number("min", 0, MOST_REPLICAS, now.min, view.t("model.scaling.min"))
    most = view.number("max", 0, MOST_REPLICAS, now.max, view.t("model.scaling.max"))
    idle = view.number("idle_timeout_s", 0, MOST_IDLE_S, now.idle_timeout_s or 0, view.t("model.scaling.idle"))
    scaling = Scaling(min=least, max=most, idle_timeout_s=idle or None, schedule=now.schedule)
    if scaling == now:
        return view.done(_path(m.name), view.t("model.msg.same"))

    def said(after: Model) -> str:
        s = after.scaling
        idle = (
            view.t("model.scaling.idle_s", s=s.idle_timeout_s) if s.idle_timeout_s else view.t("model.scaling.always")
        )
        return view.t("model.msg.scaling", name=after.name, least=s.min, most=s.max, idle=idle)

    return await _change(view, ScaleModel(**_spec(view, entry, revision), scaling=scaling), said)


async def _class(view: View, entry: ModelEntry, revision: int) -> Response:
    """The capacity class: a higher class may take room from a lower one; nothing restarts."""
    chosen = view.form.get("capacity_class", "")
    if chosen not in _CLASSES:
        raise Refused(400, view.t("model.err.class", got=chosen, classes=", ".join(_CLASSES)))
    if chosen == entry.model.capacity_class:
        return view.done(_path(entry.model.name), view.t("model.msg.same"))

    def said(after: Model) -> str:
        return view.t("model.msg.class", name=after.name, said=view.t("model.class." + after.capacity_class))

    return await _change(view, SetClass(**_spec(view, entry, revision), capacity_class=chosen), said)


async def _owner(view: View, entry: ModelEntry, revision: int) -> Response:
    """The team or person responsible (empty: nobody); nothing restarts."""
    owner = view.form.get("owner", "").strip()
    if len(owner) > MOST_OWNER:
        raise Refused(400, view.t("model.err.owner", most=MOST_OWNER, got=len(owner)))
    if owner == entry.model.owner:
        return view.done(_path(entry.model.name), view.t("model.msg.same"))

    def said(after: Model) -> str:
        return (
            view.t("model.msg.owner", name=after.name, owner=after.owner)
            if after.owner
            else view.t("model.msg.no_owner", name=after.name)
        )

    return await _change(view, SetOwner(**_spec(view, entry, revision), owner=owner), said)


def _scale_of(view: View) -> float:
    """The posted adapter scale (empty: 1); Refused (400) where it is not a number in (0, 4]."""
    raw = view.form.get("scale", "").strip() or "1"
    try:
        scale = float(raw)
    except ValueError:
        scale = -1.0
    if not 0 < scale <= MOST_SCALE:
        raise Refused(400, view.t("model.err.scale", got=raw[:20], most=MOST_SCALE))
    return scale


async def _adapter_add(view: View, entry: ModelEntry, revision: int) -> Response:
    """Attach an adapter on the mirror (its name: the one posted, else its file's); the catalog
    checks it against the weights and says why it does not fit."""
    source = view.form.get("source", "").strip()
    adapter = {"name": view.form.get("adapter", "").strip() or adapter_name(source), "source": source}
    try:
        attached = msgspec.convert(adapter | {"scale": _scale_of(view)}, Adapter)
    except msgspec.ValidationError as exc:
        field, got = ("source", source) if "source" in str(exc) else ("adapter", adapter["name"])
        raise Refused(400, view.t(f"model.err.adapter_{field}", got=got)) from None
    change = SetAdapters(**_spec(view, entry, revision), add=[attached], in_place=_in_place(view))

    def said(after: Model) -> str:
        return view.t("model.msg.adapter_added", name=after.name, adapter=attached.name)

    return await _change(view, change, said)


async def _adapter_remove(view: View, entry: ModelEntry, revision: int) -> Response:
    """Detach an adapter by name; replicas load what is left one at a time."""
    name = view.form.get("adapter", "")
    change = SetAdapters(**_spec(view, entry, revision), remove=[name[:400]], in_place=_in_place(view))

    def said(after: Model) -> str:
        return view.t("model.msg.adapter_removed", name=after.name, adapter=name)

    return await _change(view, change, said)


async def _remove(view: View, entry: ModelEntry, revision: int) -> Response:
    await view.ask(catalog.MODEL_REMOVE, ModelRef(name=entry.model.name, revision=revision, by=view.by))
    return view.done(f"{PREFIX}/models", view.t("model.msg.removed", name=entry.model.name))


async def _purge(view: View, entry: ModelEntry, revision: int) -> Response:
    purge = ModelPurge(**_spec(view, entry, revision))
    report: PurgeReport = await view.ask(catalog.MODEL_PURGE, purge)
    return view.done(f"{PREFIX}/models", _purged(view, report))


def _purged(view: View, report: PurgeReport) -> str:
    """What a purge deleted (and where) and what it kept, and why (the first few)."""
    name = report.entry.model.name
    said = [view.t("model.msg.purged", name=name, deleted=len(report.deleted), kept=len(report.kept))]
    if report.deleted:
        said.append(view.t("model.msg.deleted_from", places=", ".join(sorted({d.where for d in report.deleted}))))
    said += [
        view.t("model.msg.kept", source=k.source, where=k.where, why=k.why[:160]) for k in report.kept[:_KEPT_SAID]
    ]
    return " ".join(said)


ACTIONS: dict[str, Callable[[View, ModelEntry, int], Awaitable[Response]]] = {
    "stop": _stop,
    "start": _start,
    "restart": _restart,
    "replicas": _scale,
    "context": _context,
    "gpus": _gpus,
    "resources": _resources,
    "scaling": _scaling,
    "class": _class,
    "owner": _owner,
    "adapter-add": _adapter_add,
    "adapter-remove": _adapter_remove,
    "remove": _remove,
    "purge": _purge,
}
