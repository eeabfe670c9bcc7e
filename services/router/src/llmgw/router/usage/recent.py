"""The request log: the latest requests read back from the end of the usage stream, newest
first, a window of messages at a time, filtered as asked. A page holds whole usage messages,
so the next one starts exactly where it stopped."""

from __future__ import annotations

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from llmgw.proto import USAGE_STREAM, RequestLog, RequestLogAsk, UsageRecord, usage_records
from llmgw.router.usage.stream_reader import StreamReader

__all__ = ["MOST_SCANNED", "WINDOW", "request_log"]

WINDOW = 256
"""Messages read at a time, going back from the end."""
MOST_SCANNED = 8192
"""Messages one page reads at most (a filter that matches little stops there, saying where)."""


def _wanted(ask: RequestLogAsk, r: UsageRecord) -> bool:
    return (
        (not ask.model or r.model == ask.model)
        and (not ask.key or r.key == ask.key)
        and (not ask.errors or r.status != 200)
    )


async def _window(nc: Client, js: JetStreamContext, start: int, end: int) -> list[tuple[int, list[UsageRecord]]]:
    """Messages `start` to `end` (those the stream still has), each with its requests."""
    reader = await StreamReader(nc, js, USAGE_STREAM).open(seq=start)
    out = []
    try:
        while batch := await reader.pull(end + 1 - start):
            for seq, _, data in batch:
                if seq > end:
                    return out
                try:
                    out.append((seq, usage_records(data)))
                except msgspec.DecodeError:
                    continue  # not a usage message: nothing to show
            if batch[-1][0] >= end:
                return out
    finally:
        await reader.close()
    return out


async def request_log(nc: Client, js: JetStreamContext, ask: RequestLogAsk) -> RequestLog:
    """The page `ask` names: the newest requests before `ask.before` that it lets through."""
    try:
        state = (await js.stream_info(USAGE_STREAM)).state
    except NotFoundError:
        return RequestLog(requests=[])
    first = max(state.first_seq, 1)  # an empty stream says 0
    end = state.last_seq if not ask.before else min(ask.before - 1, state.last_seq)
    got: list[UsageRecord] = []
    scanned = 0
    while end >= first and scanned < MOST_SCANNED:
        start = max(first, end - WINDOW + 1)
        scanned += end + 1 - start
        for seq, records in reversed(await _window(nc, js, start, end)):
            got += sorted((r for r in records if _wanted(ask, r)), key=lambda r: r.time, reverse=True)
            if len(got) >= ask.limit:
                return RequestLog(requests=got, next=seq if seq > first else 0, scanned=scanned)
        end = start - 1
    return RequestLog(requests=got, next=end + 1 if end >= first else 0, scanned=scanned)
