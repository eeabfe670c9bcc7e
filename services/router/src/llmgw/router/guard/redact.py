"""Redact and restore, without I/O: what a check found is replaced by a stable placeholder the
model sees (`<EMAIL_1>`, the same value the same placeholder throughout a request), and the
client's answer has the values put back, also in a stream, where a placeholder may come split
across chunks (`StreamRestorer` holds back a tail that may still become one)."""

from __future__ import annotations

import re
from collections.abc import Callable

from llmgw.router.guard.find import Found

__all__ = [
    "CHECK_HOLD",
    "CHECK_HOLD_MOST",
    "PLACEHOLDER_MOST",
    "CheckWindow",
    "Redaction",
    "Spans",
    "StreamRestorer",
]

_PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*_\d+>")
_PREFIX = re.compile(r"<[A-Z0-9_]*\Z")
PLACEHOLDER_MOST = 48
"""The longest a placeholder is (a label has at most 31 characters, then `_` and a count)."""


class Redaction:
    """One request's placeholders and the values they stand for."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        """Placeholder -> the value it stands for."""
        self._by_value: dict[tuple[str, str], str] = {}
        self._counts: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.values)

    def placeholder(self, category: str, value: str) -> str:
        """The placeholder of `value` (made on first sight: `<CATEGORY_N>`)."""
        known = self._by_value.get((category, value))
        if known is None:
            self._counts[category] = n = self._counts.get(category, 0) + 1
            known = self._by_value[category, value] = f"<{category}_{n}>"
            self.values[known] = value
        return known

    def redact(self, text: str, found: list[Found]) -> str:
        """`text` with each of `found` (in order, none overlapping) replaced by its placeholder."""
        out, at = [], 0
        for f in found:
            out += [text[at : f.start], self.placeholder(f.category, text[f.start : f.end])]
            at = f.end
        return "".join([*out, text[at:]])

    def restore(self, text: str) -> str:
        """`text` with every placeholder of this request put back (others left as they are)."""
        if not self.values or "<" not in text:
            return text
        return _PLACEHOLDER.sub(lambda m: self.values.get(m.group(0), m.group(0)), text)


class StreamRestorer:
    """Puts values back into a text that comes in pieces: each piece's text up to where a
    placeholder may still be coming is given out restored; the rest waits for the next piece."""

    def __init__(self, redaction: Redaction) -> None:
        self.redaction = redaction
        self.held = ""

    def feed(self, piece: str) -> str:
        """What can be given out now of `piece` (and what was held), restored."""
        text = self.held + piece
        cut = text.rfind("<")
        if cut >= 0 and len(text) - cut < PLACEHOLDER_MOST and _PREFIX.match(text, cut):
            text, self.held = text[:cut], text[cut:]
        else:
            self.held = ""
        return self.redaction.restore(text)

    def end(self) -> str:
        """What was held, at the stream's end (a placeholder cut short is given out as it is)."""
        held, self.held = self.held, ""
        return self.redaction.restore(held)


CHECK_HOLD = 64
"""Characters of a streamed answer held back from its output checks while more may come: more
than the longest value with spaces inside that a check looks for (an IBAN written in groups)."""
CHECK_HOLD_MOST = 4096
"""The most held back at all: a text without a space this long is checked as it stands."""


Spans = Callable[[str], list[tuple[int, int]]]
"""Where the checks find something in a text: (start, end) each."""


class CheckWindow:
    """Gives a streamed answer's text to its output checks in pieces that do not cut what they look
    for: a piece ends at a space at least `CHECK_HOLD` characters before the text seen so far ends
    (what may still be coming is within them; a key or a token has no space: it is held whole, up
    to `CHECK_HOLD_MOST`), and before any value `spans` finds across that space. `whole` holds
    everything to the end (a judge or an outside service reads the answer whole)."""

    def __init__(self, spans: Spans, whole: bool = False) -> None:
        self.spans, self.whole = spans, whole
        self.held = ""

    def feed(self, piece: str) -> str:
        """What is ready to be checked now of `piece` (and what was held)."""
        text = self.held + piece
        if self.whole or len(text) <= CHECK_HOLD:
            self.held = text
            return ""
        limit = len(text) - CHECK_HOLD
        cut = max(text.rfind(" ", 0, limit), text.rfind("\n", 0, limit)) + 1
        if cut == 0 and len(text) >= CHECK_HOLD_MOST:
            cut = limit
        spans = self.spans(text) if cut else []
        while cut and (inside := [start for start, end in spans if start < cut < end]):
            cut = min(inside)  # before a value the cut would split (and again, where that lands in another)
        text, self.held = text[:cut], text[cut:]
        return text

    def end(self) -> str:
        """What was held, at the answer's end."""
        held, self.held = self.held, ""
        return held
