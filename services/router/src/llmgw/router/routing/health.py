"""Engines' health, as only they can tell it: every ready replica's /health probed a few seconds
apart on the router's own loop, and at once where a request on it failed. A probe that fails
(no answer in time, a refused connection, anything but 200) takes the replica out of rotation
(`Balancer.eject`) and tells the requests waiting on it (`down`), so they are retried elsewhere
or fail fast; one that answers brings it back. A failed request alone never takes one out."""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Callable

import aiohttp

from llmgw.bus import get_logger, spawn
from llmgw.proto import ReplicaState
from llmgw.router.config import RouterConfig
from llmgw.router.errors import described
from llmgw.router.routing.balance import Balancer
from llmgw.router.routing.directory import Directory

__all__ = ["WHY_DOWN", "Health", "Outage", "ReplicaDown", "unless_out"]

WHY_DOWN = "its engine stopped answering its health probe"


class ReplicaDown(Exception):
    """The replica a request waits on was taken out of rotation (its health probe failed)."""


class Outage:
    """Whether a replica is out of rotation, and what to cut when it goes out: the requests and
    streams waiting on it register a callback here (no task of their own per request)."""

    __slots__ = ("cuts", "out")

    def __init__(self) -> None:
        self.out = False
        self.cuts: set[Callable[[], None]] = set()

    def go_out(self) -> None:
        """Out of rotation: everything waiting on it is cut now."""
        self.out = True
        for cut in list(self.cuts):
            cut()

    def come_back(self) -> None:
        """Back in rotation."""
        self.out = False


class unless_out:  # lower case: used as `async with unless_out(outage):`, like asyncio.timeout
    """Within it, the task waits on a replica: ReplicaDown at once where it is out, or as soon as
    it goes out (the task's wait is cancelled, as asyncio.timeout does it, and the cancellation
    turned into ReplicaDown; one from elsewhere, the client leaving say, stays a cancellation)."""

    __slots__ = ("cut", "outage", "task")

    def __init__(self, outage: Outage) -> None:
        self.outage, self.cut = outage, False
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> None:
        if self.outage.out:
            raise ReplicaDown(WHY_DOWN)
        self.task = asyncio.current_task()
        self.outage.cuts.add(self._cut)

    def _cut(self) -> None:
        if not self.cut and self.task is not None:
            self.cut = True
            self.task.cancel()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.outage.cuts.discard(self._cut)
        if self.cut and self.task is not None and self.task.uncancel() == 0 and kind is asyncio.CancelledError:
            raise ReplicaDown(WHY_DOWN) from None


class Health:
    """Probes engines and keeps the balancer told which replicas are out. Also the limits on how
    long an engine may stay silent in a stream: `first_byte_s` (before its first byte, and
    between any two after it)."""

    def __init__(
        self, directory: Directory, balancer: Balancer, client: aiohttp.ClientSession, config: RouterConfig
    ) -> None:
        self.directory, self.balancer, self.client = directory, balancer, client
        self.every_s = config.health_every_s
        self.probe_timeout = aiohttp.ClientTimeout(total=config.health_timeout_s)
        self.first_byte_s = config.first_byte_timeout_s
        self.outages: dict[str, Outage] = {}
        """Replica -> whether it is out of rotation, and who waits on it."""
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

    def outage(self, replica_id: str) -> Outage:
        """Whether this replica is out of rotation (its requests stop waiting on it then). What is
        not a replica of the fleet (an outside provider) is never taken out here."""
        if (outage := self.outages.get(replica_id)) is None:
            outage = Outage()
            if replica_id in self.directory.replicas.items:
                self.outages[replica_id] = outage
        return outage

    def doubted(self, replica_id: str) -> bool:
        """Whether this replica is out of rotation, or being probed (it failed a request)."""
        return replica_id in self.probing or self.outage(replica_id).out

    def suspect(self, replica_id: str) -> None:
        """A request on this replica failed: probe it now (unless a probe of it is under way)."""
        replica = self.directory.replicas.items.get(replica_id)
        if replica is not None and replica.url:
            self._probe_soon(replica)

    async def _every(self) -> None:
        while True:
            ready = {r.id: r for r in self.directory.replicas.items.values() if r.state == "ready" and r.url}
            for gone in set(self.outages) - set(ready):
                self.outages.pop(gone).go_out()  # whoever still waits on it stops
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
            if _out_of_descriptors(exc):  # the router's own trouble, not the engine's: it stays in
                self.log.error(
                    "the router is out of file descriptors: a health probe could not be sent", replica=replica.id
                )
                return
            why = described(exc) if not isinstance(exc, TimeoutError) else "no answer to /health in time"
        rid, now = replica.id, time.time()
        if not why:
            if rid in self.balancer.strikes:
                self.log.info("replica back in rotation: its engine answers its health probe", replica=rid)
            self.balancer.healthy(rid)
            self.outage(rid).come_back()
            return
        first = rid not in self.balancer.strikes
        until = self.balancer.eject(rid, now)
        self.outage(rid).go_out()
        if first:
            self.log.warning(
                "replica out of rotation: its engine failed its health probe",
                replica=rid,
                why=why,
                probed_again_in_s=self.every_s,
                out_for_s=round(until - now, 1),
            )


def _out_of_descriptors(exc: BaseException | None) -> bool:
    """Whether `exc` (or what caused it) is this process running out of file descriptors."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return True
        exc = exc.__cause__ or getattr(exc, "os_error", None)
    return False
