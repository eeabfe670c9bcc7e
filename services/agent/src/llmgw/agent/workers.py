"""llama.cpp RPC workers this node runs for replicas led from another node: each holds its cards
(or CPU threads) for the engine there, and is dropped when it exits (the scheduler then
replaces the replica it was part of)."""

from __future__ import annotations

import asyncio
import functools
import os

import msgspec

from llmgw.agent.core import what_it_said, worker_launch
from llmgw.agent.node import NodeFacts
from llmgw.agent.room import Room
from llmgw.agent.supervisor import Child, ChildSpec, StartFailed, Supervisor
from llmgw.bus import BadRequest, Conflict, Context, Internal
from llmgw.proto import Empty, ReplicaStop, Worker, WorkerStart

__all__ = ["Workers"]

WORKER_START_S = 60.0
"""The longest a worker has to listen (a profile's startup_timeout_s, if shorter)."""


class Workers:
    """The RPC workers of this node, by replica id."""

    def __init__(self, facts: NodeFacts, supervisor: Supervisor, room: Room) -> None:
        self.facts, self.supervisor, self.room = facts, supervisor, room
        self.starts: dict[str, asyncio.Task[str]] = {}
        """Each worker's start, which ends in the host:port it listens on."""
        self._ctx: Context | None = None

    def bind(self, ctx: Context) -> None:
        """Log over `ctx` from now."""
        self._ctx = ctx

    def ids(self) -> list[str]:
        """The replicas whose workers run (or start) here."""
        return sorted(self.starts)

    async def start(self, req: WorkerStart) -> Worker:
        """Start this node's worker of a replica across nodes (once, however often asked);
        answer once it listens, with where."""
        rid, node = req.replica.id, self.facts.node
        mine = next((w for w in req.replica.workers if w.node == node), None)
        if mine is None:
            raise BadRequest(
                f"replica {rid} has no worker on node '{node}' "
                f"(its workers: {', '.join(w.node for w in req.replica.workers) or 'none'})"
            )
        if rid not in self.starts:
            rpc = self.facts.llamacpp
            if req.profile.engine != "llamacpp" or not rpc.has_rpc():
                raise BadRequest(
                    f"replica {rid}: node '{node}' has no llama.cpp RPC worker at {rpc.rpc_server} "
                    "(llama.cpp built with -DGGML_RPC=ON provides ggml-rpc-server, or llama-rpc-server in nixpkgs)"
                )
            self.starts[rid] = asyncio.create_task(self._start(req, mine))
        starting = self.starts[rid]
        try:
            endpoint = await asyncio.shield(starting)
        except asyncio.CancelledError:
            if starting.cancelled():  # a stop came while it started
                raise Conflict(f"the worker of replica {rid} on {node} was stopped while it started") from None
            raise
        return msgspec.structs.replace(mine, endpoint=endpoint)

    async def _start(self, req: WorkerStart, mine: Worker) -> str:
        rid, name, address = req.replica.id, f"{req.replica.id}.worker", self.facts.config.address
        log = self._ctx.log.bind(replica=rid, model=req.model.name)
        try:
            cards = self.room.take_cards(name, mine.gpus, req.profile)
            port = self.room.take_port(name)
            how = worker_launch(
                self.facts.llamacpp.rpc_server,
                address,
                port,
                req.profile,
                os.cpu_count() or 1,
                cards,
                allowed=self.facts.config.engine_args_allowed,
            )
            log.info("starting worker", command=how.argv, cards=self.room.cards[name])
            spec = ChildSpec(
                name=name,
                launch=how,
                up=functools.partial(self._listening, address, port),
                timeout_s=min(req.profile.startup_timeout_s, WORKER_START_S),
                what="it",
                on_exit=functools.partial(self._exited, rid),
                note={"replica": rid, "model": req.replica.model},
            )
            await self.supervisor.start(spec)
        except Exception as exc:
            self._drop(rid)
            said = exc.tail if isinstance(exc, StartFailed) else []
            why = what_it_said(f"the worker of replica {rid} on {self.facts.node} did not start: {exc}", said)
            raise Internal(why) from None
        endpoint = f"{address}:{port}"
        log.info("worker ready", endpoint=endpoint)
        return endpoint

    async def stop(self, req: ReplicaStop) -> Empty:
        """Stop this node's worker of a replica, if one runs."""
        starting = self.starts.get(req.id)
        if starting is not None:
            self._ctx.log.info("stopping worker", replica=req.id, reason=req.reason)
            if not starting.done():  # still starting: cancelled, the supervisor ends what it began
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
            await self.supervisor.stop(f"{req.id}.worker")
            self._drop(req.id)
        return Empty()

    async def stop_all(self) -> None:
        """Stop every worker here."""
        await asyncio.gather(*(self.stop(ReplicaStop(id=rid, reason="agent stopping")) for rid in self.ids()))

    @staticmethod
    async def _listening(host: str, port: int) -> bool:
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            return False
        writer.close()
        return True

    async def _exited(self, rid: str, child: Child, code: int) -> None:
        self._ctx.log.warning("worker exited", replica=rid, status=code, tail=list(child.tail)[-5:])
        self._drop(rid)

    def _drop(self, rid: str) -> None:
        self.starts.pop(rid, None)
        self.room.release(f"{rid}.worker")
