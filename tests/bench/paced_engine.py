"""A stand-in for an engine's stream, for tests/bench/streams.py: answers every POST with a chat
completion stream of `--tokens` events, one every `--gap-ms` (0: all of them back to back, each
its own write), chunked as llama-server sends it, then the usage event and [DONE]; GET /health
answers 200. Every stream on the server takes its next event at the same tick (one timer, as an
engine's batch decodes a token for each of its streams at once).

    python tests/bench/paced_engine.py --port 8001 --tokens 256 --gap-ms 2
"""

from __future__ import annotations

import argparse
import asyncio

from gateway_peers import sse_events

__all__ = ["main"]

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
HEALTH = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{"status":"ok"}'


def events(tokens: int) -> list[bytes]:
    """The stream's writes as HTTP chunks: one event a token, then the usage event, [DONE] and the
    stream's end together."""
    chunks = [b"%x\r\n%s\r\n" % (len(raw), raw) for raw in (f"data: {e}\n\n".encode() for e in sse_events(tokens))]
    return [*chunks[:tokens], chunks[tokens] + chunks[tokens + 1] + b"0\r\n\r\n"]


class Clock:
    """The tick every stream takes its next event at (None gap: no tick, each stream at once)."""

    def __init__(self, stream: list[bytes], gap_s: float) -> None:
        self.stream, self.gap_s = stream, gap_s
        self.streams: dict[asyncio.Transport, int] = {}
        """Each stream under way: its connection and the index of its next event."""
        self.ticking = False

    def start(self, transport: asyncio.Transport) -> None:
        """A new stream on `transport`: its head now, its events from the next tick on."""
        transport.write(HEAD)
        if not self.gap_s:
            for event in self.stream:
                transport.write(event)
            return
        self.streams[transport] = 0
        if not self.ticking:
            self.ticking = True
            asyncio.get_running_loop().call_later(self.gap_s, self.tick)

    def tick(self) -> None:
        """Each stream's next event; those at their end are done."""
        last = len(self.stream) - 1
        for transport, i in list(self.streams.items()):
            if transport.is_closing():
                del self.streams[transport]
                continue
            transport.write(self.stream[i])
            if i == last:
                del self.streams[transport]
            else:
                self.streams[transport] = i + 1
        self.ticking = bool(self.streams)
        if self.ticking:
            asyncio.get_running_loop().call_later(self.gap_s, self.tick)


class Engine(asyncio.Protocol):
    """One client connection: requests read (head and Content-Length body), each answered."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.buffer = clock, b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            if head.startswith("GET"):
                self.transport.write(HEALTH)
            else:
                self.clock.start(self.transport)


async def serve(port: int, tokens: int, gap_ms: float) -> None:
    """Serve on 127.0.0.1:`port` until killed."""
    clock = Clock(events(tokens), gap_ms / 1000)
    server = await asyncio.get_running_loop().create_server(lambda: Engine(clock), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    """The command line above."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.tokens, args.gap_ms))


if __name__ == "__main__":
    main()
