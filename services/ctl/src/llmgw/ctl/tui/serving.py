"""A Hub file on the mirror put into service from the terminal console: every way it runs here to
choose from, then the serve form (the catalog's `serve.model`, its rules and refusals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from llmgw.bus import BusError, call
from llmgw.ctl.changes import BY
from llmgw.ctl.tui.dialogs import Field, Form, Menu
from llmgw.ctl.tui.forms import number_or_zero, way_note
from llmgw.proto import catalog
from llmgw.proto.catalog import ServeModel, ServePlanAsk

if TYPE_CHECKING:
    from llmgw.ctl.tui.app import ConsoleApp

__all__ = ["serve_chosen"]


async def serve_chosen(app: ConsoleApp, source: str) -> None:
    """A Hub file on the mirror served: every way it runs here (best first) to choose from,
    then the serve form: the way's speed said again as the cores change; a very slow CPU way
    needs 'anyway'."""
    w, name = app.w, source.rsplit("/", 1)[-1]
    plan = await app.ask(catalog.SERVE_PLAN, ServePlanAsk(source=source))
    if plan is None or not plan.ways:
        if plan is not None:
            app.say("; ".join(plan.warnings), refused=True)
        return
    ways = [(str(i), way_note(way, w).split("\n")[0]) for i, way in enumerate(plan.ways)]
    chosen = await app.push_screen_wait(Menu(w.t("serve.title", file=name), ways))
    if chosen is None:
        return
    kind = (plan.ways[int(chosen)].kind, plan.ways[int(chosen)].cards)
    fields = [
        Field("name", w.t("serve.name")),
        Field("cores", w.t("serve.cores"), "0"),
        Field("anyway", w.t("serve.anyway"), "", True),
    ]
    while True:
        cores = number_or_zero(fields[1].value)  # what the plan shown is for
        plan = await app.ask(catalog.SERVE_PLAN, ServePlanAsk(source=source, cores=cores))
        way = next((x for x in plan.ways if (x.kind, x.cards) == kind), None) if plan is not None else None
        if way is None:  # the fleet changed meanwhile: said, nothing served
            app.say("; ".join(plan.warnings) if plan is not None else "", refused=True)
            return
        values = await app.push_screen_wait(Form(w.t("serve.title", file=name), fields, w, way_note(way, w)))
        if values is None:
            return
        fields = [Field(f.id, f.label, values.get(f.id, f.value), f.check) for f in fields]
        if number_or_zero(values["cores"]) != cores:
            continue  # cores changed: the plan again, the way's speed with them
        serve = ServeModel(
            source=source,
            name=values["name"],
            cpu=way.kind == "cpu",
            gpus=way.cards,
            cores=number_or_zero(values["cores"]),
            cpu_anyway=values["anyway"] == "1",
            by=BY,
        )
        try:
            served = await call(app.nc, catalog.SERVE, msgspec.convert(msgspec.to_builtins(serve), ServeModel))
        except (BusError, msgspec.ValidationError) as exc:
            app.say(getattr(exc, "message", str(exc)), refused=True)
            continue
        app.say(w.t("done.serve", model=served.model.name))
        return
