"""The router: an OpenAI-compatible endpoint (Litestar) proxying to ready replicas."""

from __future__ import annotations

import secrets
import sys
import time
import uuid
from collections import defaultdict

import httpx
import msgspec
from litestar import Litestar, Request, get, post
from litestar.connection import ASGIConnection
from litestar.exceptions import ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.response import Response, Stream

from llmgw.bus import BusConfig, Context, HttpServer, KvTable, load_config, run
from llmgw.proto import BUCKETS, CatalogRecord, KeyCreate, KeyCreated, KeyRecord, ReplicaState, Subjects
from llmgw.router.admin import admin_api
from llmgw.router.core import ApiError, key_hash, pick, rewrite_chunk

__all__ = ["Router", "RouterConfig", "main"]

_RETRIES = 2


class RouterConfig(BusConfig, kw_only=True):
    """Router settings."""

    http_host: str = "127.0.0.1"
    http_port: int = 8080
    """Port of the OpenAI endpoint; 0 picks a free one."""
    upstream_timeout_s: float = 600.0
    """Longest an engine may take to answer."""


class Router:
    """Keeps what it routes by in memory, fed by KV watches (not polls)."""

    name = "router"
    version = "0.1.0"
    description = "OpenAI-compatible gateway"

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.catalog: KvTable[CatalogRecord] | None = None
        self.replicas: KvTable[ReplicaState] | None = None
        self.keys: KvTable[KeyRecord] | None = None
        self.outstanding: dict[str, int] = defaultdict(int)
        self.http: HttpServer | None = None
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(config.upstream_timeout_s, connect=3.0))
        self.ctx: Context | None = None

    async def start(self, ctx: Context) -> None:
        self.ctx = ctx
        self.catalog = await KvTable.open(ctx.js, BUCKETS["catalog"], CatalogRecord, history=5)
        self.replicas = await KvTable.open(ctx.js, BUCKETS["replicas"], ReplicaState)
        self.keys = await KvTable.open(ctx.js, BUCKETS["keys"], KeyRecord)
        await ctx.endpoint("key-create", Subjects.ROUTER_KEY_CREATE, KeyCreate, self.create_key)
        self.http = HttpServer(self.app(), self.config.http_host, self.config.http_port)
        await self.http.start()
        ctx.log.info("openai endpoint", url=f"{self.http.url}/v1")

    async def stop(self) -> None:
        if self.http:
            await self.http.stop()
        for table in (self.catalog, self.replicas, self.keys):
            if table:
                table.stop()
        await self.client.aclose()

    def ready(self) -> bool:
        tables = (self.catalog, self.replicas, self.keys)
        return self.http is not None and all(t and t.synced for t in tables)

    async def create_key(self, req: KeyCreate) -> KeyCreated:
        key = "sk-llmgw-" + secrets.token_urlsafe(32)
        record = KeyRecord(name=req.name, created=time.time(), admin=req.admin)
        await self.keys.kv.put(key_hash(key), msgspec.json.encode(record))
        self.keys.items[key_hash(key)] = record  # usable at once, before the watch delivers it
        return KeyCreated(name=req.name, key=key)

    # -- HTTP ----------------------------------------------------------------------------
    def _authorize(self, request: ASGIConnection, admin: bool = False) -> KeyRecord:
        auth = request.headers.get("authorization", "")
        if not auth.lower().startswith("bearer "):
            raise ApiError(401, "Missing API key: send 'Authorization: Bearer <key>'.", "invalid_request_error", "missing_api_key")
        record = self.keys.items.get(key_hash(auth[7:].strip()))
        if record is None:
            raise ApiError(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        if admin and not record.admin:
            raise ApiError(403, "This key may not use the admin API; use an admin key.", "permission_error", "not_admin")
        return record

    def app(self) -> Litestar:
        router = self

        @get("/v1/models")
        async def list_models(request: Request) -> dict:
            router._authorize(request)
            return {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "llmgw"} for m in sorted(router.catalog.items)
            ]}

        @post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await router.proxy(request, "/v1/chat/completions")

        @post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await router.proxy(request, "/v1/completions")

        def on_api_error(request: Request, exc: ApiError) -> Response:
            return Response(exc.body(), status_code=exc.status, headers=exc.headers)

        def on_invalid(request: Request, exc: ValidationException) -> Response:
            extra = "; ".join(str(e.get("message", e)) for e in (exc.extra or []) if isinstance(e, dict))
            err = ApiError(400, f"{exc.detail}{': ' + extra if extra else ''}", "invalid_request_error", "invalid_body")
            return on_api_error(request, err)

        async def add_request_id(message, scope) -> None:
            if message["type"] == "http.response.start":
                rid = scope.setdefault("state", {}).setdefault("request_id", uuid.uuid4().hex)
                message.setdefault("headers", []).append((b"x-request-id", rid.encode()))

        return Litestar(
            [list_models, chat, completions, admin_api(router)], exception_handlers={ApiError: on_api_error, ValidationException: on_invalid},
            before_send=[add_request_id],
            openapi_config=OpenAPIConfig(title="llmgw", version=router.version, path="/schema"),
        )

    async def proxy(self, request: Request, path: str) -> Response:
        self._authorize(request)
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError as exc:
            raise ApiError(400, f"The request body is not valid JSON: {exc}", "invalid_request_error", "invalid_json") from None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise ApiError(400, "The request needs a 'model' (a string).", "invalid_request_error", "missing_model", "model")
        name = body["model"]
        if name not in self.catalog.items:
            raise ApiError(404, f"The model '{name}' does not exist; GET /v1/models lists them.",
                           "invalid_request_error", "model_not_found", "model")
        streaming = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if streaming:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        tried: set[str] = set()
        for _ in range(1 + _RETRIES):
            replica = pick([r for r in self.replicas.items.values() if r.model == name], self.outstanding, tried)
            if replica is None:
                break
            tried.add(replica.id)
            upstream = self.client.build_request(
                "POST", replica.url + path, json=body, headers={"authorization": f"Bearer {replica.api_key}"}
            )
            self.outstanding[replica.id] += 1
            try:
                resp = await self.client.send(upstream, stream=True)
            except httpx.TransportError as exc:
                self.outstanding[replica.id] -= 1
                self.ctx.log.warning("replica refused, trying another", replica=replica.id, error=str(exc))
                continue
            if not streaming or resp.status_code != 200:
                try:
                    raw = await resp.aread()
                finally:
                    await resp.aclose()
                    self.outstanding[replica.id] -= 1
                if resp.status_code == 200:
                    raw = rewrite_chunk(raw, name, include_usage=True) or raw
                return Response(raw, status_code=resp.status_code, media_type="application/json")
            return Stream(self._relay(resp, replica.id, name, include_usage), media_type="text/event-stream",
                          headers={"cache-control": "no-cache"})
        raise ApiError(503, f"The model '{name}' has no ready replica yet; try again shortly.",
                       "server_error", "no_ready_replica", headers={"retry-after": "5"})

    async def _relay(self, resp: httpx.Response, replica_id: str, model: str, include_usage: bool):
        try:
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    yield b"data: [DONE]\n\n"
                    continue
                out = rewrite_chunk(data.encode(), model, include_usage)
                if out is not None:
                    yield b"data: " + out + b"\n\n"
        except httpx.HTTPError as exc:
            err = ApiError(502, f"The replica failed mid-answer: {exc}", "server_error", "upstream_failed")
            yield b"event: error\ndata: " + msgspec.json.encode(err.body()) + b"\n\n"
        finally:
            await resp.aclose()
            self.outstanding[replica_id] -= 1


def main(argv: list[str] | None = None) -> int:
    """Run the router."""
    config = load_config(RouterConfig, argv)
    return run(Router(config), config)


if __name__ == "__main__":
    sys.exit(main())
