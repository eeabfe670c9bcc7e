"""A KV bucket kept in memory by watching it: what readers of another service's bucket use."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import msgspec
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from llmgw.bus._nats import kv_bucket
from llmgw.bus._observe import get_logger
from llmgw.proto.errors import described

__all__ = ["KvTable", "any_change"]

T = TypeVar("T")
D = TypeVar("D")

RESTART_S = (0.5, 1.0, 2.0, 5.0)
"""Waits before a watch that ended is started again (the last one repeats)."""


class KvTable(Generic[T]):
    """`items` follows the bucket (puts, deletes, purges); `synced` once the initial values are in.

    A value that cannot be read as `kind` (not JSON, the wrong shape, nested too deep) is logged,
    and its key left out; the watch carries on. A watch that ends (its consumer lost, a failure)
    is started again: `items` keeps the last values it knew meanwhile, `synced` is False (the
    table is stale) until the new watch's initial values are in, and then they replace it whole.
    """

    def __init__(self, kv: KeyValue, bucket: str, kind: type[T]) -> None:
        self.kv, self.bucket, self.kind = kv, bucket, kind
        self.items: dict[str, T] = {}
        self.synced = False
        self.version = 0
        """Counts changes: a reader caching something derived from `items` compares it."""
        self._next: asyncio.Future | None = None
        """Resolved when the initial values are in and at every change after, for all who wait on
        it (`any_change`)."""
        self.restarts = 0
        """Watches started again after one ended."""
        self._task: asyncio.Task | None = None
        self._watcher: KeyValue.KeyWatcher | None = None
        self._derived: dict[Callable, tuple[int, object]] = {}
        self._touched: set[str] | None = None
        """The keys changed since `take_touched` was last called (None: not asked for yet, or
        the values were replaced whole since)."""
        self._log = get_logger("llmgw.bus.kv")

    @classmethod
    async def open(
        cls, js: JetStreamContext, bucket: str, kind: type[T], history: int = 1, ttl: float | None = None
    ) -> KvTable[T]:
        """Open (or create: its values expiring after `ttl` s, if given) `bucket` and start
        watching it in the background."""
        table = cls(await kv_bucket(js, bucket, history, ttl), bucket, kind)
        table._task = asyncio.create_task(table._follow())
        return table

    @property
    def stale(self) -> bool:
        """Whether `items` may be behind the bucket (its initial values, or a restarted watch's,
        not yet in)."""
        return not self.synced

    def derived(self, build: Callable[[dict[str, T]], D]) -> D:
        """`build(items)`, worked out again only when the bucket changed since the last call
        with the same `build` (an index a reader looks up on every request)."""
        version, value = self._derived.get(build, (-1, None))
        if version != self.version:
            value = build(self.items)
            self._derived[build] = (self.version, value)
        return value

    def take_touched(self) -> set[str] | None:
        """The keys put, deleted or purged since the last call, for a reader that follows the
        changes one by one (an index of many values) rather than reading `items` again at each;
        None: read them all (the first call, or a watch started again replaced them whole)."""
        touched, self._touched = self._touched, set()
        return touched

    def touch(self, keys: Iterable[str]) -> None:
        """Keys whose values were changed in `items` here, outside the watch (a delete seen at
        once), for `take_touched`."""
        if self._touched is not None:
            self._touched.update(keys)

    def _next_change(self) -> asyncio.Future:
        """The future the bucket's next change resolves (its initial values in, or a change after
        them), shared by all who wait for it through `any_change`: its `asyncio.wait` never
        cancels it, so one that stops waiting leaves it to the others (awaited directly under a
        timeout, it would be cancelled for all)."""
        if self._next is None or self._next.done():
            self._next = asyncio.get_running_loop().create_future()
        return self._next

    def _changed(self) -> None:
        if self._next is not None and not self._next.done():
            self._next.set_result(None)

    def stop(self) -> None:
        """Stop watching."""
        if self._task:
            self._task.cancel()

    async def _follow(self) -> None:
        """Watch, and watch again whenever a watch ends, for as long as the table is open."""
        failures = 0
        while True:
            try:
                await self._watch()
                why = "the watch ended"
            except Exception as exc:  # whatever ended it, the table must not stop following
                why = described(exc)
            self.synced = False
            wait = RESTART_S[min(failures, len(RESTART_S) - 1)]
            failures += 1
            self._log.warning("KV watch ended; watching again", bucket=self.bucket, why=why, after_s=wait)
            await asyncio.sleep(wait)
            self.restarts += 1

    async def _watch(self) -> None:
        fresh: dict[str, T] | None = {}
        """The values a (re)started watch delivers before its end-of-initial-values marker."""
        self._watcher = await self.kv.watchall()
        _stop_idle_flow_control_task(self._watcher)
        async for entry in self._watcher:
            if entry is not None:
                self._apply(self.items if fresh is None else fresh, entry)
            else:  # the initial values are in (a first watch's or a new one's): a change too
                if fresh is not None:
                    self.items, fresh, self._touched = fresh, None, None
                self.synced = True
            self.version += 1
            if self.synced:
                self._changed()

    def _apply(self, items: dict[str, T], entry: KeyValue.Entry) -> None:
        """One entry of the bucket into `items`: kept where it reads as `kind`, else left out."""
        if self._touched is not None and items is self.items:
            self._touched.add(entry.key)
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            items.pop(entry.key, None)
            return
        try:
            items[entry.key] = msgspec.json.decode(entry.value, type=self.kind)
        except (msgspec.DecodeError, RecursionError, ValueError, TypeError) as exc:
            items.pop(entry.key, None)
            error = "JSON nested too deep to read" if isinstance(exc, RecursionError) else str(exc)[:200]
            self._log.warning("undecodable KV value skipped", bucket=self.bucket, key=entry.key, error=error)


def _stop_idle_flow_control_task(watcher: KeyValue.KeyWatcher) -> None:
    """nats-py gives a watch (an ordered consumer) a task that wakes four times a second, for as
    long as the watch lasts, to send flow-control answers it put off: with a table for each bucket,
    most of what an idle router did. A watch hands its entries to a callback, and for those nats-py
    counts a message delivered as it arrives, so it answers every ask at once and never puts one
    off: the task never has anything to send. It is stopped (where nats-py's insides are as this
    expects; else left)."""
    pushed = getattr(watcher, "_sub", None)  # the watch's JetStream subscription, and its core one's state
    core = getattr(pushed, "_sub", None)
    task = getattr(getattr(core, "_jsi", None), "_fctask", None)
    if task is not None and getattr(core, "_cb", None) is not None:
        task.cancel()


async def any_change(tables: list[KvTable], seen: int, timeout: float | None = None) -> None:
    """Until the sum of `tables`' versions is other than `seen` (at once where it is already), or
    `timeout` s have passed: what a loop that follows buckets waits on, instead of looking at
    their versions every so often."""
    if sum(table.version for table in tables) == seen:
        changes = [table._next_change() for table in tables]
        await asyncio.wait(changes, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
