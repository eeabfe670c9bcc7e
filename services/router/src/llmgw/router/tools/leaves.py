"""The strings inside a JSON value (a tool's arguments, its structured result), each as the
container and the key that holds it, so a guardrail's checks can read and replace them in place.
Without I/O."""

from __future__ import annotations

__all__ = ["Place", "TooDeep", "leaves"]

Place = tuple[dict | list, str | int]
"""A container and where in it a string sits."""

_DEEPEST = 64


class TooDeep(ValueError):
    """A value nested deeper than its strings are looked for."""


def leaves(value: object, depth: int = 0) -> list[Place]:
    """Every string in `value` (dicts and lists), as (container, key); TooDeep past 64 levels."""
    if depth > _DEEPEST:
        raise TooDeep(f"a value nested deeper than {_DEEPEST} levels")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    out: list[Place] = []
    for key, item in items:
        if isinstance(item, str):
            out.append((value, key))  # type: ignore[arg-type]
        else:
            out += leaves(item, depth + 1)
    return out
