"""What the applier takes in turn, and the queue it comes on.

NATS callbacks and the tasks that ask agents never change a record themselves: they put what
they heard here, and one task applies it. A heartbeat and a reconcile pass keep only their
latest (a heartbeat is its node's whole truth; a pass reads the catalog when it runs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import msgspec

from llmgw.modelplan import Shape
from llmgw.proto import Heartbeat, ReplicaReport, ReplicaState, Worker
from llmgw.scheduler.core import Desired

__all__ = ["Adopt", "Inbox", "Item", "Pass", "Stopped", "WorkersUp"]


class Pass(msgspec.Struct, kw_only=True):
    """Reconcile now, against this catalog and these files."""

    desired: Desired
    weights: dict[str, int]
    shapes: dict[str, Shape] = msgspec.field(default_factory=dict)
    traces: dict[str, str] = msgspec.field(default_factory=dict)
    """Model -> the traceparent of its latest change, where that was traced lately: the
    replicas this pass starts for it join that trace."""


class WorkersUp(msgspec.Struct, kw_only=True):
    """A replica's workers listen: where (their endpoints), before its engine is started."""

    id: str
    workers: list[Worker]


class Stopped(msgspec.Struct, kw_only=True):
    """The agents stopped a replica (or were asked to and did not answer): its record goes."""

    replica: ReplicaState
    reason: str


class Adopt(msgspec.Struct, kw_only=True):
    """This scheduler took the lease: lead, with what the replicas bucket held."""

    replicas: dict[str, ReplicaState]
    since: float
    deaf_s: float = 0.0
    """The scheduler's deaf time then (`Hearing.deaf_s`)."""


Item = Heartbeat | ReplicaReport | WorkersUp | Stopped | Pass | Adopt


class Inbox:
    """A FIFO queue of items, where an item put under a key replaces one still waiting under it."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[Hashable | None, Item | None]] = asyncio.Queue()
        self._latest: dict[Hashable, Item] = {}

    def put(self, item: Item) -> None:
        """Queue an item."""
        self._queue.put_nowait((None, item))

    def put_latest(self, key: Hashable, item: Item) -> None:
        """Queue an item, or replace the one still waiting under `key` (keeping its place)."""
        if key not in self._latest:
            self._queue.put_nowait((key, None))
        self._latest[key] = item

    async def get(self) -> Item:
        """The next item, waiting for one."""
        key, item = await self._queue.get()
        return self._latest.pop(key) if key is not None else item
