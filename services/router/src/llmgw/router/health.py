"""Engines' health, as only they can tell it: every ready replica's /health probed a few seconds
apart on the router's own loop, and at once where a request on it failed. A probe that fails
(no answer in time, a refused connection, anything but 200) takes the replica out of rotation
(`Balancer.eject`) and tells the requests waiting on it (`down`), so they are retried elsewhere
or fail fast; one that answers brings it back. A failed request alone never takes one out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import aiohttp

from llmgw.bus import get_logger, spawn
from llmgw.proto import ReplicaState
from llmgw.router.balance import Balancer
from llmgw.router.config import RouterConfig
from llmgw.router.directory import Directory
from llmgw.router.errors import described

__all__ = ["Health", "ReplicaDown", "unless_down"]

T = TypeVar("T")


class ReplicaDown(Exception):
    """The replica a request waits on was taken out of rotation (its health probe failed)."""


async def unless_down(work: Awaitable[T], down: asyncio.Event) -> T:
    """`work`'s result; ReplicaDown (and `work` cancelled) where `down` is set first."""
    if down.is_set():
        raise ReplicaDown("its engine stopped answering its health probe")
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(down.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise ReplicaDown("its engine stopped answering its health probe")


class Health:
    """Probes engines and keeps the balancer told which replicas are out. Also the limits on how
    long an engine may take: `stream_timeout` (a stream's first byte, and each after it)."""

    def __init__(
        self, directory: Directory, balancer: Balancer, client: aiohttp.ClientSession, config: RouterConfig
    ) -> None:
        self.directory, self.balancer, self.client = directory, balancer, client
        self.every_s = config.health_every_s
        self.probe_timeout = aiohttp.ClientTimeout(total=config.health_timeout_s)
        self.stream_timeout = aiohttp.ClientTimeout(
            total=config.upstream_timeout_s, connect=3.0, sock_read=config.first_byte_timeout_s
        )
        self.downs: dict[str, asyncio.Event] = {}
        """Replica -> set while it is out of rotation."""
        self.probing: dict[str, asyncio.Task] = {}
        self.tasks: set[asyncio.Task] = set()
        self.log = get_logger("router")

    def start(self) -> None:
        """Probe every ready replica, every `health_every_s`."""
        spawn(self.tasks, self._every(), self.log, "probing engines' health")

    def stop(self) -> None:
        """Stop probing."""
        for task in [*self.tasks, *self.probing.values()]:
            task.cancel()

    def down(self, replica_id: str) -> asyncio.Event:
        """Set while this replica is out of rotation (its requests stop waiting on it)."""
        return self.downs.setdefault(replica_id, asyncio.Event())

    def suspect(self, replica_id: str) -> None:
        """A request on this replica failed: probe it now (unless a probe of it is under way)."""
        replica = self.directory.replicas.items.get(replica_id)
        if replica is not None and replica.url:
            self._probe_soon(replica)

    async def _every(self) -> None:
        while True:
            ready = {r.id: r for r in self.directory.replicas.items.values() if r.state == "ready" and r.url}
            for gone in set(self.downs) - set(ready):
                self.downs.pop(gone).set()  # whoever still waits on it stops
            for replica in ready.values():
                self._probe_soon(replica)
            await asyncio.sleep(self.every_s)

    def _probe_soon(self, replica: ReplicaState) -> None:
        if replica.id not in self.probing:
            self.probing[replica.id] = task = asyncio.create_task(self._probe(replica))
            task.add_done_callback(lambda _: self.probing.pop(replica.id, None))

    async def _probe(self, replica: ReplicaState) -> None:
        """One probe of the engine's /health, and what it says done."""
        try:
            async with self.client.get(replica.url + "/health", timeout=self.probe_timeout) as resp:
                why = "" if resp.status == 200 else f"/health answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = described(exc) if not isinstance(exc, TimeoutError) else "no answer to /health in time"
        rid, now = replica.id, time.time()
        if not why:
            if rid in self.balancer.strikes:
                self.log.info("replica back in rotation: its engine answers its health probe", replica=rid)
            self.balancer.healthy(rid)
            self.down(rid).clear()
            return
        first = rid not in self.balancer.strikes
        until = self.balancer.eject(rid, now)
        self.down(rid).set()
        if first:
            self.log.warning(
                "replica out of rotation: its engine failed its health probe",
                replica=rid,
                why=why,
                probed_again_in_s=self.every_s,
                out_for_s=round(until - now, 1),
            )
