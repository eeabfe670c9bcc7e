"""Redact and restore, without I/O: what a check found is replaced by a stable placeholder the
model sees (`<EMAIL_1>`, the same value the same placeholder throughout a request), and the
client's answer has the values put back, also in a stream, where a placeholder may come split
across chunks (`StreamRestorer` holds back a tail that may still become one)."""

from __future__ import annotations

import re

from llmgw.router.guard.find import Found

__all__ = ["PLACEHOLDER_MOST", "Redaction", "StreamRestorer"]

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
