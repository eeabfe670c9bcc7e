"""The least an HTTP gateway written in Python costs: the gateway bench's Python floor.

    python tests/bench/python_floor.py PORT BACKEND_URL

A reverse proxy on the router's own stack (asyncio on uvloop, httptools parsing both sides) that
does only what every HTTP gateway must: read a request, send it on to the one backend over a
kept-alive connection, read the answer and relay its body to the client as HTTP/1.1 chunks as
it arrives. No key, no routing, no limits, no stream parsed, no usage counted. Each client
connection has its own backend connection, opened at its first request. It answers GET
/health itself; it is not a gateway to use, only the floor its language and libraries put under
llmgw's router (what of the gap to a Rust router is the router's own work, what is Python's).
"""

from __future__ import annotations

import asyncio
import sys
from urllib.parse import urlsplit

import httptools
import uvloop

__all__ = ["main"]

_HEAD = b"content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"


class Backend(asyncio.Protocol):
    """The client connection's own connection to the backend: its answer relayed chunk by chunk."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        self.client.write(b"HTTP/1.1 %d OK\r\n%b\r\n" % (status, _HEAD))

    def on_body(self, body: bytes) -> None:
        self.client.write(b"%x\r\n%b\r\n" % (len(body), body))

    def on_message_complete(self) -> None:
        self.client.write(b"0\r\n\r\n")

    def connection_lost(self, exc) -> None:
        self.client.backend = None


class Client(asyncio.Protocol):
    """One client connection: each request read whole, then sent on to the backend."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.backend: Backend | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        if self.url == b"/health":
            self.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        else:
            head = [b"%b %b HTTP/1.1\r\nhost: %b\r\n" % (method, self.url, self.host.encode())]
            head += [b"%b: %b\r\n" % (n, v) for n, v in self.headers if n.lower() not in (b"host", b"connection")]
            request = b"".join(head) + b"\r\n" + bytes(self.body)
            if self.backend is None:
                asyncio.get_running_loop().create_task(self._open_and_send(request))
            else:
                self.backend.transport.write(request)
        self.headers, self.body = [], bytearray()

    async def _open_and_send(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, self.backend = await loop.create_connection(lambda: Backend(self), self.host, self.port)
        self.backend.transport.write(request)

    def connection_lost(self, exc) -> None:
        if self.backend is not None and self.backend.transport is not None:
            self.backend.transport.close()


async def serve(port: int, backend: str) -> None:
    """Proxy 127.0.0.1:`port` to `backend` until killed."""
    parts = urlsplit(backend)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(parts.hostname, parts.port), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    """`python_floor.py PORT BACKEND_URL`."""
    port, backend = int(sys.argv[1]), sys.argv[2]
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(port, backend))


if __name__ == "__main__":
    main()
