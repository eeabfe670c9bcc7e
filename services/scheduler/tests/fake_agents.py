"""Fakes of the scheduler's neighbours over real NATS: agents that heartbeat and answer (or, on
purpose, never answer), a mirror that confirms every file, a catalog written straight into its bucket.

They speak the agent contract: ReplicaStart carries a ReplicaSpec; start and stop are answered
with a ReplicaReport, which also goes out on `evt.replica.<node>.<id>` and in every heartbeat.
"""

import asyncio
import time

import msgspec

from llmgw.bus import kv_bucket
from llmgw.proto import (
    BUCKETS,
    CatalogRecord,
    FileInfo,
    FileRef,
    Heartbeat,
    Model,
    NodeInfo,
    ReplicaReport,
    ReplicaSpec,
    ReplicaStart,
    ReplicaStop,
    agent,
    mirror,
)

GB = 2**30


class FakeAgent:
    """A node's agent: heartbeats every `every_s`; starts replicas at once (ready in its answer),
    or, `silent`, takes every request and never answers. `strays` are reported in every heartbeat
    though nobody asked for them."""

    def __init__(self, nc, node, silent=False, strays=(), every_s=0.2, **labels):
        self.nc, self.node, self.silent, self.every_s = nc, node, silent, every_s
        self.labels = labels or {"pool": node}
        self.replicas: dict[str, ReplicaReport] = {r.id: r for r in strays}
        self.specs: dict[str, ReplicaSpec] = {}
        """What the scheduler sent to start, by replica id."""
        self.asked: list[str] = []
        """Subjects it was asked on, in order (answered or not)."""
        self.subs, self.task = [], None

    def info(self):
        return NodeInfo(
            node=self.node,
            hostname=self.node,
            cpus=8,
            memory_total_mb=16_000,
            memory_available_mb=16_000,
            engines={"llamacpp": "1"},
            labels=self.labels,
        )

    async def start(self):
        for endpoint, handle in ((agent.REPLICA_START, self._start), (agent.REPLICA_STOP, self._stop)):
            self.subs.append(await self.nc.subscribe(endpoint.subject(self.node), cb=handle))
        self.task = asyncio.create_task(self._beat())
        return self

    async def stop(self):
        self.task.cancel()
        for sub in self.subs:
            await sub.unsubscribe()

    async def _beat(self):
        while True:
            beat = Heartbeat(info=self.info(), replicas=list(self.replicas.values()), sent=time.time())
            await self.nc.publish(agent.HEARTBEAT.subject(self.node), msgspec.json.encode(beat))
            await asyncio.sleep(self.every_s)

    async def _start(self, msg):
        self.asked.append(msg.subject)
        if self.silent:
            return
        spec = msgspec.json.decode(msg.data, type=ReplicaStart).replica
        self.specs[spec.id] = spec
        report = ReplicaReport(
            id=spec.id,
            model=spec.model,
            profile=spec.profile,
            node=self.node,
            state="ready",
            url=f"http://{self.node}:8000",
            updated=time.time(),
        )
        self.replicas[spec.id] = report
        await msg.respond(msgspec.json.encode(report))
        await self.nc.publish(agent.REPLICA_CHANGED.subject(spec.node, spec.id), msgspec.json.encode(report))

    async def _stop(self, msg):
        self.asked.append(msg.subject)
        if self.silent:
            return
        rid = msgspec.json.decode(msg.data, type=ReplicaStop).id
        known = self.replicas.pop(rid, None)
        report = ReplicaReport(
            id=rid,
            model=known.model if known else "unknown",
            profile=known.profile if known else "unknown",
            node=self.node,
            state="stopped",
            updated=time.time(),
        )
        await msg.respond(msgspec.json.encode(report))


async def fake_mirror(nc, slow=()):
    """Every file is there, a GiB big; asked about a source in `slow`, it never answers."""

    async def stat(msg):
        source = msgspec.json.decode(msg.data, type=FileRef).source
        if source in slow:
            return
        await msg.respond(msgspec.json.encode(FileInfo(source=source, size=GB, sha256="0" * 64, url="")))

    return await nc.subscribe(mirror.FILE_STAT.subject(), cb=stat)


async def put_model(nc, model: Model):
    """What the catalog does on a put: the record in its bucket."""
    kv = await kv_bucket(nc.jetstream(), BUCKETS["catalog"], history=5)
    await kv.put(model.name, msgspec.json.encode(CatalogRecord(model=model, changed_at=time.time())))
