"""The records the leading scheduler keeps: every replica (in memory and in the replicas bucket,
which the router and `ctl` read) and every model's status (in the status bucket)."""

from __future__ import annotations

from typing import TypeVar

import msgspec
from nats.js.kv import KeyValue

from llmgw.bus import kv_scan
from llmgw.proto import ModelStatus, ReplicaState

__all__ = ["Book"]

T = TypeVar("T")


async def _read(kv: KeyValue, kind: type[T]) -> dict[str, T]:
    """A bucket as it is, key by key; what does not decode is left out."""
    return {key: value for key, (value, _) in (await kv_scan(kv, kind)).items()}


class Book:
    """Replicas recorded (live, pending, failed), those being stopped, and model statuses.

    Only the applier's task changes it; each change is written through to its bucket.
    """

    def __init__(self, replicas_kv: KeyValue, status_kv: KeyValue) -> None:
        self.kv, self.status_kv = replicas_kv, status_kv
        self.replicas: dict[str, ReplicaState] = {}
        """Recorded replicas, not being stopped: what a reconcile pass counts."""
        self.draining: dict[str, ReplicaState] = {}
        """Replicas being stopped: recorded as draining until their agents stopped them."""
        self.statuses: dict[str, ModelStatus] = {}
        self.held: dict[str, str] = {}
        """Models that gave room to a higher class, and to whom, until they run whole again."""

    async def stored(self) -> dict[str, ReplicaState]:
        """The replicas bucket as it is: what a new leader adopts and a standby lists."""
        return await _read(self.kv, ReplicaState)

    async def stored_statuses(self) -> dict[str, ModelStatus]:
        """The status bucket as the leader left it: what a standby answers with."""
        return await _read(self.status_kv, ModelStatus)

    def adopt(self, stored: dict[str, ReplicaState]) -> None:
        """Take over what the bucket holds (a new leader): nothing is started twice."""
        self.replicas, self.draining = dict(stored), {}

    def listing(self) -> list[ReplicaState]:
        """Every replica recorded, those being stopped too."""
        return [*self.replicas.values(), *self.draining.values()]

    async def record(self, state: ReplicaState) -> None:
        """Write a replica's record."""
        self.replicas[state.id] = state
        await self.kv.put(state.id, msgspec.json.encode(state))

    async def forget(self, state: ReplicaState) -> None:
        """Drop a record whose replica no longer runs anywhere."""
        self.replicas.pop(state.id, None)
        await self.kv.delete(state.id)

    async def drain(self, state: ReplicaState, now: float) -> None:
        """Record a replica as being stopped: the router sends it nothing new."""
        self.replicas.pop(state.id, None)
        draining = msgspec.structs.replace(state, state="draining", updated=now)
        self.draining[state.id] = draining
        await self.kv.put(state.id, msgspec.json.encode(draining))

    async def stopped(self, state: ReplicaState) -> None:
        """Its agents stopped it: the record goes."""
        self.draining.pop(state.id, None)
        await self.kv.delete(state.id)

    async def publish(self, statuses: dict[str, ModelStatus], held: dict[str, str]) -> None:
        """Write the statuses that changed and drop those of models gone."""
        for name, st in statuses.items():
            if self.statuses.get(name) != st:
                await self.status_kv.put(name, msgspec.json.encode(st))
        for name in set(self.statuses) - set(statuses):
            await self.status_kv.delete(name)
        self.statuses, self.held = statuses, held
