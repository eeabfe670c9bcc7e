"""A stream read back from its end, newest first, a window of messages at a time, filtered as
asked (`read_back`): the request log (the usage stream) and the audit trail. A page holds whole
messages, so the next one starts exactly where it stopped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from llmgw.proto import USAGE_STREAM, RequestLog, RequestLogAsk, UsageRecord, usage_records
from llmgw.router.usage.stream_reader import StreamReader

__all__ = ["MOST_SCANNED", "WINDOW", "Tail", "read_back", "request_log"]

T = TypeVar("T")

WINDOW = 256
"""Messages read at a time, going back from the end."""
MOST_SCANNED = 8192
"""Messages one page reads at most (a filter that matches little stops there, saying where)."""


async def _window(
    nc: Client, js: JetStreamContext, stream: str, start: int, end: int, decode: Callable[[bytes], list[T]]
) -> list[tuple[int, list[T]]]:
    """Messages `start` to `end` (those the stream still has), each with what it holds."""
    reader = await StreamReader(nc, js, stream).open(seq=start)
    out = []
    try:
        while batch := await reader.pull(end + 1 - start):
            for seq, _, data in batch:
                if seq > end:
                    return out
                try:
                    out.append((seq, decode(data)))
                except msgspec.DecodeError:
                    continue  # not one of this stream's messages: nothing to show
            if batch[-1][0] >= end:
                return out
    finally:
        await reader.close()
    return out


class Tail(NamedTuple, Generic[T]):
    """A stream read back: what its messages hold (`decode`) and when each item happened."""

    stream: str
    decode: Callable[[bytes], list[T]]
    when: Callable[[T], float]


async def read_back(
    nc: Client, js: JetStreamContext, tail: Tail[T], page: tuple[int, int], wanted: Callable[[T], bool]
) -> tuple[list[T], int]:
    """At least `limit` (`page`: before, limit) of what the stream's messages before sequence
    `before` (0: its end) hold and `wanted` lets through, newest first, whole messages; and where
    the next page starts (0: nothing older)."""
    stream, decode, when = tail
    before, limit = page
    try:
        state = (await js.stream_info(stream)).state
    except NotFoundError:
        return [], 0
    first = max(state.first_seq, 1)  # an empty stream says 0
    end = state.last_seq if not before else min(before - 1, state.last_seq)
    got: list[T] = []
    scanned = 0
    while end >= first and scanned < MOST_SCANNED:
        start = max(first, end - WINDOW + 1)
        scanned += end + 1 - start
        for seq, items in reversed(await _window(nc, js, stream, start, end, decode)):
            got += sorted((i for i in items if wanted(i)), key=when, reverse=True)
            if len(got) >= limit:
                return got, seq if seq > first else 0
        end = start - 1
    return got, end + 1 if end >= first else 0


_USAGE: Tail[UsageRecord] = Tail(USAGE_STREAM, usage_records, lambda r: r.time)


async def request_log(nc: Client, js: JetStreamContext, ask: RequestLogAsk) -> RequestLog:
    """The page `ask` names: the newest requests before `ask.before` that it lets through."""

    def wanted(r: UsageRecord) -> bool:
        return (
            (not ask.model or r.model == ask.model)
            and (not ask.key or r.key == ask.key)
            and (not ask.errors or r.status != 200)
            and (not ask.tenants or r.tenant in ask.tenants)
            and (not ask.keys or r.key in ask.keys)
        )

    got, after = await read_back(nc, js, _USAGE, (ask.before, ask.limit), wanted)
    return RequestLog(requests=got, next=after)
