"""The router: an OpenAI-compatible endpoint (Litestar) proxying each request to the replica that
serves it best, with keys, limits, usage and metrics. What it routes by is kept in memory,
fed by KV watches (not polls); the choosing is `balance.py`, the checks `core.py`."""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
import uuid
from collections.abc import Callable

import aiohttp
import msgspec
import zmq
import zmq.asyncio
from litestar import Litestar, Request, get, post
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.response import Response, Stream
from nats.js.api import ConsumerConfig, DeliverPolicy, StreamConfig
from prometheus_client import Counter, Gauge, Histogram

from llmgw.bus import BusConfig, Context, HttpServer, KvTable, NotFound, kv_bucket, load_config, run
from llmgw.proto import (
    BUCKETS,
    CatalogRecord,
    Demand,
    Empty,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyRecord,
    KeyRef,
    Model,
    Profile,
    Project,
    ReplicaState,
    Subjects,
    UsageQuery,
    UsageRecord,
    UsageReport,
)
from llmgw.router.admin import admin_api
from llmgw.router.balance import Balancer, Candidate, prompt_blocks
from llmgw.router.core import (
    ApiError,
    Checked,
    check_context,
    check_request,
    context_of,
    key_hash,
    may_exceed,
    rewrite_chunk,
    sum_usage,
    tokenize_request,
    usage_of,
)
from llmgw.router.kvevents import CacheView, decode_batch, token_blocks
from llmgw.router.quota import Quota, Scope

__all__ = ["Router", "RouterConfig", "main"]

_RETRIES = 2
USAGE_STREAM = "llmgw_usage"


class RouterConfig(BusConfig, kw_only=True):
    """Router settings."""

    http_host: str = "127.0.0.1"
    http_port: int = 8080
    """Port of the OpenAI endpoint; 0 picks a free one."""
    upstream_timeout_s: float = 600.0
    """Longest an engine may take to answer."""
    max_body_bytes: int = 4 * 2**20
    """Larger request bodies get 413 before they are read whole."""
    max_n: int = 4
    """Most choices (`n`) one request may ask for."""
    wake_timeout_s: float = 180.0
    """How long a request for an on-demand model at zero waits for it to wake."""
    demand_every_s: float = 5.0
    """How often, at most, the router tells the scheduler a running on-demand model is in use."""
    affinity_overload: float = 1.25
    """A replica holding the prompt's prefix is passed over when its load is beyond this times its pool's mean."""
    index_blocks: int = 65536
    """Prompt blocks remembered per replica for prefix affinity (least recently used go first)."""
    usage_days: int = 90
    """How long the usage stream keeps each request."""
    tokenize_timeout_s: float = 5.0
    """How long a replica with KV events has to tokenize a prompt before the router routes
    without it (by its own prefix index)."""


class _Metrics:
    """The router's Prometheus series (on the admin port's /metrics)."""

    def __init__(self, registry) -> None:
        self.requests = Counter(
            "llmgw_router_requests", "Requests answered", ["model", "pool", "code"], registry=registry
        )
        self.tokens = Counter("llmgw_router_tokens", "Tokens", ["model", "kind"], registry=registry)
        self.ttft = Histogram(
            "llmgw_router_ttft_seconds",
            "Time to the first token of a stream",
            ["model", "pool"],
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.latency = Histogram(
            "llmgw_router_latency_seconds",
            "Whole request latency",
            ["model", "pool"],
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.in_flight = Gauge(
            "llmgw_router_in_flight", "Requests in flight per replica", ["model", "replica"], registry=registry
        )
        self.retries = Counter(
            "llmgw_router_retries", "Requests retried on another replica", ["model"], registry=registry
        )
        self.rejections = Counter(
            "llmgw_router_rejections", "Requests refused before any engine", ["reason"], registry=registry
        )
        self.picks = Counter("llmgw_router_picks", "How replicas were chosen", ["model", "how"], registry=registry)


class _Call(msgspec.Struct, kw_only=True):
    """One request on its way: who sent it, what for, and what it used."""

    rid: str
    key_id: str
    key: KeyRecord
    scopes: list[Scope]
    model: Model
    checked: Checked
    blocks: list[bytes]
    started: float
    replica: str = ""
    pool: str = ""
    ttft: float | None = None
    status: int = 200
    prompt: int = 0
    cached: int | None = None
    completion: int = 0


class Router:
    """The OpenAI gateway in front of every replica."""

    name = "router"
    version = "0.1.0"
    description = "OpenAI-compatible gateway"

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.catalog: KvTable[CatalogRecord] | None = None
        self.replicas: KvTable[ReplicaState] | None = None
        self.keys: KvTable[KeyRecord] | None = None
        self.projects: KvTable[Project] | None = None
        self.balancer = Balancer(index_blocks=config.index_blocks, overload=config.affinity_overload)
        self.http: HttpServer | None = None
        self.client: aiohttp.ClientSession | None = None
        """To the engines (aiohttp: less work per request than httpx, measured in tests/bench/gateway.py)."""
        self.ctx: Context | None = None
        self.instance = secrets.token_hex(4)
        self.usage: asyncio.Queue[UsageRecord] = asyncio.Queue(maxsize=100_000)
        self.told: dict[str, float] = {}
        """Model -> when the router last wrote its demand."""
        self.tasks: list[asyncio.Task] = []
        self.caches: dict[str, CacheView] = {}
        """What each replica with KV events holds in its prefix cache, as its events say."""
        self.listeners: dict[str, asyncio.Task] = {}
        self.zmq = zmq.asyncio.Context()

    async def start(self, ctx: Context) -> None:
        self.ctx = ctx
        self.client = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.config.upstream_timeout_s, connect=3.0),
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            auto_decompress=False,
        )
        self.metrics = _Metrics(ctx.metrics)
        self.catalog = await KvTable.open(ctx.js, BUCKETS["catalog"], CatalogRecord, history=5)
        self.replicas = await KvTable.open(ctx.js, BUCKETS["replicas"], ReplicaState)
        self.keys = await KvTable.open(ctx.js, BUCKETS["keys"], KeyRecord)
        self.projects = await KvTable.open(ctx.js, BUCKETS["projects"], Project)
        self.demand = await kv_bucket(ctx.js, BUCKETS["demand"])
        self.quota = Quota(await kv_bucket(ctx.js, BUCKETS["limits"], ttl=32 * 86400), self.instance)
        await ctx.js.add_stream(
            StreamConfig(name=USAGE_STREAM, subjects=[Subjects.EVT_USAGE_ALL], max_age=self.config.usage_days * 86400.0)
        )
        await ctx.endpoint("key-create", Subjects.ROUTER_KEY_CREATE, KeyCreate, self.create_key)
        await ctx.endpoint("key-list", Subjects.ROUTER_KEY_LIST, Empty, self.list_keys)
        await ctx.endpoint("key-revoke", Subjects.ROUTER_KEY_REVOKE, KeyRef, self.revoke_key)
        await ctx.endpoint("project-put", Subjects.ROUTER_PROJECT_PUT, Project, self.put_project)
        await ctx.endpoint("usage-sum", Subjects.ROUTER_USAGE_SUM, UsageQuery, self.sum_usage)
        self.tasks += [
            asyncio.create_task(self._publish_usage()),
            asyncio.create_task(self.quota.keep_alive(20.0)),
            asyncio.create_task(self._follow_kv_events()),
        ]
        self.http = HttpServer(self.app(), self.config.http_host, self.config.http_port)
        await self.http.start()
        ctx.log.info("openai endpoint", url=f"{self.http.url}/v1")

    async def stop(self) -> None:
        if self.http:
            await self.http.stop()
        for task in [*self.tasks, *self.listeners.values()]:
            task.cancel()
        self.zmq.destroy(linger=0)
        for table in (self.catalog, self.replicas, self.keys, self.projects):
            if table:
                table.stop()
        if self.client:
            await self.client.close()

    def ready(self) -> bool:
        tables = (self.catalog, self.replicas, self.keys, self.projects)
        return self.http is not None and all(t and t.synced for t in tables)

    # -- keys, projects, usage (NATS and the admin API) ------------------------------------
    async def create_key(self, req: KeyCreate) -> KeyCreated:
        key = "sk-llmgw-" + secrets.token_urlsafe(32)
        record = KeyRecord(
            name=req.name,
            created=time.time(),
            admin=req.admin,
            project=req.project,
            expires=time.time() + req.expires_in_s if req.expires_in_s else None,
            models=req.models,
            limits=req.limits,
        )
        if req.project not in self.projects.items:
            project = Project(name=req.project, created=time.time())
            await self.projects.kv.put(req.project, msgspec.json.encode(project))
            self.projects.items[req.project] = project
        await self.keys.kv.put(key_hash(key), msgspec.json.encode(record))
        self.keys.items[key_hash(key)] = record  # usable at once, before the watch delivers it
        return KeyCreated(name=req.name, key=key, id=key_hash(key)[:16])

    async def list_keys(self, _: Empty) -> KeyList:
        return KeyList(keys={h[:16]: r for h, r in sorted(self.keys.items.items(), key=lambda kv: kv[1].created)})

    async def revoke_key(self, ref: KeyRef) -> KeyList:
        found = [h for h in self.keys.items if h.startswith(ref.id)]
        if not found:
            raise NotFound(f"no key has the id '{ref.id}'; `llmgw ctl key list` shows them")
        record = self.keys.items[found[0]]
        await self.keys.kv.delete(found[0])
        self.keys.items.pop(found[0], None)  # gone at once here; the watch tells every other router
        return KeyList(keys={ref.id: record})

    async def put_project(self, project: Project) -> Project:
        project = msgspec.structs.replace(project, created=project.created or time.time())
        await self.projects.kv.put(project.name, msgspec.json.encode(project))
        self.projects.items[project.name] = project
        return project

    async def sum_usage(self, query: UsageQuery) -> UsageReport:
        """Read the usage stream from `since` to its end and sum it."""
        info = await self.ctx.js.stream_info(USAGE_STREAM)
        if info.state.messages == 0:
            return UsageReport(rows=[])
        start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(query.since))
        sub = await self.ctx.js.pull_subscribe(
            Subjects.EVT_USAGE_ALL,
            stream=USAGE_STREAM,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start, inactive_threshold=30.0
            ),
        )
        records = []
        try:
            while True:
                try:
                    batch = await sub.fetch(1000, timeout=1.0)
                except TimeoutError:
                    break
                for msg in batch:
                    try:
                        records.append(msgspec.json.decode(msg.data, type=UsageRecord))
                    except msgspec.DecodeError:
                        continue
                if batch[-1].metadata.num_pending == 0 or batch[-1].metadata.sequence.stream >= info.state.last_seq:
                    break
        finally:
            await sub.unsubscribe()
        return UsageReport(rows=sum_usage([r for r in records if r.time >= query.since], query.group_by))

    async def _publish_usage(self) -> None:
        """Off the hot path: each finished request's usage to the stream."""
        while True:
            record = await self.usage.get()
            try:
                await self.ctx.js.publish(Subjects.evt_usage(record.project, record.model), msgspec.json.encode(record))
            except Exception as exc:
                self.ctx.log.warning("usage not recorded", request=record.request_id, error=str(exc))

    # -- HTTP ----------------------------------------------------------------------------
    def _authorize(self, request: ASGIConnection, admin: bool = False) -> tuple[str, KeyRecord]:
        auth = request.headers.get("authorization", "")
        if not auth.lower().startswith("bearer "):
            raise ApiError(
                401, "Missing API key: send 'Authorization: Bearer <key>'.", "invalid_request_error", "missing_api_key"
            )
        digest = key_hash(auth[7:].strip())
        record = self.keys.items.get(digest)
        if record is None:
            raise ApiError(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        if record.expires is not None and record.expires < time.time():
            raise ApiError(
                401,
                f"This API key expired at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(record.expires))}; "
                "ask for a new one.",
                "invalid_request_error",
                "expired_api_key",
            )
        if admin and not record.admin:
            raise ApiError(
                403, "This key may not use the admin API; use an admin key.", "permission_error", "not_admin"
            )
        return digest[:16], record

    def app(self) -> Litestar:
        router = self

        @get("/v1/models")
        async def list_models(request: Request) -> dict:
            """The models (and aliases) this key may use."""
            _, key = router._authorize(request)
            names = sorted(n for n in router._names_map() if not key.models or n in key.models)
            return {
                "object": "list",
                "data": [{"id": n, "object": "model", "created": 0, "owned_by": "llmgw"} for n in names],
            }

        @post("/v1/chat/completions", status_code=200)
        async def chat(request: Request) -> Response:
            """OpenAI's chat completions, streamed or not."""
            return await router.proxy(request, "/v1/chat/completions")

        @post("/v1/completions", status_code=200)
        async def completions(request: Request) -> Response:
            """OpenAI's (legacy) completions, streamed or not."""
            return await router.proxy(request, "/v1/completions")

        @post("/v1/embeddings", status_code=200)
        async def embeddings(request: Request) -> Response:
            """OpenAI's embeddings (the replica's engine must serve them)."""
            return await router.proxy(request, "/v1/embeddings")

        def on_api_error(request: Request, exc: ApiError) -> Response:
            if exc.status in (400, 413, 429):
                router.metrics.rejections.labels(exc.code or str(exc.status)).inc()
            return Response(exc.body(), status_code=exc.status, headers=exc.headers)

        def on_invalid(request: Request, exc: ValidationException) -> Response:
            extra = "; ".join(str(e.get("message", e)) for e in (exc.extra or []) if isinstance(e, dict))
            err = ApiError(400, f"{exc.detail}{': ' + extra if extra else ''}", "invalid_request_error", "invalid_body")
            return on_api_error(request, err)

        def on_http(request: Request, exc: HTTPException) -> Response:
            code = "body_too_large" if exc.status_code == 413 else f"http_{exc.status_code}"
            kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
            return on_api_error(request, ApiError(exc.status_code, str(exc.detail), kind, code))

        def on_bug(request: Request, exc: Exception) -> Response:
            router.ctx.log.exception("request failed inside the router", path=request.url.path)
            return on_api_error(
                request,
                ApiError(
                    500,
                    f"The router failed on this request ({type(exc).__name__}); its log has the details.",
                    "server_error",
                    "internal_error",
                ),
            )

        async def add_request_id(message, scope) -> None:
            if message["type"] == "http.response.start":
                rid = scope.setdefault("state", {}).setdefault("request_id", uuid.uuid4().hex)
                message.setdefault("headers", []).append((b"x-request-id", rid.encode()))

        return Litestar(
            [list_models, chat, completions, embeddings, admin_api(router)],
            exception_handlers={
                ApiError: on_api_error,
                ValidationException: on_invalid,
                HTTPException: on_http,
                Exception: on_bug,
            },
            before_send=[add_request_id],
            request_max_body_size=self.config.max_body_bytes,
            openapi_config=OpenAPIConfig(title="llmgw", version=router.version, path="/schema"),
        )

    def _names_map(self) -> dict[str, str]:
        """Every name a client may ask for (models and their aliases) -> the model."""
        return self.catalog.derived(_names)

    def _model(self, asked: str) -> Model | None:
        name = self._names_map().get(asked)
        record = self.catalog.items.get(name) if name else None
        return record.model if record else None

    def _candidates(self, model: Model) -> tuple[list[Candidate], dict[str, tuple[ReplicaState, Profile]]]:
        """The model's ready replicas as the balancer sees them (priority, weight and slots
        from their profiles), and each one's state and profile by id."""
        states = self.replicas.derived(self._ready_by_model).get(model.name, {})
        profiles = {p.name: p for p in model.profiles}
        ready = {r.id: (r, p) for r in states.values() if (p := profiles.get(r.profile)) is not None}
        return [
            Candidate(id=rid, priority=p.priority, weight=p.weight, slots=p.slots) for rid, (_, p) in ready.items()
        ], ready

    def _ready_by_model(self, replicas: dict[str, ReplicaState]) -> dict[str, dict[str, ReplicaState]]:
        """Ready replicas by model, worked out once per change of the replicas bucket; what the
        balancer kept of replicas now gone is dropped then."""
        out: dict[str, dict[str, ReplicaState]] = {}
        for r in replicas.values():
            if r.state == "ready":
                out.setdefault(r.model, {})[r.id] = r
        for gone in (set(self.balancer.indexes) | set(self.balancer.recent)) - set(replicas):
            self.balancer.forget_replica(gone)
        return out

    # -- KV events (vLLM): what each replica's prefix cache holds ------------------------------
    async def _follow_kv_events(self) -> None:
        """Listen to the KV events of every ready replica that publishes them, from when it is
        ready until it is gone."""
        while True:
            live = {r.id: r.kv_events for r in self.replicas.items.values() if r.state == "ready" and r.kv_events}
            for rid in set(self.listeners) - set(live):
                self.listeners.pop(rid).cancel()
                self.caches.pop(rid, None)
            for rid, endpoint in live.items():
                if rid not in self.listeners:
                    self.caches[rid] = CacheView()
                    self.listeners[rid] = asyncio.create_task(self._listen(rid, endpoint))
            await self.replicas.changed.wait()
            self.replicas.changed.clear()

    async def _listen(self, rid: str, endpoint: str) -> None:
        """One replica's events into its CacheView (ZMQ reconnects by itself if the engine restarts)."""
        sock = self.zmq.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)
        self.ctx.log.info("following KV events", replica=rid, endpoint=endpoint)
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    if len(frames) != 3:
                        raise msgspec.DecodeError(f"{len(frames)} frames, not 3 (topic, sequence, batch)")
                    _, events = decode_batch(frames[2])
                except msgspec.DecodeError as exc:
                    self.ctx.log.warning("KV event batch not understood, skipped", replica=rid, error=str(exc))
                    continue
                self.caches[rid].apply(int.from_bytes(frames[1], "big"), events)
        finally:
            sock.close(linger=0)

    @staticmethod
    def _engine_headers(replica: ReplicaState) -> dict[str, str]:
        return {"authorization": f"Bearer {replica.api_key}", "content-type": "application/json"}

    async def _engine_post(self, replica: ReplicaState, path: str, body: dict) -> dict:
        async with self.client.post(
            replica.url + path,
            data=msgspec.json.encode(body),
            headers=self._engine_headers(replica),
            timeout=aiohttp.ClientTimeout(total=self.config.tokenize_timeout_s),
        ) as resp:
            if resp.status != 200:
                raise ValueError(f"{path} answered {resp.status}")
            return msgspec.json.decode(await resp.read())

    async def _prompt_tokens(
        self, call: _Call, model: Model, path: str, replica: ReplicaState, profile: Profile
    ) -> list[int] | None:
        """The prompt as the engine will see it, tokenized by `replica` (vLLM's /tokenize;
        llama-server's /apply-template, then /tokenize); None where it cannot be had now."""
        asked = tokenize_request(path, call.checked.body, model.name)
        if asked is None or isinstance(asked, list):
            return asked
        try:
            if profile.engine == "vllm":
                return (await self._engine_post(replica, "/tokenize", asked))["tokens"]
            text = asked.get("prompt")
            if text is None:
                template = {k: v for k, v in asked.items() if k != "model"}
                text = (await self._engine_post(replica, "/apply-template", template))["prompt"]
            return (
                await self._engine_post(
                    replica, "/tokenize", {"content": text, "add_special": True, "parse_special": True}
                )
            )["tokens"]
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            self.ctx.log.warning(
                "prompt not tokenized: the engine will check its length", replica=replica.id, error=repr(exc)
            )
            return None

    async def _before_picking(
        self, call: _Call, model: Model, path: str, primary: bool, states: dict[str, tuple[ReplicaState, Profile]]
    ) -> Callable[[str], int] | None:
        """What needs the prompt's tokens, before a replica is picked: a 400 for the primary model
        where the prompt might not fit its context (tokenized only then: a long prompt), and for
        replicas that publish KV events, how many of its leading blocks each one holds (None:
        the balancer goes by its own index)."""
        ready = list(states.values())
        if not ready or path == "/v1/embeddings":
            return None
        limit = max(context_of(model, p) for _, p in ready)
        kv = any(r.kv_events for r, _ in ready)
        if not kv and not (primary and may_exceed(call.checked, limit)):
            return None
        replica, profile = next(((r, p) for r, p in ready if r.kv_events), ready[0])
        tokens = await self._prompt_tokens(call, model, path, replica, profile)
        if tokens is None:
            return None
        if primary:
            check_context(len(tokens), call.checked.max_tokens, limit, model.name, path)
        if not kv:
            return None
        by_size: dict[int, list[bytes]] = {}

        def held(rid: str) -> int:
            view = self.caches.get(rid)
            if view is None or not view.block_size:
                return 0
            if view.block_size not in by_size:
                by_size[view.block_size] = token_blocks(tokens, view.block_size)
            return view.match(by_size[view.block_size])

        return held

    def _tell_demand(self, model: Model, now: float, force: bool = False) -> None:
        """For on-demand models: tell the scheduler it is wanted (at once when it sleeps)."""
        if model.scaling.idle_timeout_s is None:
            return
        if force or now - self.told.get(model.name, 0.0) >= self.config.demand_every_s:
            self.told[model.name] = now
            record = msgspec.json.encode(Demand(model=model.name, last_asked=now))
            task = asyncio.create_task(self.demand.put(model.name, record))
            self.tasks.append(task)
            task.add_done_callback(self.tasks.remove)

    async def _wake(self, model: Model) -> bool:
        """Wait (bounded) for an on-demand model at zero to get a ready replica."""
        self._tell_demand(model, time.time(), force=True)
        self.ctx.log.info("waking an on-demand model", model=model.name)
        deadline = time.monotonic() + self.config.wake_timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            if self._candidates(model)[0]:
                return True
        return False

    async def proxy(self, request: Request, path: str) -> Response:
        started = time.perf_counter()
        key_id, key = self._authorize(request)
        size = request.headers.get("content-length")
        if size and size.isdigit() and int(size) > self.config.max_body_bytes:
            raise ApiError(
                413,
                f"The request body is {int(size)} bytes; the most this router takes is {self.config.max_body_bytes}.",
                "invalid_request_error",
                "body_too_large",
            )
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError as exc:
            raise ApiError(
                400, f"The request body is not valid JSON: {exc}", "invalid_request_error", "invalid_json"
            ) from None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise ApiError(
                400, "The request needs a 'model' (a string).", "invalid_request_error", "missing_model", "model"
            )
        asked = body["model"]
        model = self._model(asked)
        if model is None:
            raise ApiError(
                404,
                f"The model '{asked}' does not exist; GET /v1/models lists them.",
                "invalid_request_error",
                "model_not_found",
                "model",
            )
        if key.models and asked not in key.models and model.name not in key.models:
            raise ApiError(
                403,
                f"This key may not use model '{asked}'; it may use {', '.join(key.models)}.",
                "permission_error",
                "model_not_allowed",
                "model",
            )
        checked = check_request(path, body, model, self.config.max_n)
        if checked.streaming:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        project = self.projects.items.get(key.project) or Project(name=key.project)
        scopes: list[Scope] = [
            (f"key.{key_id}", f"key '{key.name}'", key.limits),
            (f"project.{project.name}", f"project '{project.name}'", project.limits),
        ]
        now = time.time()
        verdict = await self.quota.admit(scopes, now)
        if not verdict.ok:
            headers = {**verdict.headers, "retry-after": f"{max(1, round(verdict.reset_s))}"}
            if not verdict.retry:
                headers["x-should-retry"] = "false"
            raise ApiError(
                429,
                f"Rate limit: {verdict.limit}; it resets in {verdict.reset_s:.0f}s.",
                "rate_limit_exceeded" if verdict.retry else "insufficient_quota",
                "rate_limit_exceeded" if verdict.retry else "budget_exhausted",
                headers=headers,
            )
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        request.scope.setdefault("state", {})["request_id"] = rid
        call = _Call(
            rid=rid,
            key_id=key_id,
            key=key,
            scopes=scopes,
            model=model,
            checked=checked,
            blocks=prompt_blocks(checked.prompt) if path != "/v1/embeddings" else [],
            started=started,
        )
        try:
            response = await self._forward(call, path, verdict.headers)
        except BaseException:
            await self._end(call, "")
            raise
        if not isinstance(response, Stream):
            await self._end(call, "")
        return response

    async def _forward(self, call: _Call, path: str, headers: dict[str, str]) -> Response:
        """To the primary model's best replica, else another (twice at most), else its fallbacks."""
        models = [call.model] + [m for m in (self._model(f) for f in call.model.fallbacks) if m is not None]
        for i, model in enumerate(models):
            self._tell_demand(model, time.time())
            candidates, states = self._candidates(model)
            if not candidates and i == 0 and model.scaling.idle_timeout_s is not None and await self._wake(model):
                candidates, states = self._candidates(model)
            tried: set[str] = set()
            held = await self._before_picking(call, model, path, i == 0, states)
            for attempt in range(1 + _RETRIES):
                choice, how = self.balancer.pick(candidates, call.blocks, time.time(), tried, held)
                if choice is None:
                    break
                tried.add(choice.id)
                if attempt:
                    self.metrics.retries.labels(model.name).inc()
                self.metrics.picks.labels(model.name, how).inc()
                replica = states[choice.id][0]
                answer = await self._send(call, model, replica, choice.priority, path, headers)
                if answer is not None:
                    return answer
            if i == 0 and len(models) > 1:
                self.ctx.log.info("answering from a fallback", model=model.name, fallbacks=call.model.fallbacks)
        call.status = 503
        names = " or its fallbacks" if len(models) > 1 else ""
        raise ApiError(
            503,
            f"The model '{call.model.name}'{names} has no ready replica now; try again shortly "
            "(`llmgw ctl model list` shows why).",
            "server_error",
            "no_ready_replica",
            headers={"retry-after": "5"},
        )

    async def _send(
        self, call: _Call, model: Model, replica: ReplicaState, priority: int, path: str, headers: dict[str, str]
    ) -> Response | None:
        """One try on one replica; None when it refused or failed before the first byte."""
        body = call.checked.body if model.name == call.model.name else {**call.checked.body, "model": model.name}
        self.balancer.started(replica.id)
        self.metrics.in_flight.labels(model.name, replica.id).inc()
        call.replica, call.pool = replica.id, f"priority {priority}"
        try:
            resp = await self.client.post(
                replica.url + path, data=msgspec.json.encode(body), headers=self._engine_headers(replica)
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._done(model, replica.id, ok=False)
            self.ctx.log.warning("replica refused, trying another", replica=replica.id, error=repr(exc))
            return None
        if resp.status in (502, 503, 504):
            resp.release()
            self._done(model, replica.id, ok=False)
            self.ctx.log.warning(
                "replica failed before answering, trying another", replica=replica.id, status=resp.status
            )
            return None
        out_headers = {**headers, "x-llmgw-replica": replica.id}
        call.status = resp.status
        if not call.checked.streaming or resp.status != 200:
            try:
                raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                self._done(model, replica.id, ok=False)
                self.ctx.log.warning("replica failed mid-answer, trying another", replica=replica.id, error=repr(exc))
                return None
            finally:
                resp.release()
            self._done(model, replica.id, ok=resp.status < 500)
            if resp.status == 200:
                raw = self._answer(call, model, raw)
            return Response(raw, status_code=resp.status, media_type="application/json", headers=out_headers)
        return Stream(
            self._relay(call, model, resp),
            media_type="text/event-stream",
            headers={**out_headers, "cache-control": "no-cache"},
        )

    def _done(self, model: Model, replica_id: str, ok: bool) -> None:
        self.balancer.finished(replica_id, ok, time.time())
        self.metrics.in_flight.labels(model.name, replica_id).dec()

    def _answer(self, call: _Call, model: Model, raw: bytes) -> bytes:
        """A whole (non-streamed) answer: its usage read, named as the client asked."""
        try:
            answer = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return raw
        if isinstance(answer, dict):
            call.prompt, call.cached, call.completion = usage_of(answer)
            return rewrite_chunk(answer, call.checked.body["model"], include_usage=True) or raw
        return raw

    async def _relay(self, call: _Call, model: Model, resp: aiohttp.ClientResponse):
        """The engine's SSE stream passed on, rewritten; one write per read from the engine (the
        events that arrived together leave together)."""
        ok = False
        try:
            pending = b""
            async for piece in resp.content.iter_any():
                *lines, pending = (pending + piece).split(b"\n")
                out = [self._event(call, line) for line in lines]
                if any(out):
                    yield b"".join(o for o in out if o)
            if pending.strip():
                yield self._event(call, pending) or b""
            ok = True
        except (aiohttp.ClientError, TimeoutError) as exc:
            call.status = 502
            err = ApiError(502, f"The replica failed mid-answer: {exc}", "server_error", "upstream_failed")
            yield b"event: error\ndata: " + msgspec.json.encode(err.body()) + b"\n\n"
        finally:  # also when the client went away: its slot and its concurrency count are freed now
            if ok:
                resp.release()  # the connection goes back to the pool
            else:
                resp.close()
            self._done(model, call.replica, ok=ok)
            if not ok and call.status == 200:
                call.status = 499  # the client disconnected
            await self._end(call, model.name)

    def _event(self, call: _Call, line: bytes) -> bytes | None:
        """One SSE line of the engine's as the client gets it (None: nothing to send)."""
        line = line.rstrip(b"\r")
        if not line.startswith(b"data:"):
            return None
        data = line[5:].strip()
        if data == b"[DONE]":
            return b"data: [DONE]\n\n"
        if call.ttft is None:
            call.ttft = time.perf_counter() - call.started
        try:
            chunk = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return b"data: " + data + b"\n\n"
        if not isinstance(chunk, dict):
            return b"data: " + data + b"\n\n"
        if chunk.get("usage") or chunk.get("timings"):
            prompt, cached, completion = usage_of(chunk)
            if chunk.get("usage"):
                call.prompt, call.completion = prompt, completion
            call.cached = cached if cached or call.cached is None else call.cached
        out = rewrite_chunk(chunk, call.checked.body["model"], call.checked.include_usage)
        return b"data: " + out + b"\n\n" if out is not None else None

    async def _end(self, call: _Call, served_by: str) -> None:
        """A request ended: limits released and spent, affinity learnt, usage and metrics recorded."""
        now = time.time()
        task = asyncio.create_task(self.quota.finish(call.scopes, call.prompt + call.completion, now))
        self.tasks.append(task)  # off the hot path: the answer does not wait for the counters
        task.add_done_callback(self.tasks.remove)
        if call.replica and call.status == 200 and call.blocks:
            self.balancer.served(call.replica, call.blocks, call.prompt, call.cached)
        name = served_by or call.model.name
        latency = time.perf_counter() - call.started
        self.metrics.requests.labels(name, call.pool, str(call.status)).inc()
        self.metrics.latency.labels(name, call.pool).observe(latency)
        if call.ttft is not None:
            self.metrics.ttft.labels(name, call.pool).observe(call.ttft)
        for kind, n in (("prompt", call.prompt), ("cached", call.cached or 0), ("completion", call.completion)):
            if n:
                self.metrics.tokens.labels(name, kind).inc(n)
        if not call.replica:
            return
        try:
            self.usage.put_nowait(
                UsageRecord(
                    request_id=call.rid,
                    time=now,
                    key=call.key_id,
                    project=call.key.project,
                    model=name,
                    replica=call.replica,
                    status=call.status,
                    prompt_tokens=call.prompt,
                    cached_tokens=call.cached or 0,
                    completion_tokens=call.completion,
                    latency_s=latency,
                    ttft_s=call.ttft,
                )
            )
        except asyncio.QueueFull:
            self.ctx.log.warning("usage queue full: a request's usage is not recorded", request=call.rid)


def _names(catalog: dict[str, CatalogRecord]) -> dict[str, str]:
    names = {}
    for name, record in catalog.items():
        names[name] = name
        for alias in record.model.aliases:
            names.setdefault(alias, name)
    return names


def main(argv: list[str] | None = None) -> int:
    """Run the router."""
    config = load_config(RouterConfig, argv)
    return run(Router(config), config)


if __name__ == "__main__":
    sys.exit(main())
