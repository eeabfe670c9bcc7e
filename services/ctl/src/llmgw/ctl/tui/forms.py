"""The console's forms as changes, without I/O: a model's forms (replicas per profile, resources,
context, scaling, cards, owner: their fields with the values now, and the change their values
ask for, checked first), and the serve form's note."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from llmgw.ctl.tui.dialogs import Field, whole
from llmgw.ctl.tui.words import Words
from llmgw.modelplan import speed_note
from llmgw.proto import ModelEntry, Scaling
from llmgw.proto.bounds import MOST_CARDS, MOST_CONTEXT, MOST_CORES, MOST_CPU_MB, MOST_IDLE_S, MOST_OWNER, MOST_REPLICAS
from llmgw.proto.catalog import (
    ScaleModel,
    ServeWay,
    SetContext,
    SetGpus,
    SetOwner,
    SetReplicas,
    SetResources,
)

__all__ = ["FORMS", "change_of", "fields_of", "number_or_zero", "way_note"]

FORMS = ("replicas", "resources", "context", "scaling", "gpus", "owner")
"""The model's changes asked with a form."""
_MOST = {
    "replicas": MOST_REPLICAS,
    "cores": MOST_CORES,
    "memory_gib": MOST_CPU_MB // 1024,
    "tokens": MOST_CONTEXT,
    "cards": MOST_CARDS,
    "idle_s": MOST_IDLE_S,
}
"""The bounds every face checks, by the fields that take them."""

Number = Callable[[str, int, int, str], "int | None"]


def number_or_zero(raw: str) -> int:
    """A field's whole number, 0 where it is none."""
    return int(raw) if raw.isascii() and raw.isdigit() else 0


def way_note(way: ServeWay, w: Words) -> str:
    """A way of the serve plan as the serve form says it: where, memory, speed, and whether the
    CPU needs 'anyway'."""
    where = w.t("on.cards", n=way.cards) if way.cards else w.t("on.cpu", speed=f"{way.threads} threads")
    note = w.t("serve.way", way=where, memory=f"{way.memory_mb / 1024:.1f} GiB", speed=speed_note(way.tokens_per_s))
    return note + ("\n" + w.t("serve.slow") if way.mark == "very slow" and way.kind == "cpu" else "")


def fields_of(kind: str, entry: ModelEntry, w: Words, cpu_speed: str = "") -> list[Field]:
    """The fields of a model's `kind` form with its values now (`cpu_speed`: what a replica on
    the CPU answers at, said beside a CPU profile's count)."""
    m = entry.model
    if kind == "replicas":
        where = {
            p.name: w.t("on.cards", n=p.gpus) if p.gpus else w.t("on.cpu", speed=cpu_speed or "?") for p in m.profiles
        }
        return [
            Field(p.name, w.t("form.replicas", profile=p.name, where=where[p.name]), str(p.replicas or 0))
            for p in m.profiles
        ]
    if kind == "resources":
        return [
            Field("profile", w.t("form.profile"), m.profiles[0].name),
            Field("memory", w.t("form.memory")),
            Field("cores", w.t("form.cores")),
        ]
    if kind == "scaling":
        s = m.scaling
        return [
            Field("min", w.t("form.min"), str(s.min)),
            Field("max", w.t("form.max"), str(s.max)),
            Field("idle", w.t("form.idle"), str(s.idle_timeout_s or 0)),
        ]
    if kind == "gpus":
        return [Field(p.name, w.t("form.gpus", profile=p.name), str(p.gpus)) for p in m.profiles if p.gpus]
    if kind == "owner":
        return [Field("owner", w.t("form.owner"), m.owner)]
    return [
        Field("context", w.t("form.context"), str(m.context)),
        Field("max_output", w.t("form.max_output"), str(m.max_output or "")),
    ]


def change_of(kind: str, values: dict[str, str], entry: ModelEntry, spec: dict, w: Words) -> msgspec.Struct | None:
    """The change a form asks for (None: nothing changed); ValueError saying which field is wrong."""

    def number(field: str, low: int, high: int, label: str) -> int | None:
        return whole(values[field], low, high, label, w) if values.get(field) else None

    if kind in ("scaling", "gpus", "owner"):
        return _more(kind, values, entry, spec, number)
    m, most = entry.model, _MOST
    if kind == "replicas":
        counts = {p.name: number(p.name, 0, most["replicas"], p.name) or 0 for p in m.profiles}
        return SetReplicas(**spec, counts=counts)
    if kind == "resources":
        memory = number("memory", 1, most["memory_gib"], w.t("form.memory"))
        cores = number("cores", 1, most["cores"], w.t("form.cores"))
        if memory is None and cores is None:
            return None
        return SetResources(**spec, profile=values["profile"], memory_mb=memory and memory * 1024, cores=cores)
    context = number("context", 1, most["tokens"], w.t("form.context"))
    longest = number("max_output", 1, most["tokens"], w.t("form.max_output"))
    if context == m.context and longest == m.max_output:
        return None
    return SetContext(**spec, context=context if context != m.context else None, max_output=longest)


def _more(kind: str, values: dict[str, str], entry: ModelEntry, spec: dict, number: Number) -> msgspec.Struct | None:
    """The scaling, cards and owner forms' changes (as `change_of`)."""
    m, most = entry.model, _MOST
    if kind == "scaling":
        least, top = number("min", 0, most["replicas"], "min") or 0, number("max", 0, most["replicas"], "max") or 0
        idle = number("idle", 0, most["idle_s"], "idle") or None
        scaling = Scaling(min=least, max=top, idle_timeout_s=idle, schedule=m.scaling.schedule)
        return None if scaling == m.scaling else ScaleModel(**spec, scaling=scaling)
    if kind == "gpus":
        asked = {p.name: number(p.name, 1, most["cards"], p.name) or p.gpus for p in m.profiles if p.gpus}
        changed = {name: n for name, n in asked.items() if n != next(p.gpus for p in m.profiles if p.name == name)}
        return SetGpus(**spec, gpus=changed) if changed else None
    owner = values.get("owner", "")
    if len(owner) > MOST_OWNER:
        raise ValueError(f"an owner's name is at most {MOST_OWNER} characters; this one has {len(owner)}")
    return None if owner == m.owner else SetOwner(**spec, owner=owner)
