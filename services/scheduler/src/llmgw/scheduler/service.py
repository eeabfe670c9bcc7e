"""The scheduler: inventory from heartbeats, the catalog watched, reconcile applied every tick."""

from __future__ import annotations

import asyncio
import secrets
import sys
import time

import msgspec
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from llmgw.bus import BusConfig, BusError, Context, KvTable, kv_bucket, kv_keys, load_config, request, run
from llmgw.proto import (
    BUCKETS,
    CatalogRecord,
    Demand,
    Empty,
    FileInfo,
    FileRef,
    Heartbeat,
    ModelStatus,
    ModelStatusList,
    NodeInfo,
    NodeList,
    ReplicaList,
    ReplicaStart,
    ReplicaState,
    ReplicaStop,
    Subjects,
    Worker,
    WorkerStart,
)
from llmgw.scheduler.core import NodeView, Plan, Start, Stop, lost, lost_workers, reconcile, status

__all__ = ["Scheduler", "SchedulerConfig", "main"]


class SchedulerConfig(BusConfig, kw_only=True):
    """Scheduler settings."""

    tick_s: float = 1.0
    """Seconds between reconcile passes."""
    stale_s: float = 10.0
    """A node with no heartbeat for this long (suspect) gets no new replicas."""
    lease_s: float = 6.0
    """One scheduler leads: it renews a lease this long every third of it; a standby takes over
    when the lease lapses (the leader died) and adopts everything running."""
    drain_s: float = 5.0
    """A ready replica being stopped gets this long for its in-flight requests (the router sends
    it nothing new meanwhile) before its engine is stopped."""
    lost_s: float = 30.0
    """A node with no heartbeat for this long is lost: its replicas are replaced elsewhere."""
    reserve_mb: int = 512
    """Host memory left free on every node."""
    score_nodes: int = 100
    """At most this many nodes that fit are scored for each replica (the scan of a big fleet
    stops there, starting where the last one stopped); 0 scores every node."""


class Scheduler:
    """Decides where replicas run and keeps the replicas bucket (read by the router)."""

    name = "scheduler"
    version = "0.1.0"
    description = "inventory, placement, reconcile"

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.nodes: dict[str, NodeView] = {}
        self.catalog: KvTable[CatalogRecord] | None = None
        self.demand: KvTable[Demand] | None = None
        """When the router last saw each model asked for: on-demand models wake and idle by it."""
        self.replicas: dict[str, ReplicaState] = {}
        self.weights: dict[str, int] = {}
        self.unplaced: dict[str, str] = {}
        self.statuses: dict[str, ModelStatus] = {}
        self.draining: dict[str, ReplicaState] = {}
        self.held: dict[str, str] = {}
        """Models that gave room to a higher class, and to whom, until they run whole again."""
        self.drains: set[asyncio.Task] = set()
        """Replicas in their drain grace: still running, no longer recorded as live."""
        self.kv: KeyValue | None = None
        self.ctx: Context | None = None
        self.tasks: list[asyncio.Task] = []
        self.started = time.time()
        """When this scheduler began listening for nodes."""
        self.instance = secrets.token_hex(4)
        self.leader = False
        self.lease: KeyValue | None = None
        self.lease_revision = 0

    async def start(self, ctx: Context) -> None:
        self.ctx = ctx
        self.kv = await kv_bucket(ctx.js, BUCKETS["replicas"])
        self.lease = await kv_bucket(ctx.js, BUCKETS["leader"], ttl=self.config.lease_s)
        self.status_kv = await kv_bucket(ctx.js, BUCKETS["status"])
        self.catalog = await KvTable.open(ctx.js, BUCKETS["catalog"], CatalogRecord, history=5)
        self.demand = await KvTable.open(ctx.js, BUCKETS["demand"], Demand)
        await ctx.endpoint("node-register", Subjects.SCHEDULER_NODE_REGISTER, NodeInfo, self.register)
        await ctx.endpoint("replica-list", Subjects.SCHEDULER_REPLICA_LIST, Empty, self.list_replicas)
        await ctx.endpoint("node-list", Subjects.SCHEDULER_NODE_LIST, Empty, self.list_nodes)
        await ctx.endpoint("model-status", Subjects.SCHEDULER_MODEL_STATUS, Empty, self.model_status)
        await ctx.nc.subscribe(Subjects.EVT_HEARTBEAT_ALL, cb=self._on_heartbeat)
        await ctx.nc.subscribe(Subjects.EVT_REPLICA_ALL, cb=self._on_replica_event)
        self.tasks.append(asyncio.create_task(self._lead()))
        self.tasks.append(asyncio.create_task(self._loop()))

    async def stop(self) -> None:
        for t in [*self.tasks, *self.drains]:  # a drain cut short is finished by the next leader
            t.cancel()
        if self.leader:  # hand over at once rather than when the lease lapses
            try:
                await self.lease.delete("scheduler", last=self.lease_revision)
            except Exception as exc:
                self.ctx.log.warning("lease not released", error=str(exc))
        for table in (self.catalog, self.demand):
            if table:
                table.stop()

    def ready(self) -> bool:
        return all(t is not None and t.synced for t in (self.catalog, self.demand))

    async def register(self, info: NodeInfo) -> Empty:
        self.nodes[info.node] = NodeView(info=info, last_seen=time.time())
        self.ctx.log.info("node registered", node=info.node, cpus=info.cpus, memory_mb=info.memory_total_mb)
        return Empty()

    async def list_replicas(self, _: Empty) -> ReplicaList:
        replicas = (
            [*self.replicas.values(), *self.draining.values()] if self.leader else (await self._stored()).values()
        )
        return ReplicaList(replicas=sorted(replicas, key=lambda r: (r.model, r.id)))

    async def _stored(self) -> dict[str, ReplicaState]:
        """The replicas bucket as it is: what a new leader adopts."""
        out = {}
        for key in await kv_keys(self.kv):
            try:
                out[key] = msgspec.json.decode((await self.kv.get(key)).value, type=ReplicaState)
            except (KeyNotFoundError, KeyDeletedError, msgspec.DecodeError):
                continue
        return out

    async def _lead(self) -> None:
        """Hold the lease while leading; take it (and adopt what runs) when it lapses."""
        while True:
            try:
                if self.leader:
                    self.lease_revision = await self.lease.update(
                        "scheduler", self.instance.encode(), last=self.lease_revision
                    )
                else:
                    self.lease_revision = await self.lease.create("scheduler", self.instance.encode())
                    self.replicas = await self._stored()  # adopted: nothing is started twice
                    self.started = time.time()
                    self.leader = True
                    self.ctx.log.info("leading", instance=self.instance, adopted=len(self.replicas))
            except KeyWrongLastSequenceError:
                if self.leader:
                    self.ctx.log.warning("lease lost to another scheduler", instance=self.instance)
                self.leader = False
            except Exception as exc:  # NATS away: keep trying; another may lead meanwhile
                self.ctx.log.warning("lease not renewed", error=str(exc))
            await asyncio.sleep(self.config.lease_s / 3)

    async def model_status(self, _: Empty) -> ModelStatusList:
        statuses = self.statuses if self.leader else {}
        if not self.leader:  # a standby answers from what the leader keeps
            for key in await kv_keys(self.status_kv):
                try:
                    statuses[key] = msgspec.json.decode((await self.status_kv.get(key)).value, type=ModelStatus)
                except (KeyNotFoundError, KeyDeletedError, msgspec.DecodeError):
                    continue
        return ModelStatusList(models=sorted(statuses.values(), key=lambda m: m.model))

    async def list_nodes(self, _: Empty) -> NodeList:
        return NodeList(
            nodes=[v.info for _, v in sorted(self.nodes.items())],
            last_seen={n: v.last_seen for n, v in self.nodes.items()},
        )

    async def _on_heartbeat(self, msg) -> None:
        try:
            beat = msgspec.json.decode(msg.data, type=Heartbeat)
        except msgspec.DecodeError as exc:
            self.ctx.log.warning("bad heartbeat ignored", subject=msg.subject, error=str(exc))
            return
        if not self.leader:  # a standby keeps the inventory; the leader acts
            self.nodes[beat.info.node] = NodeView(info=beat.info, last_seen=time.time(), weights=beat.weights)
            return
        if beat.info.node not in self.nodes:  # a scheduler restarted (or a standby) learns nodes from heartbeats too
            self.ctx.log.info("node known from its heartbeat", node=beat.info.node)
        self.nodes[beat.info.node] = NodeView(info=beat.info, last_seen=time.time(), weights=beat.weights)
        for state in beat.replicas:  # events can be missed; the heartbeat is the agent's whole truth
            if (
                state.id not in self.replicas
                and state.id not in self.draining
                and state.state in ("fetching", "starting", "ready")
            ):
                # Given up while its node was lost and replaced since: stopped, never run twice.
                self.ctx.log.warning("stopping a replica no longer recorded", replica=state.id, node=state.node)
                try:
                    await request(
                        self.ctx.nc,
                        Subjects.agent_replica_stop(state.node),
                        ReplicaStop(id=state.id, reason="replaced while its node was lost"),
                        ReplicaState,
                    )
                except BusError as exc:
                    self.ctx.log.warning("stop not delivered", replica=state.id, error=exc.message)
                continue
            await self._record(state)
        for gone in lost(beat.info.node, {r.id for r in beat.replicas}, list(self.replicas.values())):
            self.replicas.pop(gone.id, None)
            await self.kv.delete(gone.id)
            self.ctx.log.warning(
                "replica lost: its agent no longer runs it", replica=gone.id, model=gone.model, node=gone.node
            )
        node = beat.info.node
        for rid in set(beat.workers) - set(self.replicas) - set(self.draining):
            self.ctx.log.warning("stopping a worker no longer recorded", replica=rid, node=node)
            await self._ask(Subjects.agent_worker_stop(node), ReplicaStop(id=rid, reason="its replica is gone"), Empty)
        for broken in lost_workers(node, set(beat.workers), list(self.replicas.values())):
            why = f"its worker on node '{node}' is gone"
            await self._record(msgspec.structs.replace(broken, state="failed", updated=time.time(), error=why))
            await self._ask(
                Subjects.agent_replica_stop(broken.node), ReplicaStop(id=broken.id, reason=why), ReplicaState
            )

    async def _on_replica_event(self, msg) -> None:
        try:
            await self._record(msgspec.json.decode(msg.data, type=ReplicaState))
        except msgspec.DecodeError as exc:
            self.ctx.log.warning("bad replica event ignored", subject=msg.subject, error=str(exc))

    async def _record(self, state: ReplicaState) -> None:
        if not self.leader:
            return
        known = self.replicas.get(state.id)
        if known is None or state.state == "stopped" or known.state == "failed":
            return  # not ours (or gone, or failed: replaced, never revived): the reconcile loop decides
        if (known.state, known.url, known.error) == (state.state, state.url, state.error):
            return
        state = msgspec.structs.replace(
            state,
            api_key=known.api_key,
            memory_mb=known.memory_mb,
            failures=known.failures,
            fingerprint=known.fingerprint,
            cores=known.cores,
            gpus=known.gpus,
            workers=known.workers,
        )
        self.replicas[state.id] = state
        await self.kv.put(state.id, msgspec.json.encode(state))
        self.ctx.log.info("replica state", replica=state.id, model=state.model, state=state.state, error=state.error)

    async def _loop(self) -> None:
        while True:
            try:  # a request for a sleeping model wakes it now, not at the next tick
                await asyncio.wait_for(self.demand.changed.wait(), self.config.tick_s)
                self.demand.changed.clear()
            except TimeoutError:
                pass
            if not (self.leader and self.ready()):
                continue
            try:
                await self._tick()
            except Exception:
                self.ctx.log.exception("reconcile pass failed")

    async def _tick(self) -> None:
        models = {name: record.model for name, record in self.catalog.items.items()}
        for model in models.values():
            if model.source not in self.weights:
                try:
                    info = await request(self.ctx.nc, Subjects.MIRROR_FILE_STAT, FileRef(source=model.source), FileInfo)
                    self.weights[model.source] = info.size
                except BusError as exc:
                    self.unplaced[model.name] = exc.message
        ids = (f"{secrets.token_hex(4)}" for _ in iter(int, 1))
        demand = {name: d.last_asked for name, d in self.demand.items.items()}
        plan = reconcile(
            models,
            self.nodes,
            list(self.replicas.values()),
            self.weights,
            time.time(),
            ids,
            self.config.stale_s,
            self.config.reserve_mb,
            lost_s=self.config.lost_s,
            known_since=self.started,
            demand=demand,
            score_nodes=self.config.score_nodes,
        )
        await self._apply(plan)
        now = time.time()
        self.held.update(plan.held)
        statuses = {
            n: status(m, list(self.replicas.values()), plan, now, self.held.get(n, ""), demand.get(n))
            for n, m in models.items()
        }
        for name, st in statuses.items():
            if st.state in ("running", "stopped"):
                self.held.pop(name, None)
        for name, st in statuses.items():
            if self.statuses.get(name) != st:
                await self.status_kv.put(name, msgspec.json.encode(st))
        for name in set(self.statuses) - set(statuses):
            await self.status_kv.delete(name)
        self.statuses = statuses

    async def _ask(self, subject: str, message, answer: type):
        """An agent's answer, or None when it could not be had (logged)."""
        try:
            return await request(self.ctx.nc, subject, message, answer)
        except BusError as exc:
            self.ctx.log.warning("agent did not answer", subject=subject, error=exc.message)
            return None

    async def _stop_after(self, stop: Stop, grace_s: float) -> None:
        r = stop.replica
        await asyncio.sleep(grace_s)
        asked = ReplicaStop(id=r.id, reason=stop.reason)
        if stop.reachable:
            await self._ask(Subjects.agent_replica_stop(r.node), asked, ReplicaState)
        for w in r.workers:  # after the engine that drives them
            await self._ask(Subjects.agent_worker_stop(w.node), asked, Empty)
        await self.kv.delete(r.id)
        self.draining.pop(r.id, None)
        self.ctx.log.info("replica stopped", replica=r.id, model=r.model, reason=stop.reason)

    async def _apply(self, plan: Plan) -> None:
        for name, why in plan.unplaced.items():
            if self.unplaced.get(name) != why:
                self.ctx.log.warning("model not placed", model=name, why=why)
        self.unplaced = plan.unplaced
        for stop in plan.stops:
            # Draining first, so the router sends it nothing new; the record goes once the engine stopped.
            r = stop.replica
            self.replicas.pop(r.id, None)
            await self.kv.put(
                r.id, msgspec.json.encode(msgspec.structs.replace(r, state="draining", updated=time.time()))
            )
            if stop.drain and stop.reachable and r.state == "ready" and self.config.drain_s > 0:
                # in-flight requests finish within the grace, then it stops
                self.draining[r.id] = msgspec.structs.replace(r, state="draining", updated=time.time())
                task = asyncio.create_task(self._stop_after(stop, self.config.drain_s))
                self.drains.add(task)
                task.add_done_callback(self.drains.discard)
            else:
                await self._stop_after(stop, 0)
        for start in plan.starts:
            await self._start(start)

    async def _start(self, start: Start) -> None:
        """Record the replica, start its workers (across nodes) and then its engine, which is
        given where the workers listen."""
        r = msgspec.structs.replace(start.replica, api_key=secrets.token_urlsafe(24))
        self.replicas[r.id] = r
        await self.kv.put(r.id, msgspec.json.encode(r))
        self.ctx.log.info(
            "replica placed",
            replica=r.id,
            model=r.model,
            node=r.node,
            memory_mb=r.memory_mb,
            workers=[w.node for w in r.workers],
        )
        try:
            workers, asked = [], WorkerStart(replica=r, model=start.model, profile=start.profile)
            for w in r.workers:
                workers.append(
                    await request(
                        self.ctx.nc,
                        Subjects.agent_worker_start(w.node),
                        asked,
                        Worker,
                        timeout=start.profile.startup_timeout_s,
                    )
                )
            if workers:
                r = msgspec.structs.replace(r, workers=workers)
                self.replicas[r.id] = r
                await self.kv.put(r.id, msgspec.json.encode(r))
            await request(
                self.ctx.nc,
                Subjects.agent_replica_start(r.node),
                ReplicaStart(replica=r, model=start.model, profile=start.profile),
                ReplicaState,
            )
        except BusError as exc:
            await self._record(
                msgspec.structs.replace(r, state="failed", error=f"agent refused: {exc.message}", updated=time.time())
            )


def main(argv: list[str] | None = None) -> int:
    """Run the scheduler."""
    config = load_config(SchedulerConfig, argv)
    return run(Scheduler(config), config)


if __name__ == "__main__":
    sys.exit(main())
