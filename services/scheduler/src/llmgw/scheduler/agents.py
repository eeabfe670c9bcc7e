"""Asking agents to start and stop replicas and workers.

Every ask runs in a task of its own, so an agent that does not answer holds up only what waits
for it (never another node's heartbeat, never a start elsewhere); what came of it goes back to
the inbox as an item, for the applier to record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine

import msgspec
from nats.aio.client import Client

from llmgw.bus import BusError, Signer, call, spawn
from llmgw.proto import Model, Profile, ReplicaReport, ReplicaStart, ReplicaState, ReplicaStop, WorkerStart, agent
from llmgw.scheduler.core import AgentStop, Stop, spec_of
from llmgw.scheduler.inbox import Inbox, Stopped, WorkersUp

__all__ = ["Agents"]


class Agents:
    """The scheduler's side of the agent contract (`llmgw.proto.agent`)."""

    def __init__(self, nc: Client, inbox: Inbox, log, signer: Signer | None = None) -> None:
        self.nc, self.inbox, self.log = nc, inbox, log
        self.signer = signer
        """Signs every ask (an agent acts only on the scheduler's signature); None without credentials."""
        self.tasks: set[asyncio.Task] = set()
        """Asks in flight (drains in their grace among them)."""
        self.asking: set[AgentStop] = set()
        """Stops in flight that nothing recorded waits for: each asked once at a time."""

    def cancel(self) -> None:
        """Drop every ask in flight (a drain cut short is finished by the next leader)."""
        for task in self.tasks:
            task.cancel()

    def _spawn(self, work: Coroutine) -> asyncio.Task:
        """An ask in its own task; one that failed is logged (nothing else would say so)."""
        return spawn(self.tasks, work, self.log, "asking an agent", event="asking an agent failed")

    def stop(self, ask: AgentStop) -> None:
        """Ask an agent to stop an engine or a worker, unless that is being asked already."""
        if ask in self.asking:
            return
        self.log.warning("asking an agent to stop", node=ask.node, replica=ask.id, worker=ask.worker, why=ask.reason)
        self.asking.add(ask)
        self._spawn(self._stop(ask)).add_done_callback(lambda _: self.asking.discard(ask))

    async def _stop(self, ask: AgentStop) -> None:
        endpoint = agent.WORKER_STOP if ask.worker else agent.REPLICA_STOP
        await self._ask(endpoint, ReplicaStop(id=ask.id, reason=ask.reason), ask.node)

    async def _ask(self, endpoint, message, node: str) -> object | None:
        """An agent's answer, or None when it could not be had, for whatever reason (logged)."""
        try:
            return await call(self.nc, endpoint, message, node=node, signer=self.signer)
        except Exception as exc:
            self.log.warning("agent did not answer", subject=endpoint.subject(node), error=_why(exc))
            return None

    def retire(self, stop: Stop) -> asyncio.Task:
        """After the stop's grace (in-flight requests finish), stop a replica's engine, then its
        workers; its record goes however that went."""
        return self._spawn(self._retire(stop))

    async def _retire(self, stop: Stop) -> None:
        r = stop.replica
        try:
            if stop.grace_s:
                await asyncio.sleep(stop.grace_s)
            asked = ReplicaStop(id=r.id, reason=stop.reason)
            if stop.reachable:
                await self._ask(agent.REPLICA_STOP, asked, r.node)
            for w in r.workers:  # after the engine that drives them
                await self._ask(agent.WORKER_STOP, asked, w.node)
        finally:  # never left draining; an engine its agent did not stop is stopped at its next heartbeat
            self.inbox.put(Stopped(replica=r, reason=stop.reason))

    def start(self, r: ReplicaState, model: Model, profile: Profile, after: list[asyncio.Task]) -> asyncio.Task:
        """Start a replica's workers (across nodes), then its engine, told where they listen;
        once the stops in `after` are done (they free the room it takes)."""
        return self._spawn(self._start(r, model, profile, after))

    async def _start(self, r: ReplicaState, model: Model, profile: Profile, after: list[asyncio.Task]) -> None:
        if after:
            await asyncio.wait(after)
        spec = spec_of(r)
        try:
            if spec.workers:
                asked = WorkerStart(replica=spec, model=model, profile=profile)
                workers = [
                    await call(
                        self.nc,
                        agent.WORKER_START,
                        asked,
                        node=w.node,
                        timeout=profile.startup_timeout_s,
                        signer=self.signer,
                    )
                    for w in spec.workers
                ]
                spec = msgspec.structs.replace(spec, workers=workers)
                self.inbox.put(WorkersUp(id=spec.id, workers=workers))
            report = await call(
                self.nc,
                agent.REPLICA_START,
                ReplicaStart(replica=spec, model=model, profile=profile),
                node=spec.node,
                signer=self.signer,
            )
        except Exception as exc:  # refused, unanswered, or the ask itself broke: never left pending
            report = ReplicaReport(
                id=r.id,
                model=r.model,
                profile=r.profile,
                node=r.node,
                state="failed",
                error=f"agent refused: {exc.message}" if isinstance(exc, BusError) else f"not started: {_why(exc)}",
                updated=time.time(),
            )
        self.inbox.put(report)


def _why(exc: Exception) -> str:
    """What went wrong asking: an agent's (or the bus's) message, else the exception itself."""
    return exc.message if isinstance(exc, BusError) else f"{type(exc).__name__}: {exc}"
