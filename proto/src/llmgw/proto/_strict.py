"""Strict reading of operator-written files: msgspec ignores unknown fields, an operator's typo must not vanish."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from msgspec import inspect

__all__ = ["StrictError", "convert_strict"]

T = TypeVar("T")


class StrictError(ValueError):
    """A field the message type does not have, or a value of the wrong type; the text says where."""


def _struct_of(t: inspect.Type) -> tuple[inspect.StructType | None, bool]:
    """The Struct type inside `t` (directly, optional, or as list items), and whether it is a list."""
    if isinstance(t, inspect.StructType):
        return t, False
    if isinstance(t, (inspect.ListType, inspect.SetType, inspect.FrozenSetType)):
        inner, _ = _struct_of(t.item_type)
        return inner, True
    if isinstance(t, inspect.UnionType):
        for member in t.types:
            inner, many = _struct_of(member)
            if inner:
                return inner, many
    return None, False


def _check(obj: Any, info: inspect.StructType, path: str) -> None:
    if not isinstance(obj, dict):
        return
    fields = {f.encode_name: f for f in info.fields}
    extra = sorted(set(obj) - set(fields))
    if extra:
        raise StrictError(f"{path}: unknown field {', '.join(map(repr, extra))}; known: {', '.join(sorted(fields))}")
    for key, value in obj.items():
        inner, many = _struct_of(fields[key].type)
        if inner and many and isinstance(value, list):
            for i, item in enumerate(value):
                _check(item, inner, f"{path}.{key}[{i}]")
        elif inner:
            _check(value, inner, f"{path}.{key}")


def convert_strict(obj: Any, cls: type[T], path: str = "$") -> T:
    """`obj` (decoded JSON/YAML) as `cls`, refusing unknown fields anywhere inside it."""
    _check(obj, inspect.type_info(cls), path)
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError as exc:
        raise StrictError(f"{path}: {exc}") from None
