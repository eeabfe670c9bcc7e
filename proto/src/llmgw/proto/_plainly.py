"""A message that does not validate, said as one sentence naming the field and what it must be,
without I/O: msgspec's "Expected `int` >= 0 - at `$.scaling.min`" becomes "scaling.min must be 0
or more". Every face (ctl, the services' replies, the admin API) says it this way."""

from __future__ import annotations

import re
from typing import get_args

import msgspec

from llmgw.proto._types import Name, NameOrEmpty, RepoId, Source

__all__ = ["plainly"]

_DESCRIBED = {
    m.pattern: m.description
    for t in (Name, NameOrEmpty, Source, RepoId)
    for m in get_args(t)[1:]
    if isinstance(m, msgspec.Meta) and m.pattern
}
"""What each shared pattern means, in words (its type's `description`)."""
_AT = r"(?: - at `\$(?P<at>[^`]*)`)?$"
_BOUND = re.compile(r"^Expected `(?P<type>int|float)` (?P<op>>=|<=|>|<) (?P<n>[-0-9.e+]+)" + _AT)
_PATTERN = re.compile(r"^Expected `str` matching regex '(?P<rx>.*)'" + _AT)
_LENGTH = re.compile(r"^Expected `(?P<type>str|array|object)` of length (?P<op>>=|<=) (?P<n>\d+)" + _AT)
_TYPE = re.compile(r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`" + _AT)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`" + _AT)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>[^`]+)`" + _AT)
_ENUM = re.compile(r"^Invalid (?:enum )?value (?P<value>.+?)" + _AT)
_WORDS = {">=": "{n} or more", "<=": "{n} or less", ">": "more than {n}", "<": "less than {n}"}
_KINDS = {
    "int": "a whole number",
    "float": "a number",
    "str": "text",
    "bool": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "nothing",
}


def _field(at: str | None, whole: str) -> str:
    """`$.scaling.min` as `scaling.min`; the message itself where it names none."""
    path = (at or "").lstrip(".")
    return path or whole


def plainly(error: Exception | str, whole: str = "the message") -> str:
    """`error` as one sentence (`whole`: what to call the message when no field is named)."""
    text = str(error)
    if m := _BOUND.match(text):
        return f"{_field(m['at'], whole)} must be {_WORDS[m['op']].format(n=m['n'])}"
    if m := _PATTERN.match(text):
        said = _DESCRIBED.get(m["rx"], f"text matching {m['rx']}")
        return f"{_field(m['at'], whole)} must be {said}"
    if m := _LENGTH.match(text):
        most = "at most" if m["op"] == "<=" else "at least"
        unit = "characters" if m["type"] == "str" else "items"
        return f"{_field(m['at'], whole)} must have {most} {m['n']} {unit}"
    if m := _TYPE.match(text):
        want = " or ".join(_KINDS.get(w.strip(), w.strip()) for w in m["want"].split("|"))
        return f"{_field(m['at'], whole)} must be {want}, not {_KINDS.get(m['got'], m['got'])}"
    if m := _MISSING.match(text):
        inside = _field(m["at"], "")
        return f"{inside + '.' if inside else ''}{m['field']} is missing: give it"
    if m := _UNKNOWN.match(text):
        inside = _field(m["at"], "")
        return f"{inside + '.' if inside else ''}{m['field']} is not a field of {whole}: check its spelling"
    if m := _ENUM.match(text):
        return f"{_field(m['at'], whole)} cannot be {m['value']}"
    return text
