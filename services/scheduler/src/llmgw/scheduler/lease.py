"""One scheduler leads: it holds a lease in a KV bucket whose values expire, renewed every third
of its life; a standby takes it when it lapses (the leader died)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

__all__ = ["Lease"]

KEY = "scheduler"


class Lease:
    """The lease, held while `revision` is set."""

    def __init__(self, kv: KeyValue, instance: str, lease_s: float, log) -> None:
        self.kv, self.instance, self.lease_s, self.log = kv, instance, lease_s, log
        self.revision = 0
        """The lease's revision while this scheduler holds it; 0: it does not."""

    async def keep(self, taken: Callable[[], Awaitable[None]], lost: Callable[[], None]) -> None:
        """Hold the lease while holding it, take it when it lapses; `taken` when it was taken,
        `lost` when another scheduler holds it now. Runs until cancelled."""
        while True:
            try:
                if self.revision:
                    self.revision = await self.kv.update(KEY, self.instance.encode(), last=self.revision)
                else:
                    self.revision = await self.kv.create(KEY, self.instance.encode())
                    await self._take(taken)
            except KeyWrongLastSequenceError:
                if self.revision:
                    self.log.warning("lease lost to another scheduler", instance=self.instance)
                    lost()
                self.revision = 0
            except Exception as exc:  # NATS away: keep trying; another may lead meanwhile
                self.log.warning("lease not renewed", error=str(exc))
            await asyncio.sleep(self.lease_s / 3)

    async def _take(self, taken: Callable[[], Awaitable[None]]) -> None:
        try:
            await taken()
        except Exception:  # not leading after all: let another (or the next try) lead
            self.log.exception("lease taken but not led; released")
            await self.release()

    async def release(self) -> None:
        """Hand the lease over at once rather than when it lapses."""
        if not self.revision:
            return
        try:
            await self.kv.delete(KEY, last=self.revision)
        except Exception as exc:
            self.log.warning("lease not released", error=str(exc))
        self.revision = 0
