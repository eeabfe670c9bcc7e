"""JSON from outside, read with its nesting bounded: one place for every service and the router.

msgspec decodes recursively, into `Any` and into `Raw` alike, and a document nested a few
thousand deep raises RecursionError from inside it; one nested a few hundred deep decodes, and
then breaks whatever walks or encodes it next. `decode_json` turns both into a DecodeError that
says how deep is allowed, so every handler that answers a DecodeError with a 400 already does.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

import msgspec

__all__ = ["JSON_MAX_DEPTH", "JsonTooDeep", "check_depth", "decode_json"]

JSON_MAX_DEPTH = 64
"""Most arrays and objects one inside another that any message or request body may hold."""

_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")
"""An opening bracket a step in (+1), a closing one a step out (-1, as a signed byte)."""


class JsonTooDeep(msgspec.DecodeError):
    """A JSON document nested deeper than its reader allows (a DecodeError: a 400 wherever those are)."""


def _too_deep(most: int) -> JsonTooDeep:
    return JsonTooDeep(f"JSON nested deeper than {most} levels (arrays and objects one inside another); flatten it")


def check_depth(data: bytes, most: int = JSON_MAX_DEPTH) -> None:
    """Raise JsonTooDeep if the JSON document `data` nests arrays and objects deeper than `most`.

    Cheap for what is sent every day (fewer brackets than `most`: counted, nothing more); else
    strings are set aside (brackets in them do not count) and the depth is walked.
    """
    data = bytes(data)
    if data.count(b"[") + data.count(b"{") <= most:
        return
    brackets = _STRINGS.sub(b'""', data).translate(None, _NOT_BRACKETS).translate(_STEPS)
    if brackets and max(accumulate(memoryview(brackets).cast("b"))) > most:
        raise _too_deep(most)


def decode_json(data: bytes, type: Any = Any, *, strict: bool = True, most: int = JSON_MAX_DEPTH) -> Any:
    """`msgspec.json.decode(data, type=type)` with nesting bounded at `most` (a JsonTooDeep past it)."""
    try:
        value = msgspec.json.decode(data, type=type, strict=strict)
    except RecursionError:
        raise _too_deep(most) from None
    check_depth(data, most)
    return value
