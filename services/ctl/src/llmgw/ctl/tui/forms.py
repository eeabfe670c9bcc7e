"""The console's forms as changes, without I/O: a model's replicas, resources and context forms
(their fields, and the change their values ask for, checked first), and the serve form's note."""

from __future__ import annotations

import msgspec

from llmgw.ctl.tui.dialogs import Field, whole
from llmgw.ctl.tui.words import Words
from llmgw.modelplan import speed_note
from llmgw.proto import ModelEntry
from llmgw.proto.catalog import ServePlan, SetContext, SetReplicas, SetResources

__all__ = ["change_of", "fields_of", "number_or_zero", "way_note"]

_MOST = {"replicas": 64, "cores": 1024, "memory_gib": 4096, "tokens": 1 << 20}


def number_or_zero(raw: str) -> int:
    """A field's whole number, 0 where it is none."""
    return int(raw) if raw.isascii() and raw.isdigit() else 0


def way_note(plan: ServePlan, w: Words) -> str:
    """The plan's best way as the serve form says it: where, memory, speed, and whether the CPU
    needs 'anyway'."""
    if not plan.ways:
        return "; ".join(plan.warnings)
    way = plan.ways[0]
    where = w.t("on.cards", n=way.cards) if way.cards else w.t("on.cpu", speed=f"{way.threads} threads")
    note = w.t("serve.way", way=where, memory=f"{way.memory_mb / 1024:.1f} GiB", speed=speed_note(way.tokens_per_s))
    return note + ("\n" + w.t("serve.slow") if way.mark == "very slow" and way.kind == "cpu" else "")


def fields_of(kind: str, entry: ModelEntry, w: Words) -> list[Field]:
    """The fields of a model's `kind` form (replicas, resources, context) with its values now."""
    m = entry.model
    if kind == "replicas":
        return [
            Field(
                p.name,
                w.t("form.replicas", profile=p.name, where=w.t("on.cards", n=p.gpus) if p.gpus else "CPU"),
                str(p.replicas or 0),
            )
            for p in m.profiles
        ]
    if kind == "resources":
        return [
            Field("profile", w.t("form.profile"), m.profiles[0].name),
            Field("memory", w.t("form.memory")),
            Field("cores", w.t("form.cores")),
        ]
    return [
        Field("context", w.t("form.context"), str(m.context)),
        Field("max_output", w.t("form.max_output"), str(m.max_output or "")),
    ]


def change_of(kind: str, values: dict[str, str], entry: ModelEntry, spec: dict, w: Words) -> msgspec.Struct | None:
    """The change a form asks for (None: nothing changed); ValueError saying which field is wrong."""
    m, most = entry.model, _MOST

    def number(field: str, low: int, high: int, label: str) -> int | None:
        return whole(values[field], low, high, label, w) if values.get(field) else None

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
