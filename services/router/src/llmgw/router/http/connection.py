"""One client connection to the router's front (`front.py`): its requests read with httptools a
slice at a time, answered one after another (whole or streamed), its deadlines checked when the
front's sweep asks, and the connection handed to the app's server where a request is not an
OpenAI route."""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

import httptools

from llmgw.router.errors import ApiError, BodyTooLarge, HttpError
from llmgw.router.http.endpoint import OPENAI_ROUTES, REQUEST_HEADERS, request_id
from llmgw.router.http.http1 import Arrived, answer_head
from llmgw.router.http.tunnel import TUNNEL_SILENT_S, Tunnel
from llmgw.router.request.relay import Relay

if TYPE_CHECKING:
    from llmgw.router.http.front import Front

__all__ = ["IDLE_S", "MOST_HEAD_BYTES", "Client"]

IDLE_S = 5.0
"""A kept connection idle this long is closed."""
MOST_HEAD_BYTES = 64 * 1024
"""A request's line and headers beyond this get 431 (counted as they arrive)."""
SLICE = 8 * 1024
"""Bytes are read into the parser this many at a time, so that requests pipelined behind the one
being answered are read no further ahead than this."""
LINGER_S = 2.0
"""A connection refused for what its client sent is closed this long after the answer (its
client's further bytes read and dropped meanwhile)."""
_DONE = b"data: [DONE]\n\n"


class Client(asyncio.Protocol):
    """One client's connection: its requests answered one after another."""

    def __init__(self, front: Front) -> None:
        self.front, self.endpoint, self.config = front, front.endpoint, front.config
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.closed = False
        self.answered = False
        """Whether a request of its was answered (it is shed after those never answered)."""
        self.task: asyncio.Task | None = None
        """The request being answered."""
        self.waiting: collections.deque[Arrived] = collections.deque()
        """Requests that came while another was answered (pipelined), at most a `SLICE` of them."""
        self.held = b""
        """Bytes not read into the parser yet: those behind a pipelined request."""
        self.paused = False
        """Reading stopped: a request waits behind the one being answered."""
        self.blind = False
        """A tunnel whose bytes are no longer HTTP (an Upgrade): only its silence is watched."""
        self.request: Arrived | None = None
        self.url, self.head_bytes, self.arrived, self.size = b"", 0, 0, 0
        """The head's bytes read (exact, once read) and arrived (a slice at a time); the body's."""
        self.chunk, self.raw = b"", None
        """This slice's bytes; the bytes of a request not yet known to be an OpenAI route."""
        self.ended_here = False
        """A request ended in this slice (one that begins after it is pipelined)."""
        self.tunnel: Tunnel | None = None
        self.writable: asyncio.Future | None = None
        self.stage = "idle"
        """What it waits for while nothing is answered on it: 'idle' (a request), 'head' (the
        rest of a request's head), 'body' (the rest of its body)."""
        self.since = self.last = self.stalled_at = 0.0
        """When the stage began; when a byte of the body last came; when its client last stopped
        reading (loop time)."""

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Seated, or told 503 where every seat is busy."""
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.address = peer[0] if isinstance(peer, tuple) else str(peer)
        self.since = self.loop.time()
        if not self.front.seats.admit(self):
            answer = self.endpoint.refused(
                HttpError(
                    503,
                    f"The router has {self.front.seats.most} connections open, every one being answered; "
                    "try again shortly.",
                )
            )
            self.closed = True
            transport.write(answer_head(answer, request_id(), False, len(answer.body)) + answer.body)
            transport.close()

    def data_received(self, data: bytes) -> None:
        """Bytes from the client: to the parser, the tunnel, or held."""
        if self.tunnel is not None:
            self.tunnel.send(data)
            self._watch(data)
        elif self.paused:
            self.held += data
        elif not self.closed:
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Read `data` into the parser a `SLICE` at a time; once a request waits behind the one
        being answered, stop reading (the rest held) until it is answered."""
        for start in range(0, len(data), SLICE):
            piece = data[start : start + SLICE] if len(data) > SLICE else data
            self.chunk, self.ended_here, size = piece, False, self.size
            if self.raw is not None:
                self.raw.append(piece)
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserUpgrade:
                pass  # an Upgrade: its connection went to the app's server when its headers came
            except httptools.HttpParserError as exc:
                if self.tunnel is None:
                    self._refuse(HttpError(400, f"The request is not HTTP/1.1 the router can read ({exc})."))
            if self.tunnel is not None:  # handed over in this slice: the rest is the app's too
                if rest := data[start + SLICE :]:
                    self.tunnel.send(rest)
                return
            if self.closed or self._too_much(len(piece), size):
                return
            if self.waiting:
                self.held = data[start + SLICE :]
                self.paused = True
                self.transport.pause_reading()
                return

    def _too_much(self, arrived: int, size: int) -> bool:
        """Whether what arrived passes what a request may send unread: a head past
        `MOST_HEAD_BYTES` as it arrives, or as much again of a chunked body's framing, extensions
        or trailer with no body in it (431, then closed)."""
        if self.stage == "head":
            self.arrived += arrived
        elif self.stage == "body":
            self.arrived = 0 if self.size > size else self.arrived + arrived
        if self.stage == "idle" or self.arrived <= MOST_HEAD_BYTES:
            return False
        what = "headers are" if self.stage == "head" else "chunked body's trailer (or its chunks' extensions) is"
        self._refuse(HttpError(431, f"The request's {what} too large."))
        return True

    def _watch(self, data: bytes) -> None:
        """A tunnel's bytes read for their deadlines alone (the app's server answers them); an
        Upgrade's (a websocket) are not HTTP after it, and only its silence is watched."""
        if not self.blind:
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserUpgrade, httptools.HttpParserError):
                self.blind = True

    def connection_lost(self, exc: Exception | None) -> None:
        """Gone: its seat freed, what it waited on cut."""
        self.closed = True
        self.front.seats.leave(self)
        if self.task is not None:
            self.task.cancel()  # the client went away: what it waits on stops (a stream ends as 499)
        if self.tunnel is not None:
            self.tunnel.close()
        self._wake()

    def pause_writing(self) -> None:
        """Its client reads slower than it is answered: the next write waits."""
        self.writable = self.loop.create_future()
        self.stalled_at = self.loop.time()

    def resume_writing(self) -> None:
        """Its client caught up."""
        self._wake()

    # httptools callbacks
    def on_message_begin(self) -> None:
        """A request begins: its head is timed from here."""
        self.url, self.head_bytes, self.arrived, self.size = b"", 0, 0, 0
        self.request = Arrived("", "", {})
        self.raw = None if self.ended_here or self.task is not None else [self.chunk]
        self._stage("head")

    def on_url(self, url: bytes) -> None:
        """A piece of the request line."""
        self.url += url
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """A header the gateway reads (never a trailer)."""
        if self.stage != "head":
            return  # a chunked body's trailer: never one of the request's headers
        self.head_bytes += len(name) + len(value)
        name = name.lower()
        if name in REQUEST_HEADERS or name == b"expect":
            headers = self.request.headers
            key = name.decode()
            if key == "authorization" and key in headers:
                self.request.refused = HttpError(400, "The request has more than one Authorization header; send one.")
                self.request.keep = False
            headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        """The head is in: an OpenAI route read here, anything else handed over."""
        self._stage("body")
        if self.tunnel is not None or self.closed:
            return
        if self.head_bytes > MOST_HEAD_BYTES:
            self._refuse(HttpError(431, "The request's headers are too large."))
            return
        path = self.url.split(b"?", 1)[0].decode("latin-1")
        if len(path) > 1 and path.endswith("/"):
            path = path[:-1]  # /v1/models/ is /v1/models
        request = self.request
        request.method, request.path = self.parser.get_method().decode(), path
        request.keep = request.keep and self.parser.should_keep_alive()
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
        if length.isdigit() and int(length) > self.endpoint.most:
            if self.task is None:  # told at once: the client need not send the body
                self._refuse(self._too_large())
            else:
                request.refused, request.keep = self._too_large(), False
        elif request.headers.get("expect", "").lower() == "100-continue" and request.chunked and self.task is None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # not while another's answer is written

    def on_body(self, body: bytes) -> None:
        """A piece of the body, kept up to the most the router takes."""
        request = self.request
        self.last = self.loop.time()
        if self.tunnel is not None:
            return
        self.size += len(body)
        if request.refused is not None:
            return
        if self.size > self.endpoint.most:
            request.refused = self._too_large()
            request.keep, request.body = False, bytearray()
            return
        request.body += body

    def on_message_complete(self) -> None:
        """The request is in: answered now, or after the one being answered."""
        self._stage("idle")
        if self.tunnel is not None or self.closed:
            return
        self.ended_here = True
        if self.task is None:
            self._answer(self.request)
        else:
            self.waiting.append(self.request)

    # deadlines
    def _stage(self, stage: str) -> None:
        self.stage = stage
        self.since = self.last = self.loop.time()

    def check(self, now: float) -> None:
        """End it where it is past a deadline (the sweep asks every connection)."""
        config, stage = self.config, self.stage
        if self.writable is not None and now - self.stalled_at > config.client_send_timeout_s:
            self.close()  # its client reads nothing of its answer
        elif self.tunnel is not None:
            late = stage != "idle" and not self.blind and self._late(now) is not None
            if late or now - self.tunnel.last > TUNNEL_SILENT_S:
                self.close()  # the app's server has no deadlines of its own for a head or body
        elif self.task is not None or self.closed:
            return  # being answered: the engine's deadlines hold
        elif stage == "idle":
            if now - self.since > IDLE_S:
                self.close()
        elif (why := self._late(now)) is not None:
            self._refuse(HttpError(408, why))

    def _late(self, now: float) -> str | None:
        """Why a head or body still arriving is past its deadline; None while it is not."""
        config = self.config
        if self.stage == "head":
            if now - self.since > config.client_header_timeout_s:
                return f"The request's headers did not arrive within {config.client_header_timeout_s:g} s."
        elif now - self.last > config.client_body_timeout_s:
            return f"Nothing of the request's body arrived for {config.client_body_timeout_s:g} s."
        elif now - self.since > config.client_body_total_s:
            return f"The request's body did not arrive within {config.client_body_total_s:g} s."
        return None

    # answering
    def _answer(self, request: Arrived) -> None:
        self.front.seats.busy(self)
        self.task = self.loop.create_task(self._serve(request))

    async def _serve(self, request: Arrived) -> None:
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
                self._write(answer_head(answer, rid, keep, len(answer.body)) + answer.body)
                if self.writable is not None:  # its client does not read: answer no more until it does
                    await self.writable
        except asyncio.CancelledError:
            keep = False  # cut: the client went away, or the router stops
        except Exception:
            self.front.log.exception("the router failed writing an answer", path=request.path)
            keep = False
        self.task, self.answered = None, True
        if not keep or self.closed:
            self.close()
            return
        self.front.seats.rest(self)
        self.since = self.last = self.loop.time()  # its clocks run from now
        if self.waiting:
            self._answer(self.waiting.popleft())
        elif self.paused:  # what came behind it, then the client again
            held, self.held, self.paused = self.held, b"", False
            self._feed(held)
            if not self.paused and not self.closed:
                self.transport.resume_reading()

    async def _stream(self, relay: Relay, rid: str, keep: bool, chunked: bool) -> None:
        """The relay in chunks (unframed where not `chunked`): its head leaves with its first
        piece, `[DONE]` with the end."""
        head, held = answer_head(relay, rid, keep, None, chunked), b""

        def send(piece: bytes) -> None:
            nonlocal head, held
            framed = b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece
            out = head + held + framed if piece else head + held
            head, held = b"", b""
            if piece.endswith(_DONE):  # most likely the last: held to leave with the end
                out, held = b"", out
            if out:
                self._write(out)

        relay.plug(send, self._keeps_up)  # pieces go out from the engine's read callback while it keeps up
        try:
            async for piece in relay.chunks:  # what came while it was behind, and the end
                send(piece)
                if self.writable is not None:
                    await self.writable
            self._write(head + held + (b"0\r\n\r\n" if chunked else b""))
        finally:
            await relay.close()

    def _keeps_up(self) -> bool:
        """Whether its client reads what it is sent (a write now would not wait)."""
        return self.writable is None and not self.closed

    def _write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def _refuse(self, error: ApiError) -> None:
        """A request that cannot be read: answered so, and the connection closed once its client
        has had `LINGER_S` to read that (closing at once with its bytes unread would send a reset
        that may overtake the answer)."""
        if self.closed:
            return
        if self.task is None:
            answer = self.endpoint.refused(error)
            self._write(answer_head(answer, request_id(), False, len(answer.body)) + answer.body)
        self.closed = True  # what else it sends is read and dropped
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.close)

    def _too_large(self) -> BodyTooLarge:
        return BodyTooLarge(f"The request body is over {self.endpoint.most} bytes, the most this router takes.")

    def _hand_over(self) -> None:
        """This connection goes to the app's server, from this request on."""
        self.tunnel = Tunnel(self, b"".join(self.raw))
        self.raw = None
        self.front.seats.busy(self)

    def _wake(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    def close(self) -> None:
        """Close the connection (what is written still leaves)."""
        self.closed = True
        self.front.seats.leave(self)  # at once, whatever the transport's state: a newcomer takes the seat
        if not self.transport.is_closing():
            self.transport.close()
