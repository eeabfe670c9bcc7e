"""The models page and each model's card.

The list: every model in the catalog with how it is doing (the scheduler's status) and its replicas'
memory and speed. The card (`/console/models/{name}`): its state and replicas, its settings, its
replicas on each profile with the CPU's speed beside (the catalog's serve plan for its file), and
every change an operator makes to it. Each change is a form carrying the revision the page was
drawn at: the catalog changes exactly that version or answers 409, and the card is drawn again as
the model is now, saying so. The catalog decides every rule; the card only checks that a number
is a number in range before asking.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from litestar import get, post
from litestar.response import Response

from llmgw.proto import (
    Empty,
    Model,
    ModelEntry,
    ModelPurge,
    ModelRef,
    Profile,
    PurgeReport,
    catalog,
    replica_totals,
    scheduler,
)
from llmgw.proto.catalog import (
    LEAST_CONTEXT,
    MOST_REVISION,
    RestartModel,
    ServePlanAsk,
    ServeWay,
    SetContext,
    SetGpus,
    SetReplicas,
    SetResources,
    StartModel,
    StopModel,
)
from llmgw.router.console.limits import MOST_CONTEXT, MOST_CORES
from llmgw.router.console.web import PREFIX, Refused, View

__all__ = ["ROUTES"]

MOST_REPLICAS = 64
"""The most replicas a profile is given from the card."""
MOST_CARDS = 64
MOST_CPU_MB = 4 << 20
"""The most host memory a CPU replica reserves, MiB (4 TiB)."""
_KEPT_SAID = 3
"""Files kept that the note after a purge names one by one (it travels in a cookie)."""


async def _scheduler(view: View) -> tuple[dict[str, Any] | None, list[Any] | None]:
    """Each model's status by name and every replica; None for either while the scheduler does
    not answer (the page says so)."""
    answers = await asyncio.gather(
        view.ask(scheduler.MODEL_STATUS, Empty()),
        view.ask(scheduler.REPLICA_LIST, Empty()),
        return_exceptions=True,
    )
    for answer in answers:
        if isinstance(answer, BaseException) and not isinstance(answer, Refused):
            raise answer
    listed, replicas = (None if isinstance(a, Refused) else a for a in answers)
    return ({s.model: s for s in listed.models} if listed else None), (replicas.replicas if replicas else None)


@get("/models")
async def models_page(view: View) -> Response:
    """Every model: its file, state, replicas ready of wanted, memory, speed and profiles."""
    entries = [m for m in (await view.ask(catalog.MODEL_LIST, Empty())).models if view.runs(m.model.name)]
    status, replicas = await _scheduler(view)
    return view.render("models.html", entries=entries, statuses=status, totals=replica_totals(replicas or []))


def _cpu_profile(model: Model) -> Profile | None:
    """The model's CPU profile (one with no cards), if it has one."""
    return next((p for p in model.profiles if not p.gpus), None)


async def _cpu_way(view: View, model: Model) -> tuple[ServeWay | None, str]:
    """How the model's file runs on the fleet's CPUs, from the catalog's serve plan (its best CPU
    way, with its speed and node), or why that is not known in the catalog's words (it plans
    GGUF files only, for llama.cpp)."""
    cpu = _cpu_profile(model)
    base = cpu or next((p for p in model.profiles if p.engine == "llamacpp"), model.profiles[0])
    ask = ServePlanAsk(source=model.source, context=model.context, cores=base.cpu_cores or 0, slots=base.slots)
    try:
        plan = await view.ask(catalog.SERVE_PLAN, ask, optional=True)
    except Refused as exc:
        return None, view.t("model.cpu.unknown", why=exc.message)
    way = next((w for w in plan.ways if w.kind in ("cpu", "across-nodes")), None)
    return way, "" if way else view.t("model.cpu.no_way")


def _counts(model: Model) -> dict[str, int]:
    """Replicas per profile as the card's form shows them: the counts where the model has them,
    else its one profile's replicas (as stopped, when it is)."""
    if any(p.replicas is not None for p in model.profiles):
        return {p.name: p.replicas or 0 for p in model.profiles}
    if len(model.profiles) == 1:
        return {model.profiles[0].name: (model.stopped or model.scaling).max}
    return {}


def _unknown(view: View, name: str) -> Response:
    return view.render("error.html", status=404, message=view.t("model.err.unknown", name=name))


async def _card(view: View, name: str, status: int = 200, error: str = "", posted: str = "") -> Response:
    """The card of `name` as it is now; after a refused form, with `error` (a 409 where the model
    moved past the revision posted says so) and the `posted` form's values kept."""
    try:
        entry: ModelEntry = await view.ask(catalog.MODEL_GET, ModelRef(name=name))
    except Refused as exc:
        if exc.status in (400, 404):  # 400: not even a name the catalog takes
            return _unknown(view, name)
        raise
    if status == 409 and view.form.get("revision", "").strip() != str(entry.revision):
        error = view.t("model.err.stale", by=entry.changed_by or "?")
    (statuses, replicas), (cpu_way, cpu_why) = await asyncio.gather(_scheduler(view), _cpu_way(view, entry.model))
    return view.render(
        "model.html",
        status=status,
        active="models",
        e=entry,
        m=entry.model,
        s=(statuses or {}).get(name),
        answered=statuses is not None,
        replicas=[r for r in replicas or [] if r.model == name],
        cpu_way=cpu_way,
        cpu_why=cpu_why,
        can_add_cpu=cpu_way is not None and _cpu_profile(entry.model) is None,
        counts=_counts(entry.model),
        error=error,
        posted=posted,
        limits={
            "replicas": MOST_REPLICAS,
            "least_context": LEAST_CONTEXT,
            "tokens": MOST_CONTEXT,
            "cards": MOST_CARDS,
            "cores": MOST_CORES,
        },
        most_cpu_mb=MOST_CPU_MB,
    )


@get("/models/{name:str}")
async def model_page(view: View, name: str) -> Response:
    """One model's card."""
    return await _card(view, name)


# the actions: each takes the model as the catalog has it now and the revision posted


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


_ACTIONS: dict[str, Callable[[View, ModelEntry, int], Awaitable[Response]]] = {
    "stop": _stop,
    "start": _start,
    "restart": _restart,
    "replicas": _scale,
    "context": _context,
    "gpus": _gpus,
    "resources": _resources,
    "remove": _remove,
    "purge": _purge,
}


@post("/models/{name:str}/{action:str}")
async def model_action(view: View, name: str, action: str) -> Response:
    """One change to a model from its card, at the revision the card was drawn at; refused (a
    number out of range, the catalog's refusal, a revision it moved past), the card is drawn again
    with why, as the model is now, and nothing was changed."""
    if action not in _ACTIONS:
        return view.render("error.html", status=404, message=view.t("model.err.action", action=action))
    try:
        revision = view.number("revision", 1, MOST_REVISION, label=view.t("model.revision"))
        entry: ModelEntry = await view.ask(catalog.MODEL_GET, ModelRef(name=name))
        return await _ACTIONS[action](view, entry, revision)
    except Refused as exc:
        return await _card(view, name, exc.status, exc.message, posted=action)


ROUTES = (models_page, model_page, model_action)
