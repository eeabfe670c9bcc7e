"""The OpenAI routes under /v1, answered straight on ASGI ahead of the Litestar app (which gets
every other path: the admin API, the console, /schema). The hot path has no framework in it: a
request's body read, handed to the `Gateway`, and its answer written, every error in OpenAI's
body; a stream is cut as soon as its client goes away."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Awaitable, Callable

import msgspec

from llmgw.bus import get_logger
from llmgw.router.errors import ApiError, BodyTooLarge, HttpError, Internal
from llmgw.router.metrics import Metrics
from llmgw.router.request.gateway import Gateway
from llmgw.router.request.relay import Answer, Relay

__all__ = ["OPENAI_ROUTES", "REQUEST_HEADERS", "OpenAIEndpoint", "request_id", "response_head"]

_RUN = os.urandom(8).hex()
"""This router process's random half of its request ids."""
_COUNT = itertools.count()


def request_id() -> str:
    """A new id for a request that came without one (32 hex digits): this process's random half
    and a count, unique without a system call per request as `os.urandom` makes."""
    return f"{_RUN}{next(_COUNT):016x}"


OPENAI_ROUTES = {
    "/v1/chat/completions": ("POST", "OpenAI's chat completions, streamed or not."),
    "/v1/completions": ("POST", "OpenAI's (legacy) completions, streamed or not."),
    "/v1/embeddings": ("POST", "OpenAI's embeddings (the replica's engine must serve them)."),
    "/v1/models": ("GET", "The models (and aliases) this key may use."),
}
"""The routes answered here: path -> (method, what it answers)."""
_ROUTES = {path: method for path, (method, _) in OPENAI_ROUTES.items()}
REQUEST_HEADERS = {b"authorization", b"content-length", b"content-type", b"x-request-id"}
"""The request headers the gateway reads."""
_REJECTED = (400, 413, 429)
"""Statuses counted as refusals before any engine (by their code)."""

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class OpenAIEndpoint:
    """An ASGI app: the OpenAI routes answered by `gateway`, anything else passed to `app`."""

    def __init__(self, gateway: Gateway, metrics: Metrics, max_body_bytes: int, app: ASGIApp) -> None:
        self.gateway, self.metrics, self.most, self.app = gateway, metrics, max_body_bytes, app
        self.log = get_logger("router")

    async def __call__(self, scope: dict, receive, send) -> None:
        """One ASGI request: the gateway's where it is an OpenAI route, else the app's."""
        path = scope.get("path")
        method = _ROUTES.get(path) if scope["type"] == "http" else None
        if method is None:
            await self.app(scope, receive, send)
            return
        wanted = REQUEST_HEADERS
        headers = {name.decode(): value.decode("latin-1") for name, value in scope["headers"] if name in wanted}
        rid = headers.get("x-request-id") or request_id()
        answer = await self.respond(scope["method"], path, headers, lambda: self._body(receive), rid)
        if isinstance(answer, Relay):
            await self._stream(answer, rid, receive, send)
        else:
            head = [*response_head(answer, rid), (b"content-length", str(len(answer.body)).encode())]
            await send({"type": "http.response.start", "status": answer.status, "headers": head})
            await send({"type": "http.response.body", "body": answer.body})

    async def respond(
        self, method: str, path: str, headers: dict[str, str], read: Callable[[], Awaitable[bytes]], rid: str
    ) -> Answer | Relay:
        """The answer to `method` on the OpenAI route `path` with these (lower-case) `headers`,
        its body from `read`, known by `rid`: a refusal or failure is an `Answer` in OpenAI's
        error body."""
        want = _ROUTES[path]
        try:
            if method != want:
                wrong = HttpError(405, f"{path} takes {want} only.")
                wrong.headers["allow"] = want
                raise wrong
            if method == "GET":
                return Answer(200, msgspec.json.encode(self.gateway.models(headers.get("authorization", ""))))
            return await self.gateway.handle(path, headers, read, rid)
        except ApiError as exc:
            return self.refused(exc)
        except Exception as exc:  # a bug: logged whole, the client told it was ours
            self.log.exception("request failed inside the router", path=path)
            why = f"The router failed on this request ({type(exc).__name__}); its log has the details."
            return self.refused(Internal(why))

    def refused(self, exc: ApiError) -> Answer:
        """A refusal's answer (counted where it is one before any engine: 400, 413, 429)."""
        if exc.status in _REJECTED:
            self.metrics.rejected(exc.code or str(exc.status))
        return Answer(exc.status, msgspec.json.encode(exc.body()), exc.headers)

    async def _body(self, receive) -> bytes:
        """The request's body, up to `max_body_bytes` (413 past it, whatever its length said)."""
        pieces, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise asyncio.CancelledError  # the client went away before its body came whole
            piece = message.get("body", b"")
            size += len(piece)
            if size > self.most:
                raise BodyTooLarge(f"The request body is over {self.most} bytes, the most this router takes.")
            pieces.append(piece)
            if not message.get("more_body"):
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _stream(self, relay: Relay, rid: str, receive, send) -> None:
        """The relay written as it comes; the client going away (the one message left to receive)
        cancels it where it waits, and it ends as 499."""
        task, state = asyncio.current_task(), {"sent": False, "gone": False}

        def gone(heard: asyncio.Future) -> None:
            if not heard.cancelled() and not state["sent"]:
                state["gone"] = True
                task.cancel()

        listening = asyncio.ensure_future(receive())
        listening.add_done_callback(gone)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": response_head(relay, rid)})
            async for piece in relay.chunks:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            state["sent"] = True
            await send({"type": "http.response.body", "body": b""})
        except asyncio.CancelledError:
            if not state["gone"] or task.uncancel() > 0:
                raise
        finally:
            state["sent"] = True
            listening.cancel()
            await relay.close()


def response_head(answer: Answer | Relay, rid: str) -> list[tuple[bytes, bytes]]:
    """An answer's response headers: JSON unless it says otherwise, and its request id."""
    head = [(name.encode(), value.encode("latin-1")) for name, value in answer.headers.items()]
    if "content-type" not in answer.headers:
        head.append((b"content-type", b"application/json"))
    head.append((b"x-request-id", rid.encode()))
    return head
