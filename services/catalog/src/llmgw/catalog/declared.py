"""Models declared in a YAML file given to the catalog at start: parsed strictly, nothing guessed."""

from __future__ import annotations

import msgspec

from llmgw.bus import BadRequest
from llmgw.catalog.core import check_catalog, check_model
from llmgw.proto import Model, StrictError, convert_strict

__all__ = ["load_declared"]


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
        try:
            model = convert_strict(item, Model, where)
        except StrictError as exc:
            raise BadRequest(str(exc)) from None
        if model.name in models:
            raise BadRequest(f"{where}: model '{model.name}' is declared twice; keep one")
        check_model(model)
        models[model.name] = model
    for model in models.values():
        check_catalog(model, {n: m for n, m in models.items() if n != model.name})
    return list(models.values())
