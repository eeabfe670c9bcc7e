"""What a text holds, without I/O: personal data and secrets of known shapes, and a tenant's own
patterns. Candidates are found by RE2 expressions (linear time, so no text and no pattern can make
a request hang) and kept only where a well-kept library says they are what they look like: phone
numbers by libphonenumber, card numbers by their Luhn digit and IBANs by their check digits
(python-stdnum), IP addresses by `ipaddress`."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Iterable
from typing import NamedTuple

import phonenumbers
import re2
from stdnum import iban, luhn

from llmgw.proto.guard import Entity

__all__ = ["Found", "PatternError", "compile_pattern", "find", "find_pattern"]


class Found(NamedTuple):
    """One thing found: where it is, and its category (EMAIL, PHONE... or a pattern's label)."""

    start: int
    end: int
    category: str


class PatternError(ValueError):
    """A tenant's pattern RE2 does not take, said as RE2 says it."""


def _valid_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _alone(text: str, start: int, end: int) -> bool:
    """Whether an address found at start:end is not part of a longer dotted run (a version
    such as 1.2.3.4.5)."""
    before, after = text[max(0, start - 2) : start], text[end : end + 2]
    return not (before[-1:] == "." and before[:1].isdigit()) and not (after[:1] == "." and after[1:].isdigit())


def _valid_card(text: str) -> bool:
    digits = "".join(c for c in text if c.isdigit())
    return 13 <= len(digits) <= 19 and luhn.is_valid(digits)


_SHAPES: dict[Entity, tuple[str, Callable[[str], bool] | None]] = {
    "email": (r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}", None),
    "card": (r"\b(?:\d[ -]?){12,18}\d\b", _valid_card),
    "iban": (r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b", iban.is_valid),
    "ip": (r"\b(?:\d{1,3}\.){3}\d{1,3}\b|\b(?:[0-9A-Fa-f]{1,4}:){2,7}[0-9A-Fa-f]{1,4}\b", _valid_ip),
    "secret": (
        r"\b(?:sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{36,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}"
        r"|AIza[0-9A-Za-z_-]{35}|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"
        r"|-----BEGIN [A-Z ]*PRIVATE KEY-----)",
        None,
    ),
}


@functools.lru_cache(maxsize=64)
def _scanner(entities: tuple[Entity, ...]):
    """One RE2 alternation of the shapes of `entities` (phone numbers aside): one scan a text."""
    shapes = [f"(?P<{e}>{_SHAPES[e][0]})" for e in entities if e != "phone"]
    return re2.compile("|".join(shapes)) if shapes else None


def find(text: str, entities: Iterable[Entity], region: str = "US") -> list[Found]:
    """The personal data and secrets of `entities` in `text`, in order, none overlapping (the
    first found wins). Phone numbers are read as libphonenumber reads them (`region`: where a
    number without its country code is taken to be)."""
    found: list[Found] = []
    wanted = tuple(dict.fromkeys(entities))
    scanner = _scanner(wanted)
    for m in scanner.finditer(text) if scanner is not None else ():
        entity = m.lastgroup
        check = _SHAPES[entity][1]
        if (check is None or check(m.group(0))) and (entity != "ip" or _alone(text, m.start(), m.end())):
            found.append(Found(m.start(), m.end(), entity.upper()))
    if "phone" in wanted:
        rest = _blanked(text, found)  # a phone number loses to what overlaps it: those are not read again
        if len(rest) > 4096 or sum(c.isdigit() for c in rest) >= 4:  # none has fewer digits
            found += [Found(m.start, m.end, "PHONE") for m in phonenumbers.PhoneNumberMatcher(rest, region)]
    return _apart(found)


def _blanked(text: str, found: list[Found]) -> str:
    """`text` with each of `found` (in order) written over by spaces, in one pass."""
    if not found:
        return text
    parts, at = [], 0
    for f in found:
        start = max(f.start, at)
        parts += [text[at:start], " " * max(f.end - start, 0)]
        at = max(at, f.end)
    return "".join([*parts, text[at:]])


_RANK = {"SECRET": 0, "EMAIL": 1, "IBAN": 2, "CARD": 3, "IP": 4, "PHONE": 5}
"""Which wins where two findings overlap: the surest first (a phone number's reading is the loosest:
an IP address or a card number can read as one)."""


def _surer(a: Found, b: Found) -> bool:
    """Whether `a` is kept over `b` where they overlap: the surer kind, then the longer."""
    return (_RANK.get(a.category, 6), a.start - a.end) < (_RANK.get(b.category, 6), b.start - b.end)


def _apart(found: list[Found]) -> list[Found]:
    """None overlapping (the surer kind, then the longer, kept), in order of where they start; in
    one pass over them by where they start (overlaps are between neighbours)."""
    kept: list[Found] = []
    for f in sorted(found, key=lambda f: (f.start, -f.end)):
        beaten = []
        while kept and f.start < kept[-1].end and _surer(f, kept[-1]):
            beaten.append(kept.pop())
        if kept and f.start < kept[-1].end:  # it overlaps one it does not beat: all stay as they were
            kept.extend(reversed(beaten))
            continue
        kept.append(f)
    return kept


def compile_pattern(pattern: str):
    """A tenant's pattern as RE2 takes it; PatternError saying why not."""
    try:
        return re2.compile(pattern)
    except re2.error as exc:
        raise PatternError(f"the pattern {pattern[:80]!r} is not one RE2 takes: {exc}") from None


def find_pattern(text: str, compiled, label: str) -> list[Found]:
    """Where a tenant's compiled pattern matches in `text` (empty matches left out)."""
    return [Found(m.start(), m.end(), label) for m in compiled.finditer(text) if m.end() > m.start()]
