"""The agent's shell: wires its collaborators (the node's facts, the supervisor of its children,
its replicas and workers, the weights cache) to its endpoints, and decides nothing itself."""

from __future__ import annotations

import asyncio
import ipaddress
import sys
import time
from pathlib import Path

import httpx
from nats.errors import Error as NatsError

from llmgw.agent import core
from llmgw.agent.cache import WeightsCache
from llmgw.agent.config import AgentConfig
from llmgw.agent.firewall import Firewall
from llmgw.agent.firewall_rules import members, ruleset
from llmgw.agent.node import NodeFacts, Work
from llmgw.agent.replicas import Replicas
from llmgw.agent.room import Room
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.upgrade import Upgrades
from llmgw.agent.workers import Workers
from llmgw.bus import (
    ConfigError,
    Context,
    CredentialsError,
    EngineKeys,
    EngineSecretError,
    KvTable,
    Verifier,
    announce,
    entry_point,
    find_llamacpp,
    public_key,
    spawn,
)
from llmgw.proto import BUCKETS, FleetMember, WeightsCollect, WeightsDelete, WeightsDeleted, agent

__all__ = ["Agent", "AgentConfig", "main"]


def _scheduler(config: AgentConfig) -> Verifier | None:
    """What checks that a start or stop comes from the scheduler: its public key's verifier. None
    only where NATS has no credentials (one machine, tests): then nothing is checked."""
    if config.scheduler_key:
        return Verifier(public_key(config.scheduler_key))
    if config.creds:
        raise CredentialsError(
            "scheduler_key is not set: give this agent the scheduler's public key (`llmgw access write` "
            "writes creds/scheduler.pub; --scheduler-key FILE or LLMGW_SCHEDULER_KEY), so that only the "
            "scheduler can start and stop engines here"
        )
    return None


def _loopback(address: str) -> bool:
    """Whether `address` (an IP or a name) is this machine's loopback only."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


class Agent:
    """The node's agent."""

    name = "agent"
    version = "0.1.0"
    description = "the node: hardware, heartbeats, engines, weights cache"
    handover = False
    """Set by SIGUSR1 (an upgrade): ready engines are left for the next agent."""

    def __init__(self, config: AgentConfig) -> None:
        if config.address in ("0.0.0.0", "::", ""):
            raise ConfigError(
                f"address '{config.address}' is where others reach this node's engines: "
                "give its address on the cluster network, not a wildcard"
            )
        try:
            ports = core.parse_ports(config.ports)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.config = config
        self.node = config.node_name()
        home = config.home() / "agent"
        cache = Path(config.cache_dir) if config.cache_dir else home / "cache"
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0))
        self.weights = WeightsCache(cache, self.http)
        self.llamacpp = find_llamacpp(config.llama_server, config.rpc_server)
        self.supervisor = Supervisor(home / "logs", home / "engines", config.stop_grace_s)
        """Engines and workers; one pid note each under engines/, so a restarted agent finds what it left."""
        self.facts = NodeFacts(config, self.llamacpp, cache, self.supervisor.pids)
        self.room = Room(ports, config.address, self.facts.cards)
        keys = EngineKeys.read(config.engine_secret, node=self.node)  # before connecting: a bad file starts nothing
        if keys.insecure and not _loopback(config.address):
            raise EngineSecretError(
                f"engines would listen on {config.address} with keys anyone can work out: give this agent "
                "its node's engine secret (engine_secret; `llmgw access write` makes engine-<node>.secret)"
            )
        self.scheduler = _scheduler(config)  # before connecting too: a missing key starts nothing
        """Checks the scheduler's signature on every start and stop (None: nothing is checked)."""
        self.replicas = Replicas(self.facts, self.supervisor, self.room, self.weights, keys)
        self.workers = Workers(self.facts, self.supervisor, self.room)
        self.ctx: Context | None = None
        self.tasks: list[asyncio.Task] = []
        self.background: set[asyncio.Task] = set()

    async def start(self, ctx: Context) -> None:
        """Adopt the engines a previous agent left (ending those it cannot vouch for), serve this
        node's endpoints, heartbeat."""
        self.ctx = ctx
        self.weights.root.mkdir(parents=True, exist_ok=True)
        left, ended = await self.supervisor.prepare()
        for gone in ended:
            ctx.log.warning("ended a worker a previous agent left running", **gone)
        if self.replicas.keys.insecure:
            ctx.log.warning("no engine_secret: engines' keys are ones anyone can work out; set it off one machine")
        self.replicas.bind(ctx)
        self.workers.bind(ctx)
        for engine in left:  # before the first heartbeat, which reports them as they are
            said = await self.replicas.adopt(engine)
            ctx.log.warning("an engine a previous agent left", replica=engine.name, pid=engine.pid, what=said)
        if self.scheduler is None:
            ctx.log.warning("no scheduler_key: starts and stops are not checked for the scheduler's signature")
        signed = {
            agent.REPLICA_START: self.replicas.start,
            agent.REPLICA_STOP: self.replicas.stop,
            agent.WORKER_START: self.workers.start,
            agent.WORKER_STOP: self.workers.stop,
        }
        for endpoint, handler in signed.items():
            await ctx.serve(endpoint, handler, node=self.node, verifier=self.scheduler)
        await ctx.serve(agent.WEIGHTS_DELETE, self.delete_weights)
        await ctx.serve(agent.WEIGHTS_COLLECT, self.collect_weights)
        self.tasks.append(await Upgrades(self.config.home(), self.node).start(ctx))
        self.tasks += self.facts.start(ctx, self._work)
        here = announce(ctx.js, "node", self.node, self.config.address)
        self.tasks.append(spawn(self.background, here, ctx.log, "announcing where this node is"))
        if self.config.firewall == "auto" and not _loopback(self.config.address):
            self.tasks.append(spawn(self.background, self._keep_firewall(ctx), ctx.log, "keeping the firewall"))

    async def _keep_firewall(self, ctx: Context) -> None:
        """Keep the firewall letting in the fleet as it is (looked at every 2 s). The fleet's
        bucket is opened again until it answers: a cluster still electing its leaders times out."""
        while True:
            try:
                table = await KvTable.open(ctx.js, BUCKETS["fleet"], FleetMember)
                break
            except (NatsError, TimeoutError) as exc:
                said = str(exc) or type(exc).__name__
                ctx.log.warning("the fleet's bucket did not answer; the firewall waits for it", error=said)
                await asyncio.sleep(2.0)
        ports = core.parse_ports(self.config.ports)
        keeper = Firewall(Path(self.config.home()) / "agent", ctx.log)
        try:
            while True:
                fleet = members(table.items.values(), time.time())
                rules = ruleset((ports.start, ports.stop - 1), self.config.admin_port, fleet, self.config.admin_from)
                await keeper.keep(rules)
                await asyncio.sleep(2.0)
        finally:
            table.stop()

    def ready(self) -> bool:
        """Registered with the scheduler."""
        return self.facts.registered

    async def stop(self) -> None:
        """Stop heartbeating, then every engine (unless `leave_engines` or a handover, SIGUSR1:
        ready ones are left running for the next agent to adopt) and worker here."""
        for t in self.tasks:
            t.cancel()
        leave = self.config.leave_engines or self.handover
        engines = self.replicas.leave_all if leave else self.replicas.stop_all
        await asyncio.gather(engines("agent stopping"), self.workers.stop_all())
        await self.http.aclose()

    def _work(self) -> Work:
        held = sorted({s for sources in self.weights.entries().values() for s in sources})
        return Work(replicas=self.replicas.reports(), weights=held, workers=self.workers.ids())

    async def delete_weights(self, req: WeightsDelete) -> WeightsDeleted:
        """Delete files from this node's cache, keeping those a replica here runs on."""
        plan = core.delete(self.weights.entries(), req.sources, self.replicas.running(), self.node)
        await self._delete(plan)
        if plan.answer.deleted:
            self.ctx.log.info("weights deleted", sources=plan.answer.deleted)
        return plan.answer

    async def collect_weights(self, req: WeightsCollect) -> WeightsDeleted:
        """Delete every cached file no model uses (`req.keep`) and no replica here runs on."""
        plan = core.collect(self.weights.entries(), req.keep, self.replicas.running(), self.node)
        await self._delete(plan)
        if plan.answer.deleted:
            self.ctx.log.info("weights collected", sources=plan.answer.deleted)
        return plan.answer

    async def _delete(self, plan: core.Deletion) -> None:
        for folder in plan.folders:
            await asyncio.to_thread(self.weights.delete, folder)


main = entry_point(Agent, AgentConfig)
"""Run the agent until SIGTERM or SIGINT (`llmgw service agent`, systemd, Nix)."""


if __name__ == "__main__":
    sys.exit(main())
