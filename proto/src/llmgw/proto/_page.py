"""Lists in pages: a list too big for one NATS message (1 MB by default: ~12,000 keys) is asked
for a page at a time, each reply naming where the next starts.

A list endpoint takes a `Page` and its reply has `next` ("" on the last page). A service answers
with `page_of`; `llmgw.bus.call` follows the pages for whoever asks for the whole list. Callers
from before pages send `{}`: a `Page` asking for everything, which they get where it fits in one
message, and otherwise an error saying to ask in pages (never a list cut short without a word).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import msgspec
from msgspec import Struct

from llmgw.proto._types import NonNegative
from llmgw.proto.errors import BadRequest

__all__ = ["PAGE_BYTES", "WHOLE_BYTES", "Page", "PageFill", "page_of", "page_start"]

T = TypeVar("T")

PAGE_BYTES = 512 * 1024
"""The most a page's items take as JSON (half of NATS's default `max_payload`, 1 MB)."""
WHOLE_BYTES = 960 * 1024
"""The most a whole list asked for at once (`Page.limit` 0) may take: one message, with room for
the reply's other fields and headers."""


class Page(Struct, kw_only=True):
    """Which part of a list to answer."""

    after: str = ""
    """Where the page starts: the `next` of the page before; "": at the start."""
    limit: NonNegative = 0
    """The most entries in the page (fewer where they would not fit in one message); 0: the
    whole list in one reply, or an error where it does not fit."""


def page_start(ordered: Sequence[Any], ask: Page, key: Callable[[Any], tuple], what: str) -> int:
    """Where in `ordered` (sorted by `key`, no key twice) the page `ask` names starts. A
    BadRequest where `after` is not a cursor this list gives (`what` names the list)."""
    if not ask.after:
        return 0
    try:
        after: Any = msgspec.json.decode(ask.after)
        return bisect.bisect_right(ordered, after, key=lambda item: list(key(item)))
    except (msgspec.DecodeError, TypeError):
        raise BadRequest(
            f"{what}: the page cursor {ask.after!r} is not one this list gives; ask again from the start (no `after`)"
        ) from None


class PageFill(Generic[T]):
    """One page being filled, item by item in list order, up to its limit and its bytes."""

    def __init__(self, ask: Page, key: Callable[[T], tuple], what: str) -> None:
        self.ask, self.key, self.what = ask, key, what
        self.items: list[T] = []
        self.size = 0
        self.budget = PAGE_BYTES if ask.limit else WHOLE_BYTES

    def add(self, item: T) -> bool:
        """Put `item` in the page; False (and not put) where the page is full."""
        if self.ask.limit and len(self.items) >= self.ask.limit:
            return False
        size = self.size + len(msgspec.json.encode(item)) + 1
        if self.items and size > self.budget:
            return False
        self.items.append(item)
        self.size = size
        return True

    def page(self, more: bool) -> tuple[list[T], str]:
        """The page and the cursor of the next ("" where nothing is `more`). A BadRequest where
        the whole list was asked for and it did not fit in one message."""
        if not more:
            return self.items, ""
        if not self.ask.limit:
            raise BadRequest(
                f"{self.what}: more entries than one NATS message holds; ask for them in pages "
                "(`Page.limit`, then each reply's `next`), as llmgw ctl does"
            )
        return self.items, msgspec.json.encode(self.key(self.items[-1])).decode()


def page_of(items: Sequence[T], ask: Page, key: Callable[[T], tuple], what: str) -> tuple[list[T], str]:
    """The page of `items` (sorted by `key`, no key twice) that `ask` names, and the cursor of the
    next page ("" where this is the last). A BadRequest where `after` is not a cursor this list
    gives, or where the whole list is asked for and does not fit in one message (`what` names
    the list in the sentence)."""
    fill = PageFill(ask, key, what)
    for item in items[page_start(items, ask, key, what) :]:
        if not fill.add(item):
            return fill.page(more=True)
    return fill.page(more=False)
