"""The router's HTTP/1.1 client to engines: keep-alive connections kept per engine, a request
written in one go, and its answer's body handed on piece by piece as it arrives (httptools
parses it, in C). It does only what forwarding needs, which is why it is not aiohttp: aiohttp
took a fifth of the router's CPU under load (py-spy, tests/bench/gateway.py)."""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

__all__ = ["KEEP_IDLE_S", "STALE_WITHIN_S", "EngineAnswer", "EngineError", "Upstream"]

_PAUSE_AT = 256 * 1024
"""Bytes of an answer held unread before the engine's connection stops being read."""
KEEP_IDLE_S = 2.0
"""A kept connection idle longer is not used again (engines close idle ones after a few seconds:
llama-server after 5)."""
STALE_WITHIN_S = 0.5
"""A kept connection closed unanswered this soon after a request was written had been closed by
the engine before it: the request is sent again once, on a new connection."""


class EngineError(Exception):
    """An engine could not be reached, closed the connection or sent a broken answer."""


@functools.lru_cache(maxsize=1024)
def _where(url: str) -> tuple[str, int, bool, bytes]:
    """An engine's base URL as (host, port, tls, Host header)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineError(f"an engine's URL must be http(s)://host:port, not {url!r}")
    tls = parts.scheme == "https"
    return parts.hostname, parts.port or (443 if tls else 80), tls, parts.netloc.encode()


@functools.lru_cache(maxsize=1024)
def _head(base: str, path: str, headers: tuple[tuple[str, str], ...]) -> bytes:
    """A request's line and headers up to its length's value."""
    lines = [b"POST %b HTTP/1.1\r\nhost: %b\r\n" % (path.encode(), _where(base)[3])]
    lines += [b"%b: %b\r\n" % (name.encode(), value.encode()) for name, value in headers]
    return b"".join([*lines, b"content-length: "])


class EngineAnswer:
    """An engine's answer: its status and headers, then its body read whole (`read`) or piece by
    piece (`next`). `fail` cuts it from outside (its reader raises that error); `release` gives
    its connection back for the next request where the answer was read to its end."""

    __slots__ = (
        "_conn",
        "_due",
        "_error",
        "_loop",
        "_pieces",
        "_timer",
        "_waiter",
        "complete",
        "headers",
        "read_s",
        "sink",
        "status",
    )

    def __init__(self, conn: _Connection, read_s: float | None, loop: asyncio.AbstractEventLoop) -> None:
        self._conn, self.read_s = conn, read_s
        """`read_s`: how long the engine may stay silent (None: as long as the exchange may last)."""
        self._loop = loop  # kept: asking for it each piece cost a getpid() system call a token
        self.status = 0
        self.headers: dict[str, str] = {}
        self._pieces: list[bytes] = []
        self._waiter: asyncio.Future | None = None
        self._due = 0.0
        """Loop time by which the piece waited for must come."""
        self._timer: asyncio.TimerHandle | None = None
        """One timer for the waits (`_check`), moved on lazily: a stream's pieces make none each."""
        self._error: BaseException | None = None
        self.complete = False
        """The whole body has arrived."""
        self.sink: Callable[[bytes], bool] | None = None
        """Where its reader takes pieces as they arrive, in the read callback (True: taken; False:
        not now, the piece waits for `next`): a piece it takes wakes no task. Pieces waiting
        for `next` go first: none is taken while one waits."""

    async def next(self) -> bytes:
        """The body's next piece (what arrived since the last call, joined); b"" at its end.
        Raises TimeoutError where nothing came for `read_s` or the exchange ran out of time, or
        the error that cut it."""
        while not self._pieces:
            if self._error is not None:
                self._stop()
                raise self._error
            if self.complete:
                self._stop()
                return b""
            await self._wait(self.read_s)
        piece = b"".join(self._pieces) if len(self._pieces) > 1 else self._pieces[0]
        self._pieces.clear()
        self._conn.resume()
        return piece

    async def read(self) -> bytes:
        """The whole body."""
        pieces = []
        while piece := await self.next():
            pieces.append(piece)
        return b"".join(pieces)

    def fail(self, error: BaseException) -> None:
        """Cut it: its reader raises `error` now, and its connection is dropped."""
        if self._error is None and not self.complete:
            self._error = error
            self._wake()
            self._conn.drop()

    def release(self) -> None:
        """Done with it: its connection goes back to the pool where the answer came whole and the
        engine keeps the connection open, else it is closed."""
        self._stop()
        self._conn.done(self)

    def _stop(self) -> None:
        """No more waits: the wait timer goes (it would hold the answer until it is due)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _wait(self, read_s: float | None) -> None:
        loop = self._loop
        self._waiter = waiter = loop.create_future()
        if read_s:
            self._due = loop.time() + read_s
            if self._timer is None:
                self._timer = loop.call_at(self._due, self._check)
        try:
            await waiter
        finally:
            self._waiter = None

    def _check(self) -> None:
        """The wait timer: the wait under way fails where its piece is overdue; else the timer
        moves on to when it is due (none while nobody waits)."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        loop = self._loop
        if loop.time() >= self._due:
            self._expire(waiter)
        else:
            self._timer = loop.call_at(self._due, self._check)

    @staticmethod
    def _expire(waiter: asyncio.Future) -> None:
        if not waiter.done():
            waiter.set_exception(TimeoutError("the engine sent nothing in time"))

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _push(self, piece: bytes) -> bool:
        """A piece arrived: to the sink, or kept for `next`; whether the sink took it."""
        if self.sink is not None and not self._pieces:
            try:
                taken = self.sink(piece)
            except Exception as exc:  # the reader's fault, raised to it from `next`, not into the engine's connection
                self.sink = None
                self.fail(exc)  # nothing more is read of the engine
                return True
            if taken:
                if self.read_s:  # the engine spoke: its silence counts from now
                    self._due = self._loop.time() + self.read_s
                return True
        self._pieces.append(piece)
        self._wake()
        return False

    def _end(self) -> None:
        self.complete = True
        self._wake()

    def _broken(self, error: BaseException) -> None:
        if self._error is None and not self.complete:
            self._error = error
            self._wake()


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine; one answer at a time."""

    def __init__(self, pool: list[_Connection]) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.answer: EngineAnswer | None = None
        self.headed: asyncio.Future | None = None
        self.parser = httptools.HttpResponseParser(self)
        """One parser for the connection's answers, one after another."""
        self.received = False
        """Any byte of the current answer arrived."""
        self.keep = False
        self.deadline: asyncio.TimerHandle | None = None
        self.paused = False
        self.buffered = 0
        """Bytes of the answer its reader has not taken yet."""
        self.bodies: list[bytes] = []
        """The body's pieces parsed from the read under way: they go on as one (`_flush`)."""
        self.sent_at = 0.0
        """When the current request was written (loop time)."""
        self.idle_since = 0.0
        """When it went back to the pool (loop time)."""
        self.closed = False

    def send(self, request: bytes, total_s: float, read_s: float | None) -> EngineAnswer:
        """Write a request; its answer comes in the returned `EngineAnswer` (once `headed`). The
        whole exchange has `total_s`; then it fails with TimeoutError."""
        loop = asyncio.get_running_loop()
        self.answer = EngineAnswer(self, read_s, loop)
        self.headed = loop.create_future()
        self.received = self.keep = False
        self.buffered, self.sent_at = 0, loop.time()
        self.deadline = loop.call_later(total_s, self._late)
        self.transport.write(request)
        return self.answer

    def _late(self) -> None:
        self._fail(TimeoutError("the engine's answer took longer than the router waits"))
        self.drop()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self.answer is None:
            self.drop()  # bytes nobody asked for: this connection cannot be trusted
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._flush()  # what came whole before the break goes on first
            self._fail(EngineError(f"the engine sent a broken answer ({exc})"))
            self.drop()
            return
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.deadline is not None:
            self.deadline.cancel()
        if self in self.pool:
            self.pool.remove(self)
        answer = self.answer
        if answer is not None and answer.status and exc is None and not answer.complete:
            if "content-length" not in answer.headers and "transfer-encoding" not in answer.headers:
                answer._end()  # an answer framed by the connection's end: this is its end
                return
        why = f" ({exc})" if exc else ""
        self._fail(EngineError(f"the engine closed the connection before its answer ended{why}"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.answer.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.answer.status = self.parser.get_status_code()
        if not self.headed.done():
            self.headed.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.bodies.append(body)  # an event a chunk: a read holding many passes them on as one

    def on_message_complete(self) -> None:
        self._flush()
        self.keep = self.parser.should_keep_alive()
        self.deadline.cancel()
        self.answer._end()

    def _flush(self) -> None:
        """The body's pieces of the read under way, to the answer as one."""
        if not self.bodies:
            return
        body = b"".join(self.bodies) if len(self.bodies) > 1 else self.bodies[0]
        self.bodies.clear()
        if self.answer._push(body):
            return
        self.buffered += len(body)
        if self.buffered > _PAUSE_AT and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    # the answer's side
    def resume(self) -> None:
        """Its reader caught up: read the engine again."""
        self.buffered = 0
        if self.paused and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def drop(self) -> None:
        """Close it (an answer cut, broken or left unread)."""
        if not self.closed:
            self.closed = True
            self.transport.abort()

    def done(self, answer: EngineAnswer) -> None:
        """`answer` is done with: back to the pool where it came whole on a kept connection."""
        if answer is not self.answer:
            return
        self.deadline.cancel()
        self.answer = self.headed = self.deadline = None
        if answer.complete and self.keep and not self.closed:
            self.resume()
            self.idle_since = asyncio.get_running_loop().time()
            self.pool.append(self)
        else:
            self.drop()

    def _fail(self, error: BaseException) -> None:
        if self.headed is not None and not self.headed.done():
            self.headed.set_exception(error)
        if self.answer is not None:
            self.answer._broken(error)


class Upstream:
    """Requests to engines over kept connections (one pool per engine)."""

    def __init__(self, total_s: float = 600.0, connect_s: float = 3.0) -> None:
        self.total_s, self.connect_s = total_s, connect_s
        """`total_s`: how long one exchange may last, its body read whole; `connect_s`: a connection."""
        self.pools: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(
        self, base: str, path: str, body: bytes, headers: dict[str, str], read_s: float | None = None
    ) -> EngineAnswer:
        """POST `body` to `path` on the engine at `base` (its URL); its answer once its status and
        headers came. The exchange, body read included, has `total_s`; the engine may stay
        silent for `read_s` at most, before its headers and between pieces (None: no such
        limit). A kept connection that closed unanswered within `STALE_WITHIN_S` of the request
        (the engine had closed it as it went out) is tried once more on a new connection."""
        host, port, tls, _ = _where(base)
        request = b"%b%d\r\n\r\n%b" % (_head(base, path, tuple(headers.items())), len(body), body)
        pool = self.pools.setdefault((host, port, tls), [])
        now = asyncio.get_running_loop().time()
        while pool:
            conn = pool.pop()
            if conn.closed or now - conn.idle_since > KEEP_IDLE_S:
                conn.drop()  # closed, or idle long enough that the engine may be closing it now
                continue
            try:
                return await self._exchange(conn, request, read_s)
            except EngineError:
                quick = asyncio.get_running_loop().time() - conn.sent_at < STALE_WITHIN_S
                if conn.received or not quick:
                    raise
                break  # the engine had closed this kept connection: once more, on a new one
        return await self._exchange(await self._open(host, port, tls, pool), request, read_s)

    def close(self) -> None:
        """Close every kept connection."""
        for pool in self.pools.values():
            for conn in list(pool):
                conn.drop()
            pool.clear()

    async def _exchange(self, conn: _Connection, request: bytes, read_s: float | None) -> EngineAnswer:
        answer = conn.send(request, self.total_s, read_s)
        timer = asyncio.get_running_loop().call_later(read_s, EngineAnswer._expire, conn.headed) if read_s else None
        try:
            await conn.headed
        except BaseException:
            conn.drop()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return answer

    async def _open(self, host: str, port: int, tls: bool, pool: list[_Connection]) -> _Connection:
        loop = asyncio.get_running_loop()
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(pool), host, port, ssl=self._tls if tls else None
                )
        except TimeoutError:
            raise EngineError(f"no connection to {host}:{port} within {self.connect_s:g} s") from None
        except OSError as exc:
            raise EngineError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        return conn
