"""The scheduler's shell: it wires the inventory, the lease, the inbox and the applier to NATS,
and decides nothing (the pure core, `core` and `placement`, does).

NATS callbacks only decode, note the node in the inventory and queue what they heard; one task
(the applier) applies it; agents are asked in tasks of their own. A reconcile pass runs every
tick, and at once when the catalog or the router's demand changes or room frees up.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from collections.abc import Iterable
from typing import Annotated

import msgspec

from llmgw.bus import (
    ADMIN_PORTS,
    BusConfig,
    BusError,
    Context,
    KvTable,
    ScrapeCollector,
    Signer,
    any_change,
    call,
    entry_point,
    kv_bucket,
)
from llmgw.modelplan import Shape
from llmgw.proto import (
    BUCKETS,
    CatalogRecord,
    Demand,
    Empty,
    FileRef,
    Heartbeat,
    Model,
    ModelStatusList,
    NodeInfo,
    NodeList,
    Page,
    ReplicaList,
    ReplicaReport,
    ReplicaState,
    agent,
    mirror,
    page_of,
)
from llmgw.proto import scheduler as scheduler_api
from llmgw.proto.errors import NotFound
from llmgw.proto.scheduler import ModelRoom, RoomAsk
from llmgw.scheduler.agents import Agents
from llmgw.scheduler.applier import Applier
from llmgw.scheduler.book import Book
from llmgw.scheduler.core import Actual, Desired, Hearing, NodeView, Policy, health, heard, listen, room_left
from llmgw.scheduler.gauges import fleet_series
from llmgw.scheduler.inbox import Adopt, Inbox, Pass
from llmgw.scheduler.lease import Lease

__all__ = ["Scheduler", "SchedulerConfig", "main"]


_POLICY = Policy()
TRACED_CHANGE_S = 600.0
"""How long after a traced change of a model the replicas started for it join its trace."""
"""The reconcile knobs' defaults (each in one place: `Policy`)."""


class SchedulerConfig(BusConfig, kw_only=True):
    """Scheduler settings; those of a reconcile pass are `Policy`'s (documented there)."""

    admin_port: int = ADMIN_PORTS["scheduler"]

    tick_s: float = 1.0
    """Seconds between reconcile passes (a change of the catalog or of demand does not wait)."""
    lease_s: float = 6.0
    """One scheduler leads: it renews a lease this long every third of it; a standby takes over
    when the lease lapses (the leader died) and adopts everything running."""
    stale_s: float = _POLICY.stale_s
    """`Policy.stale_s`: a node silent this long gets no new replicas."""
    lost_s: float = _POLICY.lost_s
    """`Policy.lost_s`: a node silent this long is lost, its replicas replaced elsewhere."""
    drain_s: float = _POLICY.drain_s
    """`Policy.drain_s`: a ready replica being stopped gets this long for in-flight requests."""
    reserve_mb: int = _POLICY.reserve_mb
    """`Policy.reserve_mb`: host memory left free on every node."""
    score_nodes: Annotated[int, msgspec.Meta(ge=0)] = _POLICY.score_nodes
    """`Policy.score_nodes`: at most this many nodes that fit are scored for each replica (0: all)."""

    def policy(self) -> Policy:
        """The knobs a reconcile pass takes: this config's values of `Policy`'s fields."""
        return Policy(**{f: getattr(self, f) for f in Policy.__struct_fields__ if f in self.__struct_fields__})


class Scheduler:
    """Decides where replicas run and keeps the replicas bucket (read by the router)."""

    name = "scheduler"
    version = "0.1.0"
    description = "inventory, placement, reconcile"

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.signer = Signer.from_creds(config.creds) if config.creds else None
        """Signs what it asks agents (they act only on its signature); its NATS identity's nkey."""
        self.nodes: dict[str, NodeView] = {}
        """The inventory: every node as its last heartbeat (or registration) said."""
        self.hearing = Hearing()
        """The time this scheduler could not hear its nodes (a node's silence counts without it)."""
        self.inbox = Inbox()
        self.weights: dict[str, int] = {}
        """Source -> size, for the files the mirror confirmed."""
        self.shapes: dict[str, Shape] = {}
        """Source -> its model's shape, read once from the mirror's copy of its GGUF header."""
        self.unconfirmed: dict[str, str] = {}
        """Source -> what the mirror said last when it did not confirm it."""
        self._stating: set[str] = set()
        """Sources the mirror is being asked about now."""
        self._stats: set[asyncio.Task] = set()
        self.instance = secrets.token_hex(4)
        self.catalog: KvTable[CatalogRecord] | None = None
        self.demand: KvTable[Demand] | None = None
        """When the router last saw each model asked for: on-demand models wake and idle by it."""
        self.book: Book | None = None
        self.agents: Agents | None = None
        self.applier: Applier | None = None
        self.seen = -1
        """The catalog's and the demand's versions (summed) the last pass saw."""
        self.lease: Lease | None = None
        self.ctx: Context | None = None
        self._tasks: list[asyncio.Task] = []

    @property
    def leader(self) -> bool:
        """Whether this scheduler leads (holds the lease and adopted what runs)."""
        return self.applier is not None and self.applier.leading

    @property
    def tasks(self) -> list[asyncio.Task]:
        """Its background tasks, the asks to agents and the mirror in flight among them."""
        return [*self._tasks, *self._stats, *(self.agents.tasks if self.agents else ())]

    async def start(self, ctx: Context) -> None:
        """Open the buckets, serve the endpoints, listen to agents, start leading or standing by."""
        self.ctx, js, log = ctx, ctx.js, ctx.log
        self.book = Book(await kv_bucket(js, BUCKETS["replicas"]), await kv_bucket(js, BUCKETS["status"]))
        lease_kv = await kv_bucket(js, BUCKETS["leader"], ttl=self.config.lease_s)
        self.lease = Lease(lease_kv, self.instance, self.config.lease_s, log)
        self.catalog = await KvTable.open(js, BUCKETS["catalog"], CatalogRecord, history=5)
        self.demand = await KvTable.open(js, BUCKETS["demand"], Demand)
        self.agents = Agents(ctx.nc, self.inbox, log, self.signer)
        self.applier = Applier(self.book, self.agents, self.nodes, self.config.policy(), log, self._listen)
        ctx.metrics.register(
            ScrapeCollector(fleet_series(self.book, self.nodes, lambda: self.leader, self._node_states))
        )
        await ctx.serve(scheduler_api.NODE_REGISTER, self.register)
        await ctx.serve(scheduler_api.REPLICA_LIST, self.list_replicas)
        await ctx.serve(scheduler_api.NODE_LIST, self.list_nodes)
        await ctx.serve(scheduler_api.MODEL_STATUS, self.model_status)
        await ctx.serve(scheduler_api.MODEL_ROOM, self.model_room)
        await ctx.nc.subscribe(agent.HEARTBEAT.all, cb=self._on_heartbeat)
        await ctx.nc.subscribe(agent.REPLICA_CHANGED.all, cb=self._on_replica_event)
        self._tasks = [
            asyncio.create_task(self.applier.run(self.inbox)),
            asyncio.create_task(self.lease.keep(self._taken, self._lost)),
            asyncio.create_task(self._tick()),
        ]

    async def stop(self) -> None:
        """Stop every task, hand the lease over at once, stop watching the buckets."""
        for task in [*self._tasks, *self._stats]:
            task.cancel()
        if self.agents:
            self.agents.cancel()  # a drain cut short is finished by the next leader
        if self.lease:
            await self.lease.release()
        for table in (self.catalog, self.demand):
            if table:
                table.stop()

    def ready(self) -> bool:
        """Whether the catalog and the demand are read in."""
        return all(t is not None and t.synced for t in (self.catalog, self.demand))

    async def register(self, info: NodeInfo) -> Empty:
        """A node's agent introduces itself."""
        self._heard(info, [])
        self.ctx.log.info("node registered", node=info.node, cpus=info.cpus, memory_mb=info.memory_total_mb)
        return Empty()

    async def list_replicas(self, ask: Page) -> ReplicaList:
        """Every replica recorded (a standby: as the bucket holds them), by model and id; a page."""
        replicas = self.book.listing() if self.leader else list((await self.book.stored()).values())
        page, after = page_of(sorted(replicas, key=_by_model), ask, _by_model, "the replica list")
        return ReplicaList(replicas=page, next=after)

    async def model_status(self, ask: Page) -> ModelStatusList:
        """Every model's status (a standby answers from what the leader keeps), by model; a page."""
        statuses = self.book.statuses if self.leader else await self.book.stored_statuses()
        ordered = sorted(statuses.values(), key=lambda m: m.model)
        page, after = page_of(ordered, ask, lambda m: (m.model,), "the model status list")
        return ModelStatusList(models=page, next=after)

    async def model_room(self, ask: RoomAsk) -> ModelRoom:
        """How many more replicas of each of a model's profiles fit now (`room_left`), from the
        records as they are (a standby: as the bucket holds them)."""
        models = {name: record.model for name, record in self.catalog.items.items()}
        if ask.name not in models:
            raise NotFound(f"no model '{ask.name}' in the catalog; `llmgw ctl models` lists them")
        self._known_files(self.catalog.items.values())
        if self.leader:
            replicas, stopping = list(self.book.replicas.values()), list(self.book.draining.values())
        else:
            replicas, stopping = list((await self.book.stored()).values()), []
        actual = Actual(
            nodes=dict(self.nodes), replicas=replicas, stopping=stopping, weights=self.weights, shapes=self.shapes
        )
        # up to 128 placements a profile, each scoring the fleet: off the event loop that hears the nodes
        profiles = await asyncio.to_thread(
            room_left, models[ask.name], actual, models, time.time(), self.config.policy()
        )
        return ModelRoom(model=ask.name, profiles=profiles)

    def _node_states(self) -> dict[str, str]:
        """Each node's state now by the core's rule (ready, suspect, lost), for the gauges."""
        now = time.time()
        deaf_s, policy = self._listen(now).deaf_s, self.config.policy()
        return {name: health(view, now, deaf_s, policy).state for name, view in list(self.nodes.items())}

    async def list_nodes(self, ask: Page) -> NodeList:
        """Every node as last reported, and how each stands by the core's rule (`health`: its
        silence less the time this scheduler could not hear), by name; a page."""
        now = time.time()
        deaf_s, policy = self._listen(now).deaf_s, self.config.policy()
        page, after = page_of(
            [v.info for _, v in sorted(self.nodes.items())], ask, lambda i: (i.node,), "the node list"
        )
        return NodeList(
            nodes=page,
            health={i.node: health(self.nodes[i.node], now, deaf_s, policy) for i in page},
            stale_s=self.config.stale_s,
            lost_s=self.config.lost_s,
            next=after,
        )

    def _heard(self, info: NodeInfo, weights: list[str]) -> None:
        """Note a node in the inventory; a node not known before is room a pass should see now."""
        if info.node not in self.nodes:
            self.applier.wake.set()
        now = time.time()
        self.hearing = heard(self.hearing, now, self.config.stale_s)
        self.nodes[info.node] = NodeView(info=info, last_seen=now, weights=weights, deaf_s=self.hearing.deaf_s)

    def _listen(self, now: float) -> Hearing:
        """The time this scheduler could not hear its nodes, counted up to `now`: all the time
        it was away from NATS, and the time every node was silent past `stale_s`."""
        connected = self.ctx is not None and self.ctx.nc.is_connected
        self.hearing = listen(self.hearing, now, connected, self.config.stale_s)
        return self.hearing

    async def _on_heartbeat(self, msg) -> None:
        try:
            beat = msgspec.json.decode(msg.data, type=Heartbeat)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.ctx.log.warning("bad heartbeat ignored", subject=msg.subject, error=str(exc))
            return
        if not self._speaks_for(msg.subject, agent.HEARTBEAT, beat.info.node, *(r.node for r in beat.replicas)):
            return
        if beat.info.node not in self.nodes:  # a scheduler restarted (or a standby) learns nodes from heartbeats too
            self.ctx.log.info("node known from its heartbeat", node=beat.info.node)
        self._heard(beat.info, beat.weights)
        if self.leader:  # a standby keeps the inventory; the leader acts
            self.inbox.put_latest(("heartbeat", beat.info.node), beat)

    async def _on_replica_event(self, msg) -> None:
        try:
            report = msgspec.json.decode(msg.data, type=ReplicaReport)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.ctx.log.warning("bad replica event ignored", subject=msg.subject, error=str(exc))
            return
        if self.leader and self._speaks_for(msg.subject, agent.REPLICA_CHANGED, report.node):
            self.inbox.put(report)

    def _speaks_for(self, subject: str, event, *nodes: str) -> bool:
        """Whether what came on `subject` speaks only for the node the subject names (the server
        lets an agent publish only on its own node's subjects; its message must say the same)."""
        ids = event.parse(subject)
        if ids is None or any(n != ids[0] for n in nodes):
            self.ctx.log.warning("message for another node ignored", subject=subject, claims=sorted(set(nodes)))
            return False
        return True

    async def _taken(self) -> None:
        """The lease is ours: lead with what the replicas bucket holds."""
        now = time.time()
        self.inbox.put(Adopt(replicas=await self.book.stored(), since=now, deaf_s=self._listen(now).deaf_s))
        self.ctx.log.info("lease taken", instance=self.instance)

    def _lost(self) -> None:
        self.applier.leading = False

    async def _tick(self) -> None:
        """Queue a reconcile pass every tick, and at once when something a pass should see changed."""
        while True:
            await self._woken()
            self._listen(time.time())  # the time away from NATS is counted as it passes
            if not (self.leader and self.ready()):
                continue
            try:
                models = {name: record.model for name, record in self.catalog.items.items()}
                self._known_files(self.catalog.items.values())
                self._learn_weights(models)
                demand = {name: d.last_asked for name, d in self.demand.items.items()}
                recent = time.time() - TRACED_CHANGE_S
                traces = {n: r.trace for n, r in self.catalog.items.items() if r.trace and r.changed_at > recent}
                self.inbox.put_latest(
                    "pass",
                    Pass(
                        desired=Desired(models=models, demand=demand),
                        weights=dict(self.weights),
                        shapes=dict(self.shapes),
                        traces=traces,
                    ),
                )
            except Exception:
                self.ctx.log.exception("reconcile pass not queued")

    async def _woken(self) -> None:
        """Until the catalog or the demand changed since the last pass, the applier asks for a
        pass, or a tick passes."""
        tables = (self.catalog, self.demand)
        waits = (
            asyncio.ensure_future(any_change(list(tables), self.seen)),
            asyncio.ensure_future(self.applier.wake.wait()),
        )
        try:
            await asyncio.wait(waits, timeout=self.config.tick_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        self.applier.wake.clear()  # the pass reads the tables after this: it sees every change so far
        self.seen = sum(table.version for table in tables)

    def _known_files(self, records: Iterable[CatalogRecord]) -> None:
        """What the catalog recorded of each model's file when it was put (as the mirror answered
        it): a model served is placed on the first pass after, its file not asked for again."""
        for record in records:
            file = record.file
            if file is None or file.source != record.model.source or file.source in self.weights:
                continue
            if file.facts is not None:
                self.shapes[file.source] = file.facts.shape
            self.weights[file.source] = file.size
            self.unconfirmed.pop(file.source, None)

    def _learn_weights(self, models: dict[str, Model]) -> None:
        """Ask the mirror, in the background, the size of each model's file not known yet (one
        ask per file at a time); a pass uses what is known, and the next one what it learnt."""
        for source in sorted({m.source for m in models.values()} - set(self.weights) - self._stating):
            self._stating.add(source)
            task = asyncio.create_task(self._stat(source))
            self._stats.add(task)
            task.add_done_callback(self._stats.discard)

    async def _stat(self, source: str) -> None:
        """The size of one file, once the mirror holds it, and for a GGUF file its model's shape
        as the mirror read it; what it learnt wakes a pass. A file whose header does not read is
        sized by its bytes."""
        try:
            info = await call(self.ctx.nc, mirror.FILE_STAT, FileRef(source=source, digest=False))
            if info.facts is not None:
                self.shapes[source] = info.facts.shape
            self.weights[source] = info.size
            self.unconfirmed.pop(source, None)
            self.applier.wake.set()
        except Exception as exc:  # unconfirmed, unanswered, or NATS away: asked again next tick
            why = exc.message if isinstance(exc, BusError) else f"{type(exc).__name__}: {exc}"
            if self.unconfirmed.get(source) != why:
                self.ctx.log.warning("the mirror does not confirm a file", source=source, error=why)
            self.unconfirmed[source] = why
        finally:
            self._stating.discard(source)


def _by_model(replica: ReplicaState) -> tuple[str, str]:
    """How replicas are listed: by model, then id."""
    return replica.model, replica.id


main = entry_point(Scheduler, SchedulerConfig)
"""Run the scheduler until SIGTERM or SIGINT (`llmgw service scheduler`, systemd, Nix)."""


if __name__ == "__main__":
    sys.exit(main())
