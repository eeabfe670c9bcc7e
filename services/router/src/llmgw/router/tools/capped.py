"""HTTP to MCP servers whose answers are read no further than a tool result may be: a server
answering 50 MB is cut at the cap as the bytes arrive, never held whole first (JSON bodies and
event streams alike), and never compressed (a small compressed answer can unpack to gigabytes).
A hook on the client's answers, not a transport of its own: the client's proxies (from the
environment) stay as they are."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2

__all__ = [
    "ENVELOPE_BYTES",
    "MOST_ANSWER_BYTES",
    "MOST_RESULT_BYTES",
    "TOO_LARGE",
    "UNCOMPRESSED",
    "AnswerTooLarge",
    "cap_answer",
]

MOST_RESULT_BYTES = 4 * 1024 * 1024
"""The largest tool result passed back (4 MiB)."""
ENVELOPE_BYTES = 64 * 1024
"""What a server's answer may hold beyond its result: the JSON-RPC message around it, an event
stream's framing, a few progress notifications."""
MOST_ANSWER_BYTES = MOST_RESULT_BYTES + ENVELOPE_BYTES
"""The most of a call's answer read (one event of a stream holds it whole)."""
TOO_LARGE = f"its result is over the {MOST_RESULT_BYTES:,} bytes passed back (cut there)"
"""What a call cut for its size says."""


class AnswerTooLarge(httpx2.SSEError, httpx2.StreamError):
    """An answer cut where it passed what a result may be. Both a transport's stream error and an
    event stream's: the MCP SDK turns either into the call's error, as it reads a JSON body or
    an event stream."""


UNCOMPRESSED = {"accept-encoding": "identity"}
"""The header every request to a tool server carries: its answers are capped as sent."""


async def cap_answer(response: httpx2.Response) -> None:
    """An httpx2 response hook: the answer to a call (a POST) cut past `MOST_RESULT_BYTES` and
    `ENVELOPE_BYTES` as its body is read (AnswerTooLarge), and refused where it comes compressed.
    A server's own stream of notifications (a GET) is not a result, and is not capped."""
    if response.request.method != "POST":
        return
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerTooLarge(f"the server answered compressed ({encoding}) where it was asked not to")
    response.stream = _Capped(response.stream, MOST_ANSWER_BYTES)  # type: ignore[arg-type]


class _Capped(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, most: int) -> None:
        self.inner, self.most = inner, most

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for piece in self.inner:
            read += len(piece)
            if read > self.most:
                raise AnswerTooLarge(TOO_LARGE)
            yield piece

    async def aclose(self) -> None:
        await self.inner.aclose()
