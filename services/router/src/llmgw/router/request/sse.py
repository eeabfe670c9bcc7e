"""An engine's SSE stream as the client gets it, without I/O: events that leave exactly as they
came are passed on in one piece (`plain_events`, the fast path most chunks take), the rest line by
line (`relay_line`: named as the client asked, the usage chunk only where asked, usage and
timings read). `StreamRelay` is a stream's state across the pieces it arrives in, cut anywhere."""

from __future__ import annotations

import msgspec

from llmgw.router.request.core import Usage, fold_usage, rewrite_chunk

__all__ = ["StreamRelay", "plain_events", "relay_line"]


class StreamRelay:
    """One stream relayed piece by piece: what to send of each, its usage, the chunks sent."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.model, self.include_usage = model, include_usage
        self.marker = b'"model":' + msgspec.json.encode(model)
        self.usage = Usage()
        self.chunks = 0
        """Chunks passed on (the first one's time is the time to the first token)."""
        self.pending = b""
        """The end of the last piece after its last newline: the start of a line still coming."""

    def feed(self, piece: bytes) -> bytes:
        """What the client gets of the stream's next piece (b"": nothing yet)."""
        data = self.pending + piece if self.pending else piece
        end = data.rfind(b"\n") + 1
        data, self.pending = (data, b"") if end == len(data) else (data[:end], data[end:])
        plain, chunks = plain_events(data, self.marker)
        self.chunks += chunks
        if plain == end:  # all of it leaves as it came (most pieces: one chunk's event)
            return data
        out = [data[:plain]] if plain else []
        for line in data[plain : end - 1].split(b"\n") if plain < end else ():
            event, self.usage, chunk = relay_line(line, self.model, self.include_usage, self.usage)
            self.chunks += chunk
            if event:
                out.append(event)
        return b"".join(out)

    def end(self) -> bytes:
        """What the client gets of a last line the stream did not end with a newline."""
        if not self.pending.strip():
            return b""
        event, self.usage, chunk = relay_line(self.pending, self.model, self.include_usage, self.usage)
        self.chunks += chunk
        self.pending = b""
        return event or b""


def plain_events(data: bytes, marker: bytes) -> tuple[int, int]:
    """How many leading bytes of `data` (an engine's stream, cut after a line) are whole events
    that leave exactly as they came, and how many chunks those hold: `data: ` lines, each event
    a chunk already named as asked (`marker`: `"model":` and the name, in JSON) or `[DONE]`, up
    to the first event that mentions usage or timings (those are read, `relay_line`). Anything
    else (comments, carriage returns, a name to rewrite) makes it (0, 0): read line by line."""
    stop = len(data)
    for word in (b'"usage"', b'"timings"'):
        at = data.find(word, 0, stop)
        if at >= 0:
            stop = at
    stop = data.rfind(b"\n\n", 0, stop) + 2
    if stop < 2 or data.find(b"\r", 0, stop) >= 0:
        return 0, 0
    events = data.count(b"data: ", 0, stop)
    chunks = events - data.count(b"data: [DONE]", 0, stop)
    if data.count(b"\n", 0, stop) != 2 * events or data.count(marker, 0, stop) != chunks:
        return 0, 0
    return stop, chunks


def relay_line(line: bytes, model: str, include_usage: bool, seen: Usage) -> tuple[bytes | None, Usage, bool]:
    """One line of an engine's SSE stream as the client gets it (None: nothing to send), the
    stream's usage with what the line says, and whether it carried a chunk (for the time to the
    first token)."""
    line = line.rstrip(b"\r")
    if not line.startswith(b"data:"):
        return None, seen, False
    data = line[5:].strip()
    if data == b"[DONE]":
        return b"data: [DONE]\n\n", seen, False
    if b'"usage"' not in data and b'"timings"' not in data and b'"model":' + msgspec.json.encode(model) in data:
        return b"data: " + data + b"\n\n", seen, True  # already as the client gets it (most chunks)
    try:
        chunk = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return b"data: " + data + b"\n\n", seen, True
    if not isinstance(chunk, dict):
        return b"data: " + data + b"\n\n", seen, True
    seen = fold_usage(seen, chunk)  # before the rewrite: it drops what the client did not ask for
    out = rewrite_chunk(chunk, model, include_usage)
    return (b"data: " + out + b"\n\n" if out is not None else None), seen, True
