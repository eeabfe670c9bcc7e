"""Lists in pages (`llmgw.proto.page_of`): the pages of a list, followed by their cursors, hold
every entry once, each page fits in one NATS message, and a list changed between pages neither
repeats nor skips what stayed in it."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.proto import PAGE_BYTES, WHOLE_BYTES, KeyList, KeyRecord, Page, page_of
from llmgw.proto.errors import BadRequest


def _key(item: tuple[str, int]) -> tuple:
    return (item[0],)


def _all_pages(items: list, limit: int, changes=None) -> list:
    """Every page in turn, following `next`; `changes(i)` may change `items` before page i."""
    got, after = [], ""
    for i in range(10_000):
        if changes:
            changes(i)
        page, after = page_of(items, Page(after=after, limit=limit), _key, "the list")
        got += page
        if not after:
            return got
    raise AssertionError("the pages never ended")


@given(n=st.integers(0, 300), limit=st.integers(1, 50))
def test_the_pages_of_a_list_hold_every_entry_once_in_order(n, limit):
    items = [(f"k{i:05d}", i) for i in range(n)]
    assert _all_pages(items, limit) == items


@given(
    n=st.integers(0, 120),
    limit=st.integers(1, 20),
    changes=st.lists(st.tuples(st.booleans(), st.integers(0, 999)), max_size=40),
)
def test_a_list_changed_between_pages_neither_repeats_nor_skips_what_stayed(n, limit, changes):
    items = [(f"k{i * 10:05d}", i) for i in range(n)]
    stayed = set(items)

    def change(i: int) -> None:
        if i < len(changes):
            add, at = changes[i]
            if add:  # a new entry anywhere (it may or may not be listed)
                new = (f"k{at * 10 + 5:05d}", -1)
                if new not in items:
                    items.append(new)
                    items.sort()
            elif items:  # one removed (it may or may not have been listed)
                gone = items.pop(at % len(items))
                stayed.discard(gone)

    got = _all_pages(items, limit, change)
    assert len(got) == len(set(got)), "an entry came twice"
    assert stayed <= set(got), "an entry there throughout was skipped"
    assert got == sorted(got)


def test_a_page_fits_in_one_message_whatever_its_limit():
    keys = {f"{i:016x}": KeyRecord(name=f"key {i}", created=float(i), models=["m"] * 20) for i in range(12_000)}
    items = sorted(keys.items())
    page, after = page_of(items, Page(limit=100_000), lambda kv: (kv[0],), "the key list")
    assert after and 0 < len(page) < len(items)
    assert len(msgspec.json.encode(KeyList(keys=dict(page), next=after))) <= PAGE_BYTES + 1024


def test_the_whole_list_asked_for_at_once_is_answered_where_it_fits_and_refused_where_not():
    small = [(f"k{i}", i) for i in range(100)]
    assert page_of(small, Page(), _key, "the list") == (small, "")  # as callers from before pages ask
    big = [(f"k{i:06d}", "x" * 200) for i in range(WHOLE_BYTES // 200)]
    with pytest.raises(BadRequest, match="the list: more entries than one NATS message holds; ask for them in pages"):
        page_of(big, Page(), _key, "the list")


def test_a_cursor_this_list_never_gave_is_refused_saying_to_start_again():
    items = [(f"k{i}", i) for i in range(10)]
    for bad in ("not json", '{"a": 1}', "[1, 2]"):
        with pytest.raises(BadRequest, match="is not one this list gives; ask again from the start"):
            page_of(items, Page(after=bad, limit=5), _key, "the list")


def test_an_entry_bigger_than_a_page_comes_alone():
    items = [("a", "x" * (PAGE_BYTES + 10)), ("b", "y")]
    assert page_of(items, Page(limit=10), _key, "the list") == ([items[0]], '["a"]')
    assert page_of(items, Page(after='["a"]', limit=10), _key, "the list") == ([items[1]], "")
