"""The router's front door: its own HTTP/1.1 server (asyncio, httptools) answering the OpenAI
routes with nothing between the socket and the gateway, and handing every other connection (the
admin API, the console, /schema) to the ASGI app's own server on a private Unix socket, as a
byte tunnel. A general server costs a streamed request more than the router's own work does
(uvicorn and Litestar were half its CPU under load: docs/benchmarks.md); this one does only what
the OpenAI routes need: keep-alive, a body up to the most the router takes, `Expect:
100-continue`, answers whole or streamed in chunks, backpressure, and a stream cut as soon as its
client goes away."""

from __future__ import annotations

import asyncio
import collections
import http
import socket
import tempfile
from pathlib import Path

import httptools

from llmgw.bus import HttpServer, get_logger
from llmgw.router.endpoint import OPENAI_ROUTES, REQUEST_HEADERS, OpenAIEndpoint, request_id, response_head
from llmgw.router.errors import ApiError, BodyTooLarge, HttpError
from llmgw.router.relay import Answer, Relay

__all__ = ["Front"]

IDLE_S = 5.0
"""A kept connection idle this long is closed."""
MOST_HEAD_BYTES = 64 * 1024
"""A request's line and headers beyond this get 431."""
_DONE = b"data: [DONE]\n\n"


class _Request:
    __slots__ = ("body", "chunked", "headers", "keep", "method", "path", "refused")

    def __init__(self, method: str, path: str, headers: dict[str, str]) -> None:
        self.method, self.path, self.headers = method, path, headers
        self.body: list[bytes] = []
        self.keep = True
        self.chunked = True
        """Whether its client reads chunks (HTTP/1.1); an HTTP/1.0 one gets a stream unframed,
        ended by closing the connection."""
        self.refused: ApiError | None = None
        """Refused while it arrived (its body too large): answered so, then the connection closed."""

    async def read(self) -> bytes:
        """Its body (it came whole before it was answered)."""
        return b"".join(self.body)


class Front:
    """Serves `endpoint`'s OpenAI routes on `host`:`port` (0: a free one); every other request's
    connection goes to `app`'s server (uvicorn) on a private socket."""

    def __init__(self, endpoint: OpenAIEndpoint, host: str, port: int) -> None:
        self.endpoint = endpoint
        self.sock = socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
        )
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.folder = tempfile.TemporaryDirectory(prefix="llmgw-router-")
        self.private = str(Path(self.folder.name) / "rest.sock")
        self.rest = HttpServer(endpoint, path=self.private)
        self.server: asyncio.Server | None = None
        self.clients: set[_Client] = set()
        self.sweeper: asyncio.Task | None = None
        self.log = get_logger("router")

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Start serving; returns once it listens."""
        await self.rest.start()
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _Client(self), sock=self.sock, backlog=1024)
        self.sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Close the kept connections idle for `IDLE_S`, once a second (one timer for all)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            now = loop.time()
            for client in list(self.clients):
                if client.idle_since is not None and now - client.idle_since > IDLE_S:
                    client.close()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop listening at once, let the requests in flight finish (for `grace_s` at most, then
        cut them), close every connection, and stop."""
        if self.server is not None:
            self.server.close()
        if self.sweeper is not None:
            self.sweeper.cancel()
        for client in list(self.clients):
            if client.task is None and client.tunnel is None:  # a tunnel's requests drain in the app's server
                client.close()
        busy = [c.task for c in self.clients if c.task is not None]
        if busy:
            _, late = await asyncio.wait(busy, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self.rest.stop(grace_s)
        for client in list(self.clients):
            client.close()
        self.folder.cleanup()


class _Client(asyncio.Protocol):
    """One client's connection: its requests answered one after another."""

    def __init__(self, front: Front) -> None:
        self.front, self.endpoint = front, front.endpoint
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.task: asyncio.Task | None = None
        """The request being answered."""
        self.waiting: collections.deque[_Request] = collections.deque()
        """Requests that came while another was answered (pipelined)."""
        self.request: _Request | None = None
        self.url, self.head_bytes, self.size = b"", 0, 0
        self.chunk, self.raw = b"", None
        """This read's bytes; the bytes of a request not yet known to be an OpenAI route."""
        self.ended_here = False
        """A request ended in this read (one that begins after it is pipelined)."""
        self.tunnel: _Tunnel | None = None
        self.writable: asyncio.Future | None = None
        self.idle_since: float | None = None
        """Since when it waits for a request (loop time; None: busy, or a tunnel)."""

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.front.clients.add(self)
        self._idle()

    def data_received(self, data: bytes) -> None:
        if self.tunnel is not None:
            self.tunnel.send(data)
            return
        self.chunk, self.ended_here = data, False
        if self.raw is not None:
            self.raw.append(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # an Upgrade: its connection went to the app's server when its headers came
        except httptools.HttpParserError as exc:
            if self.tunnel is None:
                self._refuse(HttpError(400, f"The request is not HTTP/1.1 the router can read ({exc})."))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front.clients.discard(self)
        if self.task is not None:
            self.task.cancel()  # the client went away: what it waits on stops (a stream ends as 499)
        if self.tunnel is not None:
            self.tunnel.close()
        self._wake()

    def pause_writing(self) -> None:
        self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._wake()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.idle_since = None
        self.url, self.head_bytes, self.size, self.request = b"", 0, 0, _Request("", "", {})
        self.raw = None if self.ended_here or self.task is not None else [self.chunk]

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        name = name.lower()
        if name in REQUEST_HEADERS or name == b"expect":
            self.request.headers[name.decode()] = value.decode("latin-1")

    def _count_head(self, size: int) -> None:
        """A request's line and headers may not pass `MOST_HEAD_BYTES` (431, then closed)."""
        self.head_bytes += size
        if self.head_bytes > MOST_HEAD_BYTES and self.tunnel is None and not self.closed:
            self.raw = None
            self._refuse(HttpError(431, "The request's headers are too large."))

    def on_headers_complete(self) -> None:
        if self.tunnel is not None or self.closed:
            return
        path = self.url.split(b"?", 1)[0].decode("latin-1")
        if len(path) > 1 and path.endswith("/"):
            path = path[:-1]  # /v1/models/ is /v1/models
        request = self.request
        request.method, request.path = self.parser.get_method().decode(), path
        request.keep = self.parser.should_keep_alive()
        request.chunked = self.parser.get_http_version() != "1.0"
        app_s = path not in OPENAI_ROUTES or request.method not in ("GET", "POST") or self.parser.should_upgrade()
        if app_s:  # HEAD and such, and an Upgrade (h2c, websocket): the app's server answers
            if self.raw is None:  # pipelined behind another: where it begins is not known here
                request.refused = HttpError(400, "Send requests outside /v1 on a connection of their own, unpipelined.")
                request.keep = False
            else:
                self._hand_over()
            return
        self.raw = None
        length = request.headers.get("content-length", "")
        too_long = length.isdigit() and int(length) > self.endpoint.most
        expects = request.headers.get("expect", "").lower() == "100-continue" and request.chunked
        if expects and self.task is None:  # not while another's answer is being written
            if too_long:  # told at once: the client has not sent the body and need not
                self._refuse(self._too_large())
            else:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        request = self.request
        if self.tunnel is not None or request.refused is not None:
            return
        self.size += len(body)
        if self.size > self.endpoint.most:
            request.refused = self._too_large()
            request.keep, request.body = False, []
            return
        request.body.append(body)

    def on_message_complete(self) -> None:
        if self.tunnel is not None or self.closed:
            return
        self.ended_here = True
        if self.task is None:
            self._answer(self.request)
        else:
            self.waiting.append(self.request)
            self.transport.pause_reading()

    # answering
    def _answer(self, request: _Request) -> None:
        self.task = asyncio.get_running_loop().create_task(self._serve(request))

    async def _serve(self, request: _Request) -> None:
        keep = request.keep
        try:
            rid = request.headers.get("x-request-id") or request_id()
            if request.refused is not None:
                answer = self.endpoint.refused(request.refused)
            else:
                answer = await self.endpoint.respond(request.method, request.path, request.headers, request.read, rid)
            if isinstance(answer, Relay):
                keep = keep and request.chunked  # unframed, a stream ends with its connection
                await self._stream(answer, rid, keep, request.chunked)
            else:
                self._write(_head(answer, rid, keep, len(answer.body)) + answer.body)
        except asyncio.CancelledError:
            keep = False  # cut: the client went away, or the router stops
        except Exception:
            self.front.log.exception("the router failed writing an answer", path=request.path)
            keep = False
        self.task = None
        if not keep or self.closed:
            self.close()
        elif self.waiting:
            self.transport.resume_reading()
            self._answer(self.waiting.popleft())
        else:
            self._idle()

    async def _stream(self, relay: Relay, rid: str, keep: bool, chunked: bool) -> None:
        """The relay in chunks (unframed where not `chunked`): its head leaves with its first
        piece, `[DONE]` with the end."""
        head, held = _head(relay, rid, keep, None, chunked), b""
        try:
            async for piece in relay.chunks:
                framed = b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece
                out = head + held + framed if piece else head + held
                head, held = b"", b""
                if piece.endswith(_DONE):  # most likely the last: held to leave with the end
                    out, held = b"", out
                if out:
                    self._write(out)
                    if self.writable is not None:
                        await self.writable
            self._write(head + held + (b"0\r\n\r\n" if chunked else b""))
        finally:
            await relay.close()

    def _write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def _refuse(self, error: ApiError) -> None:
        """A request that cannot be read: answered so, and the connection closed."""
        if self.task is None and not self.closed:
            answer = self.endpoint.refused(error)
            self._write(_head(answer, request_id(), False, len(answer.body)) + answer.body)
        self.close()

    def _too_large(self) -> BodyTooLarge:
        return BodyTooLarge(f"The request body is over {self.endpoint.most} bytes, the most this router takes.")

    def _hand_over(self) -> None:
        """This connection goes to the app's server, from this request on."""
        self.tunnel = _Tunnel(self, b"".join(self.raw))
        self.raw, self.idle_since = None, None

    def _idle(self) -> None:
        self.idle_since = asyncio.get_running_loop().time()

    def _wake(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    def close(self) -> None:
        """Close the connection (what is written still leaves)."""
        if not self.closed:
            self.closed = True
            self.transport.close()


class _Tunnel(asyncio.Protocol):
    """A client's bytes to the app's server and back, once its connection was handed over."""

    def __init__(self, client: _Client, first: bytes) -> None:
        self.client = client
        self.pending = [first]
        self.transport: asyncio.Transport | None = None
        self.task = asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_unix_connection(lambda: self, self.client.front.private)
        except OSError as exc:
            self.client.front.log.error("the router's own app server is not there", error=str(exc))
            self.client.close()

    def send(self, data: bytes) -> None:
        """Bytes from the client."""
        if self.transport is None:
            self.pending.append(data)
        else:
            self.transport.write(data)

    def close(self) -> None:
        """The client went away."""
        if self.transport is not None:
            self.transport.close()
        else:
            self.task.cancel()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.client.closed:
            transport.close()
            return
        transport.write(b"".join(self.pending))
        self.pending = []

    def data_received(self, data: bytes) -> None:
        self.client._write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


def _head(answer: Answer | Relay, rid: str, keep: bool, length: int | None, chunked: bool = True) -> bytes:
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
