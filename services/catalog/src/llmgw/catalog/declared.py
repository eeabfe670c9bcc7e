"""Models declared in a YAML file given to the catalog at start: parsed strictly, nothing guessed."""

from __future__ import annotations

from typing import Any

import msgspec

from llmgw.bus import BadRequest
from llmgw.catalog.core import check_catalog, check_model
from llmgw.proto import Model, Profile, Scaling, ScheduleWindow

__all__ = ["load_declared"]


def _fields(cls: type) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(cls)}


def _unknown(obj: Any, cls: type, path: str) -> None:
    """Refuse keys `cls` does not have (msgspec would ignore them silently), recursively."""
    if not isinstance(obj, dict):
        return
    extra = sorted(set(obj) - _fields(cls))
    if extra:
        raise BadRequest(f"{path}: unknown field {', '.join(map(repr, extra))}; known: {', '.join(sorted(_fields(cls)))}")
    nested = {"profiles": Profile, "scaling": Scaling, "stopped": Scaling, "schedule": ScheduleWindow}
    for key, value in obj.items():
        if key in nested and isinstance(value, list):
            for i, item in enumerate(value):
                _unknown(item, nested[key], f"{path}.{key}[{i}]")
        elif key in nested:
            _unknown(value, nested[key], f"{path}.{key}")


def load_declared(text: bytes, source: str) -> list[Model]:
    """The models of a YAML file `{models: [...]}`, each checked alone and against the others."""
    try:
        raw = msgspec.yaml.decode(text)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"{source}: not YAML: {exc}") from None
    if not isinstance(raw, dict) or set(raw) != {"models"} or not isinstance(raw["models"], list):
        raise BadRequest(f"{source}: expected a mapping with one key, 'models', holding a list of models")
    models: dict[str, Model] = {}
    for i, item in enumerate(raw["models"]):
        where = f"{source}: models[{i}]"
        _unknown(item, Model, where)
        try:
            model = msgspec.convert(item, Model)
        except msgspec.ValidationError as exc:
            raise BadRequest(f"{where}: {exc}") from None
        if model.name in models:
            raise BadRequest(f"{where}: model '{model.name}' is declared twice; keep one")
        check_model(model)
        models[model.name] = model
    for model in models.values():
        check_catalog(model, {n: m for n, m in models.items() if n != model.name})
    return list(models.values())
