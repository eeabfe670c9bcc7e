"""A model's LoRA adapters from the terminal console's menu: attach one the mirror holds (its
name from its file unless given, its scale), or detach one, asked first."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from llmgw.ctl.tui.dialogs import Confirm, Field, Form, Menu
from llmgw.proto import Adapter, ModelEntry, SetAdapters
from llmgw.proto.catalog import adapter_name

if TYPE_CHECKING:
    from llmgw.ctl.tui.app import ConsoleApp

__all__ = ["adapters_menu"]

_DETACH = "detach:"


async def adapters_menu(app: ConsoleApp, entry: ModelEntry, spec: dict) -> None:
    """The adapters' own menu: attach, or detach one of those attached."""
    w, m = app.w, entry.model
    items = [("attach", w.t("adapters.attach"))]
    items += [(_DETACH + a.name, w.t("adapters.detach", name=f"{m.name}:{a.name}", scale=a.scale)) for a in m.adapters]
    chosen = await app.push_screen_wait(Menu(w.t("menu.adapters"), items))
    if chosen is None:
        return
    if chosen.startswith(_DETACH):
        name = chosen.removeprefix(_DETACH)
        if await app.push_screen_wait(Confirm(w.t("confirm.detach", model=m.name, name=name), w)):
            await app.change(SetAdapters(**spec, remove=[name]))
        return
    fields = [
        Field("source", w.t("adapters.source")),
        Field("name", w.t("adapters.name")),
        Field("scale", w.t("adapters.scale"), "1"),
    ]
    values = await app.push_screen_wait(Form(w.t("adapters.attach"), fields, w))
    if values is None or not values["source"]:
        return
    try:
        scale = float(values["scale"] or "1")
        named = {"name": values["name"] or adapter_name(values["source"]), "source": values["source"], "scale": scale}
        adapter = msgspec.convert(named, Adapter)
    except (ValueError, msgspec.ValidationError) as exc:
        app.say(f"{w.t('adapters.attach')}: {exc}", refused=True)
        return
    await app.change(SetAdapters(**spec, add=[adapter]))
