"""A chat completion answered from a knowledge base, without I/O: which base and how many chunks
it asks for (its `knowledge` field), the question searched for (its last user message), the
chunks put in its prompt as numbered sources, and the sources said back beside the answer."""

from __future__ import annotations

import json
from typing import NamedTuple

import msgspec

from llmgw.proto.knowledge import Hit
from llmgw.router.errors import InvalidBody
from llmgw.router.knowledge.recall import text_of

__all__ = [
    "SOURCES_HEADER",
    "Asked",
    "asked_of",
    "body_with_sources",
    "question_of",
    "sources_header",
    "sources_of",
    "with_sources",
]

SOURCES_HEADER = "llmgw-sources"
"""The response header that lists the sources an answer was given (JSON), streamed or not."""
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


class Asked(NamedTuple):
    """What a request's `knowledge` field asks: a base, and at most how many chunks (0: the
    base's own number)."""

    base: str
    top: int


def asked_of(value: object) -> Asked:
    """The `knowledge` field read: a base's name, or `{"base": NAME, "top": N}`; InvalidBody
    saying what is wrong else."""
    if isinstance(value, dict):
        base, top = value.get("base"), value.get("top", 0)
        extra = set(value) - {"base", "top"}
        if extra:
            raise InvalidBody(f"'knowledge' takes 'base' and 'top', not {', '.join(sorted(extra))}.", "knowledge")
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 50:
            raise InvalidBody("'knowledge.top' is how many chunks to answer from: 1 to 50.", "knowledge")
    else:
        base, top = value, 0
    if not isinstance(base, str) or not base or len(base) > 63 or not set(base) <= _NAME_CHARS:
        raise InvalidBody('\'knowledge\' names a knowledge base: "handbook" or {"base": "handbook"}.', "knowledge")
    return Asked(base, top)


def question_of(messages: object) -> str:
    """The text of the last user message (what the base is searched for); InvalidBody where
    there is none."""
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                content = text_of(message.get("content"))
                if content is not None and content.strip():
                    return content
    raise InvalidBody("A request answered from a knowledge base needs a user message with text to search for.")


def with_sources(messages: list, hits: list[Hit], base: str) -> list:
    """`messages` with the chunks `hits` as numbered sources in the system message (added first
    where there is none)."""
    if not hits:
        return messages
    said = "\n\n".join(f"[{n}] {hit.path}\n{hit.text}" for n, hit in enumerate(hits, 1))
    note = (
        f"Answer from these sources of the knowledge base '{base}' where they hold the answer, citing "
        f"them by number as [1]; say so where they do not.\n\n{said}"
    )
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") == "system" and isinstance(first.get("content"), str):
        return [{**first, "content": f"{first['content']}\n\n{note}"}, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


def sources_of(hits: list[Hit], base: str) -> list[dict]:
    """The sources an answer was given, as its body and header say them (not their text)."""
    return [
        {"index": n, "base": base, "path": h.path, "chunk": h.chunk, "score": h.score} for n, h in enumerate(hits, 1)
    ]


def sources_header(sources: list[dict]) -> str:
    """The sources as the `llmgw-sources` header carries them (ASCII JSON)."""
    return json.dumps(sources, ensure_ascii=True, separators=(",", ":"))


def body_with_sources(body: bytes, sources: list[dict]) -> bytes:
    """A whole answer's JSON body with the sources it was given in it (as it was, where it is not
    a JSON object)."""
    try:
        whole = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body
    return msgspec.json.encode({**whole, "sources": sources}) if isinstance(whole, dict) else body
