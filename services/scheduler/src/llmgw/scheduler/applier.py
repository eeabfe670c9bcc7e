"""The one task that changes the records: it takes the inbox in turn, asks the pure core what
each item means (`observe`, `accept`, `reconcile`) and carries out the plan: records written
here, agents asked in tasks of their own (`Agents`), never awaited here."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterator, Mapping

import msgspec
from opentelemetry import trace

from llmgw.bus import collector_paused, extract
from llmgw.proto import Heartbeat, ReplicaReport
from llmgw.scheduler.agents import Agents
from llmgw.scheduler.book import Book
from llmgw.scheduler.core import Actual, Hearing, NodeView, Plan, Policy, accept, model_statuses, observe, reconcile
from llmgw.scheduler.inbox import Adopt, Inbox, Item, Pass, Stopped, WorkersUp
from llmgw.scheduler.placement import spans
from llmgw.scheduler.solver import quiet_highs

__all__ = ["Applier"]

_tracer = trace.get_tracer("llmgw.scheduler")


def _fresh_ids() -> Iterator[str]:
    while True:
        yield secrets.token_hex(4)


class Applier:
    """Leads once it adopted what the replicas bucket holds; applies items while it leads."""

    def __init__(
        self,
        book: Book,
        agents: Agents,
        nodes: dict[str, NodeView],
        policy: Policy,
        log,
        hearing: Callable[[float], Hearing] = lambda now: Hearing(),
    ):
        self.book, self.agents, self.log = book, agents, log
        self.hearing = hearing
        """The scheduler's deaf time counted up to a time (nodes are judged without it)."""
        self.nodes = nodes
        """The inventory (the NATS callbacks keep it): read, never written, here."""
        self.policy = policy
        self.leading = False
        self.known_since = time.time()
        """When this scheduler began listening for nodes (again when it took the lead)."""
        self.known_deaf_s = 0.0
        """Its deaf time then."""
        self.unplaced: dict[str, str] = {}
        self.wake = asyncio.Event()
        """Set when something happened that a reconcile pass should see now (room freed, a node
        appeared, the lead taken), not at the next tick."""

    async def run(self, inbox: Inbox) -> None:
        """Take items until cancelled; one that fails is logged and the next taken."""
        while True:
            item = await inbox.get()
            try:
                await self.take(item)
            except Exception:
                self.log.exception("not applied", item=type(item).__name__)

    async def take(self, item: Item) -> None:
        """Apply one item (while leading; adopting is what makes it lead)."""
        if isinstance(item, Adopt):
            self.book.adopt(item.replicas)
            self.known_since, self.known_deaf_s, self.leading = item.since, item.deaf_s, True
            self.log.info("leading", adopted=len(item.replicas))
            self.wake.set()
        elif not self.leading:
            return
        elif isinstance(item, Heartbeat):
            await self.carry_out(observe(item, self.book.replicas, self.book.draining, time.time()))
        elif isinstance(item, ReplicaReport):
            if state := accept(self.book.replicas.get(item.id), item):
                await self.carry_out(Plan(records=[state]))
        elif isinstance(item, WorkersUp):
            if known := self.book.replicas.get(item.id):
                await self.book.record(msgspec.structs.replace(known, workers=item.workers))
        elif isinstance(item, Stopped):
            await self.book.stopped(item.replica)
            self.log.info("replica stopped", replica=item.replica.id, model=item.replica.model, reason=item.reason)
            self.wake.set()
        elif isinstance(item, Pass):
            await self.reconcile(item)

    async def reconcile(self, item: Pass) -> None:
        """One reconcile pass over the records as they are now, and the statuses after it."""
        now = time.time()
        actual = Actual(
            nodes=dict(self.nodes),
            replicas=list(self.book.replicas.values()),
            stopping=list(self.book.draining.values()),
            weights=item.weights,
            shapes=item.shapes,
            known_since=self.known_since,
            deaf_s=self.hearing(now).deaf_s,
            known_deaf_s=self.known_deaf_s,
        )
        with collector_paused():  # a pass makes no cycles (test_scan): at 10,000 nodes a walk finding none
            plan = reconcile(item.desired, actual, now, self.policy, ids=_fresh_ids(), solver=quiet_highs)
        for name, why in plan.unplaced.items():
            if self.unplaced.get(name) != why:
                self.log.warning("model not placed", model=name, why=why)
        self.unplaced = plan.unplaced
        await self.carry_out(plan, item.traces)
        statuses, held = model_statuses(
            item.desired, list(self.book.replicas.values()), plan, time.time(), self.book.held
        )
        await self.book.publish(statuses, held)

    async def carry_out(self, plan: Plan, traces: Mapping[str, str] | None = None) -> None:
        """Write what the plan records and forgets; ask the agents for its stops and starts, each
        stop after its grace and each start once the stops it waits for are done (as the plan says).
        A start for a model in `traces` (model -> the traceparent of its change) joins that trace."""
        for gone in plan.forgets:
            await self.book.forget(gone)
            self.log.warning("replica lost: its agent no longer runs it", replica=gone.id, node=gone.node)
            self.wake.set()
        for state in plan.records:
            await self.book.record(state)
            self.log.info("replica state", replica=state.id, model=state.model, state=state.state, error=state.error)
        for ask in plan.asks:
            self.agents.stop(ask)
        stopping = {}
        for stop in plan.stops:  # recorded draining (the router sends it nothing new), then asked
            await self.book.drain(stop.replica, time.time())
            stopping[stop.replica.id] = self.agents.retire(stop)
        for start in plan.starts:
            r = start.replica
            await self.book.record(r)
            self.log.info(
                "replica placed", replica=r.id, model=r.model, node=r.node, memory_mb=r.memory_mb, workers=spans(r)[1:]
            )
            after = [stopping[rid] for rid in start.after]
            if parent := (traces or {}).get(r.model):  # its task (the agent's call) inherits the span
                with _tracer.start_as_current_span(
                    f"place replica {r.id}",
                    context=extract({"traceparent": parent}),
                    attributes={"llmgw.model": r.model, "llmgw.replica": r.id, "llmgw.node": r.node},
                ):
                    self.agents.start(r, start.model, start.profile, after)
            else:
                self.agents.start(r, start.model, start.profile, after)
