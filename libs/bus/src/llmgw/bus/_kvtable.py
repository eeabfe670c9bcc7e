"""A KV bucket kept in memory by watching it: what readers of another service's bucket use."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

import msgspec
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from llmgw.bus._nats import kv_bucket
from llmgw.bus._observe import get_logger

__all__ = ["KvTable"]

T = TypeVar("T")
D = TypeVar("D")


class KvTable(Generic[T]):
    """`items` follows the bucket (puts, deletes, purges); `synced` once the initial values are in.

    A value that does not decode as `kind` is logged and left out; the watch carries on.
    """

    def __init__(self, kv: KeyValue, bucket: str, kind: type[T]) -> None:
        self.kv, self.bucket, self.kind = kv, bucket, kind
        self.items: dict[str, T] = {}
        self.synced = False
        self.version = 0
        """Counts changes: a reader caching something derived from `items` compares it."""
        self.changed = asyncio.Event()
        """Set on every change after the initial values; whoever waits on it clears it."""
        self._task: asyncio.Task | None = None
        self._derived: dict[Callable, tuple[int, object]] = {}

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str, kind: type[T], history: int = 1) -> KvTable[T]:
        """Open (or create) `bucket` and start watching it in the background."""
        table = cls(await kv_bucket(js, bucket, history), bucket, kind)
        table._task = asyncio.create_task(table._watch())
        return table

    def derived(self, build: Callable[[dict[str, T]], D]) -> D:
        """`build(items)`, worked out again only when the bucket changed since the last call
        with the same `build` (an index a reader looks up on every request)."""
        version, value = self._derived.get(build, (-1, None))
        if version != self.version:
            value = build(self.items)
            self._derived[build] = (self.version, value)
        return value

    def stop(self) -> None:
        """Stop watching."""
        if self._task:
            self._task.cancel()

    async def _watch(self) -> None:
        log = get_logger("llmgw.bus.kv")
        async for entry in await self.kv.watchall():
            if entry is None:
                self.synced = True
            elif entry.operation in ("DEL", "PURGE") or not entry.value:
                self.items.pop(entry.key, None)
            else:
                try:
                    self.items[entry.key] = msgspec.json.decode(entry.value, type=self.kind)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    log.warning("undecodable KV value left out", bucket=self.bucket, key=entry.key, error=str(exc))
            self.version += 1
            if entry is not None and self.synced:
                self.changed.set()
