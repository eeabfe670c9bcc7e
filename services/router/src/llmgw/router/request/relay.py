"""One try of a request on one replica (`Try`), counted from when it is sent until it ends,
exactly once whatever ends it; what goes back to the client: a whole `Answer`, or the engine's
stream relayed (`Relay`), which ends its try when the stream ends or, whatever happened to it,
when it is closed."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable

import msgspec

from llmgw.router.errors import UpstreamFailed
from llmgw.router.metrics import Metrics
from llmgw.router.request.core import Prepared, Usage, cut_usage
from llmgw.router.request.outcome import Served
from llmgw.router.request.sse import StreamRelay
from llmgw.router.routing.balance import read_chars
from llmgw.router.routing.health import WHY_DOWN, Health, ReplicaDown
from llmgw.router.routing.upstream import EngineAnswer, EngineError

__all__ = ["FAILED", "Answer", "Finish", "Relay", "Try"]

FAILED = (EngineError, TimeoutError, ReplicaDown)
"""How a try on an engine fails (a refused connection, a broken answer, no answer in time, its
engine found not answering its health probe meanwhile)."""

Finish = Callable[[Served], None]
"""Told once how a forwarded request went (a stream: when it ended)."""


class Try:
    """One try of a request on one replica. It counts in the balancer and the in-flight gauge
    from when it is sent until it ends, once, whatever ends it: an answer, a failure, the client
    leaving (its task cancelled), a stream never read. Where the replica answered, the request
    ends with it: `finish` hears how it went."""

    def __init__(self, health: Health, metrics: Metrics, prepared: Prepared, tried: Served, finish: Finish) -> None:
        self.health, self.metrics, self.prepared, self.tried, self.finish = health, metrics, prepared, tried, finish
        self.balancer = health.balancer
        self.ended = False
        self.outage = health.outage(tried.replica)
        """Its replica's standing: out of rotation, it stops waiting on it."""
        self.sent = self.balancer.started(tried.replica, prepared.blocks, prepared.size)
        """How much of its prompt the balancer believed its replica held when it was sent, and
        the work it added there."""
        metrics.in_flight(tried.model, tried.replica, +1)

    def end(self, ok: bool | None, served: Served | None = None) -> None:
        """It ended (ok: the replica answered; False: it refused or failed, and its engine is
        probed at once; None: no word on the replica, as when the client went away); `served`:
        how the request ended with it, where it did. Only the first call counts."""
        if self.ended:
            return
        self.ended = True
        self.balancer.finished(self.tried.replica, ok, self.prepared.blocks, self.sent.work)
        if ok is False:
            self.health.suspect(self.tried.replica)
        self.metrics.in_flight(self.tried.model, self.tried.replica, -1)
        if served is None:
            return
        if served.status == 200 and self.prepared.blocks:  # where it answered well it now holds the prompt's blocks
            usage, blocks = served.usage, self.prepared.blocks
            size = self.prepared.size or None  # the bytes its blocks were cut from
            self.balancer.served(served.replica, blocks, usage.prompt, usage.cached, self.sent.believed, size)
            body = self.prepared.body  # one prompt read once: many (`n`, a list of prompts) are timed apart
            one = body.get("n") in (None, 1) and not isinstance(body.get("prompt"), list)
            if usage.prompt_ms is not None and usage.prompt and one:
                read = read_chars(blocks, size, usage.prompt, usage.cached)
                self.balancer.measured(served.replica, read, usage.prompt_ms)
        self.finish(served)


class Answer:
    """A whole answer to the client: its status, JSON body and headers."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or {}


class Relay:
    """The engine's SSE stream passed on, rewritten (`chunks`); one write per read from the
    engine (the events that arrived together leave together). Its try ends when the stream ends
    (read to its end, failed, or closed as the client went away) or, where it never got that far
    (never read), when it is closed, however that went.

    Where the client's connection `plug`s in, each piece goes to it from the engine's read
    callback while its client keeps up, with no task woken a piece (a task switch was a fifth of
    a relayed token's CPU); `chunks` then yields only what arrived while it was behind, and
    ends the stream as before."""

    status = 200
    _own: AsyncGenerator[bytes, None] | None = None
    """Its own `chunks` (a relay of other making, a kept answer replayed, has none: never plugged)."""

    def __init__(self, one: Try, resp: EngineAnswer, headers: dict[str, str]) -> None:
        self.one, self.resp = one, resp
        self.chunks = self._own = self._chunks()
        self.headers = {**headers, "content-type": "text/event-stream", "cache-control": "no-cache"}
        self._relay = StreamRelay(one.prepared.body["model"], one.prepared.include_usage)
        self._first: float | None = None
        """When the first chunk was passed on (perf_counter)."""
        self._send: Callable[[bytes], None] | None = None
        self._ready: Callable[[], bool] = bool  # both set by `plug`

    def plug(self, send: Callable[[bytes], None], ready: Callable[[], bool]) -> bool:
        """Pass the stream's pieces to `send` as they arrive, while `ready()` (its client keeps up);
        before `chunks` is read. Whether it can: not where a guardrail or the answer cache reads
        `chunks` (they wrap it)."""
        if self.chunks is not self._own:
            return False
        self._send, self._ready = send, ready
        return True

    def _feed(self, piece: bytes) -> bytes:
        """What the client gets of the engine's next piece; the first chunk's time kept."""
        out = self._relay.feed(piece)
        if self._first is None and self._relay.chunks:
            self._first = time.perf_counter()
        return out

    def _pass(self, piece: bytes) -> bool:
        """The engine's next piece, from its read callback: sent on now, where the client keeps up."""
        if not self._ready():
            return False
        if out := self._feed(piece):
            self._send(out)
        return True

    async def close(self) -> None:
        """The stream closed where it had not ended: its generator's own end where it started
        (its usage so far), else as the client's going away."""
        await self.chunks.aclose()
        self._end(499, Usage(), None, 0)

    def _cut(self) -> None:
        """Its replica taken out of rotation (a frozen engine): the stream fails now, not when
        the engine's next piece is overdue."""
        self.resp.fail(ReplicaDown(WHY_DOWN))

    async def _chunks(self) -> AsyncGenerator[bytes, None]:
        relay, status = self._relay, 499  # until it ends well: the client went away
        outage = self.one.outage
        outage.cuts.add(self._cut)
        if outage.out:
            self._cut()
        if self._send is not None:
            self.resp.sink = self._pass
        try:
            while piece := await self.resp.next():
                if out := self._feed(piece):
                    yield out
            if last := relay.end():
                yield last
            status = 200
        except FAILED as exc:
            status = 502
            err = UpstreamFailed(f"The replica failed mid-answer: {exc}")
            yield b"event: error\ndata: " + msgspec.json.encode(err.body()) + b"\n\n"
        finally:  # also when the client went away: its slot and its concurrency count are freed now
            self.resp.sink = None
            outage.cuts.discard(self._cut)
            self._end(status, relay.usage, self._first, relay.chunks)

    def _end(self, status: int, usage: Usage, first: float | None, relayed: int) -> None:
        """The stream ended with `status`; billed what its engine said it used or, where it never
        said (cut before its usage chunk), what was relayed (`cut_usage`)."""
        if self.one.ended:
            return
        self.resp.release()  # read to its end: its connection goes back to the pool; else closed
        if not usage.total:
            usage = cut_usage(self.one.prepared, relayed)
        served = msgspec.structs.replace(self.one.tried, status=status, usage=usage, first_token=first)
        self.one.end(ok={200: True, 502: False}.get(status), served=served)
