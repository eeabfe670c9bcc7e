"""A JetStream stream read back in order, from a sequence or a time (the usage stream, by
`usage.py`), through pull consumers that acknowledge nothing (`AckPolicy.NONE`): one that waits
for acknowledgements stops at NATS's `max_ack_pending` (1,000 messages), which is how usage
reports once ended there. Pulls are asked for by hand, not with nats-py's `fetch`, which costs a
task and a timer a message (three times slower here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

__all__ = ["PULL", "StreamMessage", "StreamReader"]

PULL = 2000
"""Messages asked for in one pull."""
_PULL_BYTES = 16 * 1024 * 1024
"""Most bytes in one pull (a usage message is at most ~100 KB)."""

StreamMessage = tuple[int, float, bytes]
"""A stream message: its sequence, when the stream kept it (Unix time), its data."""


class StreamReader:
    """A stream's messages in order, from a sequence or a time, through an ephemeral pull consumer
    that acknowledges nothing (so no `max_ack_pending` ends it)."""

    def __init__(self, nc: Client, js: JetStreamContext, stream: str) -> None:
        self.nc, self.js, self.stream = nc, js, stream
        self.consumer = ""
        self._sub: Subscription | None = None
        self._held: list[StreamMessage] = []
        """Messages read by `peek`, given by the next `pull`."""
        self._inbox = ""
        self._pulls = 0
        """Pulls asked for; the n-th is answered on `<inbox>.<n>`, so the note that ends one pull
        (NATS's `409 Batch Completed` after a pull filled exactly) is never taken for the next's.
        (Messages come under their own subjects; a pull's are all in before the next is asked.)"""
        self._got: list[Msg] = []
        self._want = 0
        self._ended = asyncio.Event()
        self._status = ""

    async def open(self, seq: int = 1, since: float | None = None) -> StreamReader:
        """Start at sequence `seq`, or at the first message kept at or after time `since`."""
        if since is None:
            config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(seq, 1))
        else:
            config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=_rfc3339(since))
        config.ack_policy = AckPolicy.NONE
        config.inactive_threshold = 60.0
        config.mem_storage = True
        self.consumer = (await self.js.add_consumer(self.stream, config)).name
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(
            f"{self._inbox}.*", cb=self._take, pending_msgs_limit=4 * PULL, pending_bytes_limit=4 * _PULL_BYTES
        )
        return self

    async def _take(self, msg: Msg) -> None:
        if not msg.data and msg.headers and "Status" in msg.headers:
            if msg.subject != f"{self._inbox}.{self._pulls}":
                return  # the note that ends an earlier pull, already ended
            status, why = msg.headers["Status"], msg.headers.get("Description", "")
            done = status == "408" or (status == "404" and why == "No Messages")  # no more there now
            self._status = "" if done else f"{status} {why}".strip()
            self._ended.set()
            return
        self._got.append(msg)
        if len(self._got) >= self._want:
            self._ended.set()

    async def peek(self) -> StreamMessage | None:
        """The next message, left to be given again by the next `pull`; None at the end."""
        if not self._held:
            self._held = await self.pull(1)
        return self._held[0] if self._held else None

    async def pull(self, batch: int = PULL, timeout: float = 10.0) -> list[StreamMessage]:
        """The next messages there are now, up to `batch` ([] at the end)."""
        if self._held:
            held, self._held = self._held, []
            return held
        assert self._sub is not None, "StreamReader.pull before open"
        self._got, self._want, self._status = [], batch, ""
        self._pulls += 1
        self._ended.clear()
        ask = {
            "batch": batch,
            "no_wait": True,
            "max_bytes": _PULL_BYTES,
        }  # no `expires`: with it, an empty pull waits it out
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}"
        await self.nc.publish(subject, json.dumps(ask).encode(), reply=f"{self._inbox}.{self._pulls}")
        try:
            await asyncio.wait_for(self._ended.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"stream {self.stream}: no answer to a pull within {timeout:g} s; is NATS up?") from None
        if self._status and not self._got:
            why = f"stream {self.stream}: a pull was answered with status {self._status} (its consumer gone?)"
            raise ConnectionError(why)
        got, self._got = self._got, []
        return [_message(m) for m in got]

    async def close(self) -> None:
        """Drop the consumer and the subscription."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        if self.consumer:
            with contextlib.suppress(Exception):
                await self.js.delete_consumer(self.stream, self.consumer)
            self.consumer = ""


def _rfc3339(t: float) -> str:
    """Unix time `t` as JetStream's start times are written (not before 1970)."""
    t = max(t, 0.0)
    whole = int(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((t - whole) * 1e9):09d}Z"


def _message(msg: Msg) -> StreamMessage:
    """Sequence and time from the reply subject: `$JS.ACK.<stream>.<consumer>.<delivered>.<seq>.
    <consumer seq>.<ns>.<pending>`, or with a domain and account hash and a trailing token."""
    tokens = msg.reply.split(".")
    seq, ns = (tokens[5], tokens[7]) if len(tokens) == 9 else (tokens[7], tokens[9])
    return int(seq), int(ns) / 1e9, msg.data
