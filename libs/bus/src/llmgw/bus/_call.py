"""Typed requests over NATS: one endpoint's reply (a list's pages followed and joined), every
instance's replies, and raw requests that wait out a service just starting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError, TimeoutError
from opentelemetry import trace

from llmgw.bus._observe import inject
from llmgw.bus._signing import Signer
from llmgw.proto import Endpoint, Page, decode_json
from llmgw.proto.errors import BusError, Internal, from_code

__all__ = ["NO_RESPONDERS_S", "PAGE_LIMIT", "call", "call_all", "request_raw"]

T = TypeVar("T")
Req = TypeVar("Req")
Rep = TypeVar("Rep")
_tracer = trace.get_tracer("llmgw.bus")


NO_RESPONDERS_S = 1.0
"""How long a request is sent again while nobody answers: a service that just subscribed may not
be heard yet (interest reaches a cluster's other servers a moment later; seen on one busy server
too), and one restarting is back within it. Then it is an error."""


async def request_raw(
    nc: Client, subject: str, data: bytes, timeout: float = 10.0, headers: dict[str, str] | None = None
) -> Msg:
    """The reply message to raw `data` on `subject` (its headers unread: a service error is in
    them), sent again while nobody answers, NO_RESPONDERS_S at most. Where a test or tool must
    send bytes no Struct would encode, this is the request to use, not `nc.request`. `headers`
    go with it (a signature's), beside the trace's."""
    deadline = time.monotonic() + min(NO_RESPONDERS_S, timeout)
    pause = 0.05
    while True:
        try:
            return await nc.request(subject, data, timeout=timeout, headers=inject(headers))
        except NoRespondersError:
            if time.monotonic() + pause > deadline:
                raise
            await asyncio.sleep(pause)
            pause *= 2


async def _request(
    nc: Client,
    subject: str,
    message: msgspec.Struct,
    reply: type[T],
    timeout: float = 10.0,
    signer: Signer | None = None,
) -> T:
    """Send `message` (signed by `signer`, when given), decode the reply as `reply`; a service
    error raises the matching BusError."""
    data = msgspec.json.encode(message)
    signed = signer.headers(subject, data, time.time()) if signer else None
    with _tracer.start_as_current_span(f"request {subject}", kind=trace.SpanKind.CLIENT):
        try:
            msg = await request_raw(nc, subject, data, timeout, signed)
        except NoRespondersError:
            raise Internal(f"nobody answers on {subject}: is that service running?") from None
        except TimeoutError:
            raise Internal(f"no reply on {subject} within {timeout}s") from None
    headers = msg.headers or {}
    if "Nats-Service-Error-Code" in headers:
        raise from_code(headers["Nats-Service-Error-Code"], headers.get("Nats-Service-Error", ""))
    try:
        return decode_json(msg.data, type=reply)
    except msgspec.DecodeError as exc:
        raise Internal(f"reply on {subject} is not a {reply.__name__}: {exc}") from None


PAGE_LIMIT = 5000
"""The most entries `call` asks for in one page of a list (the service sends fewer where they
would not fit in one message)."""


async def call(
    nc: Client,
    endpoint: Endpoint[Req, Rep],
    message: Req,
    node: str = "",
    timeout: float | None = None,
    signer: Signer | None = None,
) -> Rep:
    """Ask `endpoint` (of `node`, for per-node endpoints; for one that speaks for a node, the node
    its message names unless given) and get its reply, typed as the endpoint says, within its
    `timeout_s` (unless `timeout` says otherwise); a service error raises the matching BusError.
    `signer` signs it (an endpoint `signed_by` its role).

    A list endpoint (one that takes a `Page`, or a request that is one: `UsageQuery`) asked for
    the whole list (`limit` 0, or `Empty()` as before pages) is asked a page at a time
    (`PAGE_LIMIT`), following each reply's `next`, and the pages are joined into one reply; a
    `limit` asks for that one page."""
    if endpoint.speaks_for and not node:
        node = getattr(message, endpoint.speaks_for)
    subject = endpoint.subject(node)
    timeout = endpoint.timeout_s if timeout is None else timeout
    paged = isinstance(endpoint.request, type) and issubclass(endpoint.request, Page)
    if not paged or (isinstance(message, Page) and message.limit):
        return await _request(nc, subject, message, endpoint.reply, timeout, signer)
    first = message if isinstance(message, Page) else Page()
    whole, after, seen = None, "", set()
    while True:
        ask = msgspec.structs.replace(first, after=after, limit=PAGE_LIMIT)
        page = await _request(nc, subject, ask, endpoint.reply, timeout, signer)
        whole = page if whole is None else _joined(whole, page)
        if not page.next:
            return whole
        if page.next in seen:
            raise Internal(
                f"{subject}: the page after {after!r} named one already given as next; is it an llmgw reply?"
            )
        seen.add(after := page.next)


def _joined(first: T, then: T) -> T:
    """Two pages of a list reply as one: lists end to end, dicts merged, the rest (and `next`) as
    the later page says."""
    joined = {}
    for name in first.__struct_fields__:
        a, b = getattr(first, name), getattr(then, name)
        joined[name] = a + b if isinstance(a, list) else {**a, **b} if isinstance(a, dict) else b
    return msgspec.structs.replace(first, **joined)


async def call_all(
    nc: Client,
    endpoint: Endpoint[Req, Rep],
    message: Req,
    window_s: float = 1.0,
    until: Callable[[Rep], bool] | None = None,
) -> list[Rep | BusError]:
    """Ask every instance serving `endpoint` (every agent, say) and collect what answered within
    `window_s` (or up to the first reply `until` accepts); an error reply is in the list as a
    BusError."""
    return await _gather(nc, endpoint.subject(), message, endpoint.reply, window_s, until)


async def _gather(
    nc: Client,
    subject: str,
    message: msgspec.Struct,
    reply: type[T],
    window_s: float = 1.0,
    until: Callable[[T], bool] | None = None,
) -> list[T | BusError]:
    """Send `message` to every service instance on `subject`; what answered within `window_s`,
    or up to and with the first reply `until` accepts.

    For requests that each instance answers for itself (every agent, say). A reply that is an
    error, or does not decode as `reply`, is in the list as a BusError.
    """
    answers: list[T | BusError] = []
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        with _tracer.start_as_current_span(f"gather {subject}", kind=trace.SpanKind.CLIENT):
            await nc.publish(subject, msgspec.json.encode(message), reply=inbox, headers=inject())
        deadline = time.monotonic() + window_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except TimeoutError:
                break
            headers = msg.headers or {}
            if headers.get("Status") == "503":  # the server's word that nobody listens
                break
            if "Nats-Service-Error-Code" in headers:
                answers.append(from_code(headers["Nats-Service-Error-Code"], headers.get("Nats-Service-Error", "")))
                continue
            try:
                answers.append(decode_json(msg.data, type=reply))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                answers.append(Internal(f"reply on {subject} is not a {reply.__name__}: {exc}"))
            if until is not None and not isinstance(answers[-1], BusError) and until(answers[-1]):
                break
    finally:
        await sub.unsubscribe()
    return answers
