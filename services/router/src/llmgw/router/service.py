"""The router: an OpenAI-compatible endpoint proxying each request to the replica that serves it
best, with keys, limits, usage and metrics. This module only wires its collaborators.

- `directory.Directory`: models, aliases and ready replicas (catalog and replicas buckets)
- `accounts.Accounts`: keys, projects, limits, usage, and their NATS endpoints
- `oracle.PrefixOracle`: vLLM's KV events over ZMQ, and prompts tokenized by engines
- `proxy.Proxy`: forwarding, retries, fallbacks (each try and its stream: `relay.py`; the
  choosing: `balance.Balancer`; which engines answer their health probe: `health.Health`)
- `gateway.Gateway`: a request prepared and checked, admitted, forwarded, ended
- `app.http_app`: the OpenAI routes (`endpoint.OpenAIEndpoint`) in front of the Litestar app
  (with `admin.admin_api` and the console), `metrics.Metrics`
- `upstream.Upstream`: the connections to engines a request goes on
- `knowledge.Knowledge`: knowledge bases, embedded and indexed in the background (`ingest.py`)
- `tools.Tools`: the tenants' MCP servers, linked from here; `tools.McpFace`: the /mcp endpoint
- `providers.Providers`: outside OpenAI-compatible providers and their keys' pools
"""

from __future__ import annotations

import asyncio
import secrets
import sys

import aiohttp

from llmgw.bus import Context, EngineKeys, announce, entry_point, kv_bucket, spawn
from llmgw.proto import BUCKETS
from llmgw.proto.people import SignInSettings
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.accounts.audit import Audit
from llmgw.router.accounts.people import People
from llmgw.router.accounts.sealed import Sealer
from llmgw.router.accounts.signin import SignIn
from llmgw.router.admin.api import admin_api, metrics_route
from llmgw.router.admin.knowledge_routes import knowledge_routes
from llmgw.router.config import RouterConfig
from llmgw.router.console import console_routes
from llmgw.router.guard.store import Guards
from llmgw.router.http.app import http_app
from llmgw.router.http.endpoint import OpenAIEndpoint
from llmgw.router.http.front import Front
from llmgw.router.knowledge.answers import Answers
from llmgw.router.knowledge.ingest import Follower, Ingest
from llmgw.router.knowledge.store import Knowledge
from llmgw.router.metrics import Metrics
from llmgw.router.notify.hooks import Hooks
from llmgw.router.providers.store import Providers
from llmgw.router.request.gateway import Gateway
from llmgw.router.request.proxy import Proxy
from llmgw.router.routing.balance import Balancer
from llmgw.router.routing.demand import DemandSignal
from llmgw.router.routing.directory import Directory
from llmgw.router.routing.health import Health
from llmgw.router.routing.oracle import PrefixOracle
from llmgw.router.routing.upstream import Upstream
from llmgw.router.tools.face import McpFace
from llmgw.router.tools.store import Tools
from llmgw.router.usage.summing import Summing

__all__ = ["Router", "RouterConfig", "main"]


class Router:
    """The OpenAI gateway in front of every replica."""

    name = "router"
    version = "0.1.0"
    description = "OpenAI-compatible gateway"

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.keys = EngineKeys.read(config.engine_secret)
        """Works out each engine's key (read before connecting: a bad file starts nothing)."""
        self.instance = secrets.token_hex(4)
        """This router's id in the shared limit counters."""
        self.ctx: Context | None = None
        self.http: Front | None = None
        self.client: aiohttp.ClientSession | None = None
        """To the engines off the hot path (health probes, tokenizing)."""
        self.upstream = Upstream(total_s=config.upstream_timeout_s)
        """To the engines, for the requests forwarded (`upstream.py` says why not aiohttp)."""
        self.directory: Directory | None = None
        self.accounts: Accounts | None = None
        self.summing: Summing | None = None
        """The usage stream summed into slots in a process of its own (`summing.py`)."""
        self.oracle: PrefixOracle | None = None
        self.hooks: Hooks | None = None
        self.guards: Guards | None = None
        self.knowledge: Knowledge | None = None
        self.answers: Answers | None = None
        self.tools: Tools | None = None
        self.providers: Providers | None = None
        self.mcp: McpFace | None = None
        self.background: set[asyncio.Task] = set()
        self.routed = asyncio.Event()
        """Set once the gateway is there: what is opened beside the routing is wired to it then."""
        self.demand: DemandSignal | None = None
        self.health: Health | None = None
        self.proxy: Proxy | None = None
        self.gateway: Gateway | None = None
        self.app: OpenAIEndpoint | None = None
        """What its HTTP server serves (ASGI)."""
        self.draining = False
        """Stopping: the endpoint takes no new requests and /readyz says not ready."""

    async def start(self, ctx: Context) -> None:
        """Watch what it routes by, serve its endpoints, then open the OpenAI endpoint."""
        config = self.config
        self.ctx = ctx
        self.client = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=config.upstream_timeout_s, connect=3.0),
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            auto_decompress=False,
        )
        if self.keys.insecure:
            ctx.log.warning("no engine_secret: engines' keys are ones anyone can work out; set it off one machine")
        metrics = Metrics(ctx.metrics)
        balancer = Balancer(index_blocks=config.index_blocks, request_chars=config.request_chars)
        self.directory = await Directory.open(ctx.js, balancer.keep_only, self.keys)
        self.accounts = await Accounts.open(ctx.js, self.instance, config, lambda: ctx.nc.is_connected, nc=ctx.nc)
        if config.usage_summing == "process":
            self.summing = Summing(config)
            self.summing.start()
        await self.accounts.serve(ctx)
        audit = await Audit.open(ctx.nc, ctx.js)
        own = SignInSettings(ldap=config.ldap, oidc=config.oidc)
        signin = await SignIn.open(ctx.js, self.keys.derive("sign-in secrets"), own, audit)
        self.accounts.people = await People.open(ctx.js, self.accounts.keys, audit, signin)
        await self.accounts.people.serve(ctx)
        self.hooks = await Hooks.open(ctx.js, self.accounts, self.keys.derive("hook secrets"), config)
        await self.hooks.serve(ctx)
        self.guards = await Guards.open(ctx.js, ctx.nc, self.accounts.people.known_tenant)
        await self.guards.serve(ctx)
        # knowledge's buckets take seconds on a cluster: opened beside the rest
        spawn(self.background, self._open_knowledge(ctx), ctx.log, "opening the knowledge bases")
        spawn(self.background, self._open_tools(ctx), ctx.log, "opening the MCP servers")
        where = announce(ctx.js, "router", self.instance, nats_url=config.nats_url)  # the nodes' firewalls let it in
        spawn(self.background, where, ctx.log, "announcing where this router is")
        self.oracle = PrefixOracle(self.directory, self.client, config.tokenize_timeout_s)
        self.oracle.start()
        demand = await kv_bucket(ctx.js, BUCKETS["demand"])
        self.demand = DemandSignal(
            demand, self.directory, config.demand_every_s, config.wake_timeout_s, config.replace_wait_s
        )
        self.health = Health(self.directory, balancer, self.client, config)
        self.health.start()
        self.proxy = Proxy(self.directory, self.oracle, self.demand, self.health, metrics, self.upstream)
        spawn(self.background, self._open_providers(ctx), ctx.log, "opening the outside providers")
        self.gateway = gateway = Gateway(self.accounts, self.directory, self.oracle, self.proxy, metrics, config)
        gateway.guards = self.guards
        self.guards.ask_judge = gateway.ask_judge  # a judge is asked through the router's own routing
        self.guards.known_model = lambda name: self.directory.model(name) is not None
        self.routed.set()
        admin = [admin_api(self.accounts, ctx.nc), metrics_route(self.accounts, ctx.metrics)]
        admin += knowledge_routes(lambda: self.knowledge, self.accounts)
        self.mcp = McpFace(lambda: self.tools, self.accounts.authorize, self.version)
        admin.append(self.mcp.route())
        sessions = self.keys.derive("console sessions")
        console = console_routes(self.accounts, ctx.nc, gateway, sessions, config.console_session_s)
        self.app = http_app(gateway, admin, console, metrics, config, self.version)
        self.http = Front(self.app, config)
        await self.http.start()
        ctx.log.info("openai endpoint", url=f"{self.http.url}/v1")

    async def _open_knowledge(self, ctx: Context) -> None:
        """The knowledge bases and the answer caches: their buckets opened (in the background: on a
        cluster that takes seconds the gateway does not wait for), their endpoints served, and
        wired to the gateway once it is there."""
        assert self.accounts is not None and self.accounts.people is not None and self.directory is not None
        directory, known_tenant = self.directory, self.accounts.people.known_tenant
        knowledge = await Knowledge.open(ctx.js, ctx.nc, known_tenant)
        knowledge.model_version = directory.embedding_version
        knowledge.chat_model = lambda name: (m := directory.model(name)) is not None and m.kind == "chat"
        answers = await Answers.open(ctx.js, ctx.nc, known_tenant)
        answers.model_version = directory.embedding_version
        answers.known_model = lambda name: directory.model(name) is not None
        await self.routed.wait()  # the routing is started beside this
        assert self.gateway is not None
        self.knowledge, self.answers = knowledge, answers  # stopped with the router from here on
        self._wire_knowledge(self.gateway)  # wired before anything is asked of them
        await knowledge.serve(ctx)
        await answers.serve(ctx)

    async def _open_providers(self, ctx: Context) -> None:
        """The outside providers: their bucket opened (in the background, as knowledge's), their
        endpoints served, and their models routed to them."""
        sealer = Sealer(self.keys.derive("provider keys"), "provider keys")
        self.providers = providers = await Providers.open(ctx.js, ctx.nc, sealer)
        await providers.serve(ctx)
        assert self.proxy is not None and self.directory is not None  # made before this was started
        self.directory.outside, self.proxy.outside = providers.models, providers.route

    async def _open_tools(self, ctx: Context) -> None:
        """The MCP servers and tool rules: their buckets opened (in the background, as knowledge's),
        their endpoints served, and their calls checked by the gateway's guardrails."""
        assert self.accounts is not None and self.accounts.people is not None and self.guards is not None
        tools = await Tools.open(ctx.js, ctx.nc)
        tools.known_tenant = self.accounts.people.known_tenant
        tools.sealer = Sealer(self.keys.derive("mcp secrets"), "mcp headers")
        tools.policy_for = self.guards.tool_policy_for
        await tools.serve(ctx)
        await self.routed.wait()  # the routing is started beside this
        assert self.gateway is not None
        tools.guard_texts = self.gateway.guard_tool
        tools.counted = self.gateway.counted
        self.tools = tools

    def _wire_knowledge(self, gateway: Gateway) -> None:
        """Documents embedded through `gateway` and indexed here, in the background; chats
        answered from them and from the answer caches."""
        assert self.knowledge is not None and self.answers is not None
        self.knowledge.embed = gateway.embed
        follower = Follower(self.knowledge)
        self.knowledge.catch_up = follower.catch_up
        self.knowledge.tasks = [asyncio.create_task(Ingest(self.knowledge).run()), asyncio.create_task(follower.run())]
        gateway.knowledge, gateway.answers = self.knowledge, self.answers

    async def stop(self) -> None:
        """Drain: close the endpoint to new connections at once, let the requests in flight finish
        for up to `drain_s` (then cut them); then stop following and watching."""
        self.draining = True
        if self.http:
            await self.http.stop(grace_s=self.config.drain_s)
        people = self.accounts.people if self.accounts else None
        for task in self.background:
            task.cancel()
        parts = (self.health, self.oracle, self.demand, self.accounts, people, self.hooks, self.guards, self.knowledge)
        parts += (self.answers, self.tools, self.mcp, self.providers, self.directory)
        parts += (self.summing,)
        for part in parts:
            if part:
                part.stop()
        if self.client:
            await self.client.close()
        self.upstream.close()

    def ready(self) -> bool:
        """Whether the endpoint is open (not draining) and every bucket it reads is in and followed."""
        return not self.why_not_ready()

    def why_not_ready(self) -> str:
        """Why it is not ready ("" where it is): not started, draining, or a table it routes by
        stale (its initial values not in yet, or its watch restarting: /readyz names it)."""
        if self.http is None or self.directory is None or self.accounts is None:
            return "starting"
        if self.draining:
            return "draining"
        tables = (self.directory.catalog, self.directory.replicas, self.accounts.keys, self.accounts.projects)
        stale = [t.bucket for t in tables if t.stale]
        return f"stale: {', '.join(stale)} (its watch is catching up)" if stale else ""


main = entry_point(Router, RouterConfig)
"""Run the router until SIGTERM or SIGINT (`llmgw service router`, systemd, Nix)."""


if __name__ == "__main__":
    sys.exit(main())
