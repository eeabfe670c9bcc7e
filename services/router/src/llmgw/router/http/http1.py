"""The HTTP/1.1 pieces of the router's front that hold no connection: a request as it arrives,
and an answer's status line and headers."""

from __future__ import annotations

import http

from llmgw.router.errors import ApiError
from llmgw.router.http.endpoint import response_head
from llmgw.router.request.relay import Answer, Relay

__all__ = ["Arrived", "answer_head"]


class Arrived:
    """A request as it arrives: its head, then its body."""

    __slots__ = ("body", "chunked", "headers", "keep", "method", "path", "refused")

    def __init__(self, method: str, path: str, headers: dict[str, str]) -> None:
        self.method, self.path, self.headers = method, path, headers
        self.body = bytearray()
        """What came of its body: one buffer, so a body in tiny pieces costs its size, not an
        object a piece."""
        self.keep = True
        self.chunked = True
        """Whether its client reads chunks (HTTP/1.1); an HTTP/1.0 one gets a stream unframed,
        ended by closing the connection."""
        self.refused: ApiError | None = None
        """Refused while it arrived (its body too large, its head ambiguous): answered so, then
        the connection closed."""

    async def read(self) -> bytes:
        """Its body (it came whole before it was answered)."""
        return bytes(self.body)


def answer_head(answer: Answer | Relay, rid: str, keep: bool, length: int | None, chunked: bool = True) -> bytes:
    """An answer's status line and headers: its length, or chunked where it is streamed (to an
    HTTP/1.0 client: neither, the connection's end ends it)."""
    status = answer.status
    lines = [b"HTTP/1.1 %d %b\r\n" % (status, _REASONS.get(status, b"Status"))]
    lines += [b"%b: %b\r\n" % pair for pair in response_head(answer, rid)]
    if length is not None:
        lines.append(b"content-length: %d\r\n" % length)
    elif chunked:
        lines.append(b"transfer-encoding: chunked\r\n")
    if not keep:
        lines.append(b"connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}
