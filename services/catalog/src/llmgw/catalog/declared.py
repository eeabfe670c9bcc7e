"""Models declared in a YAML file given to the catalog at start: parsed strictly, nothing guessed;
without I/O (the shell reads the file)."""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from llmgw.catalog.core import check_catalog, check_model
from llmgw.proto import Model, ModelEntry, StrictError, convert_strict
from llmgw.proto.errors import BadRequest

__all__ = ["declared_changes", "load_declared"]


def load_declared(text: bytes, source: str, allowed: Collection[str] = ()) -> list[Model]:
    """The models of a YAML file `{models: [...]}`, each checked alone (`allowed`: as
    `check_model` takes it) and against the others."""
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
        check_model(model, allowed)
        models[model.name] = model
    for model in models.values():
        check_catalog(model, {n: m for n, m in models.items() if n != model.name})
    return list(models.values())


def declared_changes(
    declared: list[Model], entries: dict[str, ModelEntry], path: str
) -> tuple[list[tuple[Model, int]], list[ModelEntry]]:
    """What writing the file at `path` does to the catalog `entries`: the models to write over
    the revision they have (0: new), and the entries it once declared and declares no more.

    The file is the truth for its models: they are written over what the bucket had. Each is
    checked against the models the API made and the file's others.
    """
    by_name = {m.name: m for m in declared}
    known = {n: e.model for n, e in entries.items() if not e.declared_in} | by_name
    for model in declared:
        check_catalog(model, {n: m for n, m in known.items() if n != model.name})
    writes = [
        (model, entries[model.name].revision if model.name in entries else 0)
        for model in declared
        if model.name not in entries or (entries[model.name].model, entries[model.name].declared_in) != (model, path)
    ]
    gone = [e for n, e in entries.items() if e.declared_in == path and n not in by_name]
    return writes, gone
