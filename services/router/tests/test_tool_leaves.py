"""The strings of a tool's JSON value checked in place: values and keys alike, order kept."""

from __future__ import annotations

import re

import pytest

from llmgw.router.guard.redact import Redaction
from llmgw.router.tools.leaves import KeyClash, TooDeep, check_in_place

EMAIL = re.compile(r"[\w.]+@[\w.]+")


def _redacting(redaction: Redaction):
    async def check(texts: list[str]) -> list[str]:
        return [EMAIL.sub(lambda m: redaction.placeholder("EMAIL", m.group()), t) for t in texts]

    return check


async def test_keys_are_checked_and_renamed_in_place_with_their_order_kept():
    inner = {"cc ada@example.com": ["bob@example.com", 3], "plain": "x"}
    value = {"first": 1, "ada@example.com": {"to": "ada@example.com"}, "inner": inner, "last": 2}
    await check_in_place(value, _redacting(Redaction()))
    assert list(value) == ["first", "<EMAIL_1>", "inner", "last"]  # the same address, the same placeholder
    assert value["<EMAIL_1>"] == {"to": "<EMAIL_1>"}
    assert value["inner"] is inner  # changed in place: what holds it still does
    assert inner == {"cc <EMAIL_1>": ["<EMAIL_2>", 3], "plain": "x"}


async def test_before_puts_back_what_an_earlier_check_redacted_first():
    earlier = Redaction()
    placeholder = earlier.placeholder("EMAIL", "ada@example.com")
    value = {placeholder: placeholder}
    seen: list[str] = []

    async def check(texts: list[str]) -> list[str]:
        seen.extend(texts)
        return texts

    await check_in_place(value, check, earlier.restore)
    assert seen == ["ada@example.com", "ada@example.com"]
    assert value == {"ada@example.com": "ada@example.com"}


async def test_a_key_that_would_land_on_another_is_refused_and_nothing_is_lost():
    value = {"<EMAIL_1>": 1, "ada@example.com": 2}
    with pytest.raises(KeyClash):
        await check_in_place(value, _redacting(Redaction()))
    assert value == {"<EMAIL_1>": 1, "ada@example.com": 2}


async def test_a_value_nested_too_deep_is_refused_before_anything_is_checked():
    deep: dict = {"leaf": "ada@example.com"}
    for _ in range(70):
        deep = {"k": deep}
    asked: list[list[str]] = []

    async def check(texts: list[str]) -> list[str]:
        asked.append(texts)
        return texts

    with pytest.raises(TooDeep):
        await check_in_place(deep, check)
    assert asked == []


async def test_a_check_that_answers_fewer_texts_than_it_was_asked_fails_loudly():
    async def short(texts: list[str]) -> list[str]:
        return texts[:-1]

    with pytest.raises(ValueError):
        await check_in_place({"a": "b"}, short)
