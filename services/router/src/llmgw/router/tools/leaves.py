"""The strings inside a JSON value (a tool's arguments, its structured result): each string value
as the container and the key that holds it, and each object's keys, so a guardrail's checks can
read every one and replace it in place. Without I/O (the check itself is given)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = ["KeyClash", "Place", "TooDeep", "check_in_place", "leaves"]

Place = tuple[dict | list, str | int]
"""A container and where in it a string sits."""

_DEEPEST = 64


class TooDeep(ValueError):
    """A value nested deeper than its strings are looked for."""


def leaves(value: object) -> list[Place]:
    """Every string value in `value` (dicts and lists), as (container, key); TooDeep past 64 levels."""
    places: list[Place] = []
    _walk(value, 0, places, [])
    return places


def _walk(value: object, depth: int, places: list[Place], keys: list[tuple[dict, str]]) -> None:
    """The string values of `value` into `places`, its objects' keys into `keys` (a tool can put
    anything in a key: an address, a codename); TooDeep past 64 levels."""
    if depth > _DEEPEST:
        raise TooDeep(f"a value nested deeper than {_DEEPEST} levels")
    if isinstance(value, dict):
        keys += [(value, key) for key in value if isinstance(key, str)]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(item, str):
            places.append((value, key))  # type: ignore[arg-type]
        else:
            _walk(item, depth + 1, places, keys)


class KeyClash(ValueError):
    """A key's checked text is another key of the same object (its value would be lost)."""


async def check_in_place(
    value: dict, check: Callable[[list[str]], Awaitable[list[str]]], before: Callable[[str], str] | None = None
) -> None:
    """Every string of `value`, values and keys alike, passed through `check` (each first through
    `before`, where given) and replaced in place by what it returns: a key renamed where its
    text changed, the object's order kept. TooDeep past 64 levels; KeyClash where a renamed key
    would land on another key of its object."""
    places: list[Place] = []
    keys: list[tuple[dict, str]] = []
    _walk(value, 0, places, keys)
    texts = [h[k] for h, k in places] + [k for _, k in keys]  # type: ignore[index]
    checked = await check([before(t) for t in texts] if before else texts)
    for (holder, k), text in zip(places, checked[: len(places)], strict=True):
        holder[k] = text  # type: ignore[index]
    renamed: dict[int, tuple[dict, dict[str, str]]] = {}
    for (holder, k), text in zip(keys, checked[len(places) :], strict=True):
        if text != k:
            renamed.setdefault(id(holder), (holder, {}))[1][k] = text
    for holder, changes in renamed.values():
        _rename(holder, changes)


def _rename(holder: dict, changes: dict[str, str]) -> None:
    """`holder`'s keys renamed as `changes` says (old -> new), in place, its order kept."""
    items = [(changes.get(k, k), v) for k, v in holder.items()]
    if len({k for k, _ in items}) < len(items):
        raise KeyClash("a key, once checked, is the same as another key of its object")
    holder.clear()
    holder.update(items)
