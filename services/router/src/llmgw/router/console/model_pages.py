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
from typing import Any

from litestar import get, post
from litestar.response import Response

from llmgw.proto import (
    Empty,
    Model,
    ModelEntry,
    ModelRef,
    Profile,
    catalog,
    replica_totals,
    scheduler,
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
    MOST_ADAPTERS,
    MOST_REVISION,
    ServePlanAsk,
    ServeWay,
)
from llmgw.proto.scheduler import ModelRoom, ProfileRoom, RoomAsk
from llmgw.router.console.model_changes import ACTIONS
from llmgw.router.console.web import Refused, View

__all__ = ["ROUTES"]


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


async def _room(view: View, name: str) -> dict[str, ProfileRoom]:
    """How many more replicas of each profile fit now, as the scheduler reckons it; none while
    it does not answer (the form says nothing then)."""
    try:
        room: ModelRoom = await view.ask(scheduler.MODEL_ROOM, RoomAsk(name=name), optional=True)
    except Refused:
        return {}
    return {p.profile: p for p in room.profiles}


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
    (statuses, replicas), (cpu_way, cpu_why), room = await asyncio.gather(
        _scheduler(view), _cpu_way(view, entry.model), _room(view, name)
    )
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
        room=room,
        error=error,
        posted=posted,
        limits={
            "replicas": MOST_REPLICAS,
            "least_context": LEAST_CONTEXT,
            "tokens": MOST_CONTEXT,
            "cards": MOST_CARDS,
            "cores": MOST_CORES,
            "idle_s": MOST_IDLE_S,
            "owner": MOST_OWNER,
            "scale": MOST_SCALE,
            "adapters": MOST_ADAPTERS,
        },
        most_cpu_mb=MOST_CPU_MB,
    )


@get("/models/{name:str}")
async def model_page(view: View, name: str) -> Response:
    """One model's card."""
    return await _card(view, name)


@post("/models/{name:str}/{action:str}")
async def model_action(view: View, name: str, action: str) -> Response:
    """One change to a model from its card, at the revision the card was drawn at; refused (a
    number out of range, the catalog's refusal, a revision it moved past), the card is drawn again
    with why, as the model is now, and nothing was changed."""
    if action not in ACTIONS:
        return view.render("error.html", status=404, message=view.t("model.err.action", action=action))
    try:
        revision = view.number("revision", 1, MOST_REVISION, label=view.t("model.revision"))
        entry: ModelEntry = await view.ask(catalog.MODEL_GET, ModelRef(name=name))
        return await ACTIONS[action](view, entry, revision)
    except Refused as exc:
        return await _card(view, name, exc.status, exc.message, posted=action)


ROUTES = (models_page, model_page, model_action)
