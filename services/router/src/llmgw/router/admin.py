"""The admin API under /api/v1/, for admin keys only: the catalog's operations over HTTP, and
the router's own keys, projects and usage.

Each route is a thin translation to the catalog's NATS request; its errors keep their
meaning (400, 404, 409) and come back in the OpenAI error body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from litestar import Request, Router, delete, get, post, put
from litestar.connection import ASGIConnection

from llmgw.bus import BusError, request
from llmgw.proto import (
    ChangeSpec,
    Empty,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyRef,
    Model,
    ModelChange,
    ModelEntry,
    ModelList,
    ModelPurge,
    ModelPut,
    ModelRef,
    Project,
    PurgeReport,
    Subjects,
    UsageQuery,
    UsageReport,
)
from llmgw.router.core import ApiError

if TYPE_CHECKING:
    from llmgw.router.service import Router as LlmgwRouter

__all__ = ["admin_api"]

_TYPES = {"400": "invalid_request_error", "404": "not_found_error", "409": "conflict_error"}


def admin_api(router: LlmgwRouter) -> Router:
    """The /api/v1 routes, bound to `router`'s NATS connection and keys."""

    def admin_only(connection: ASGIConnection, _handler) -> None:
        """Runs before the body is read: no admin key, no further."""
        connection.state.key = router._authorize(connection, admin=True)[1]

    async def call(req: Request, subject: str, message: msgspec.Struct, reply: type, timeout: float = 10.0):
        router.ctx.log.info("admin call", subject=subject, key=req.state.key.name)
        try:
            return await request(router.ctx.nc, subject, message, reply, timeout=timeout)
        except BusError as exc:
            raise ApiError(
                int(exc.code), exc.message, _TYPES.get(exc.code, "server_error"), f"catalog_{exc.code}"
            ) from None

    @get("/models")
    async def list_models(request: Request) -> ModelList:
        """Every model in the catalog."""
        return await call(request, Subjects.CATALOG_MODEL_LIST, Empty(), ModelList)

    @get("/models/{name:str}")
    async def get_model(request: Request, name: str) -> ModelEntry:
        """One model with its revision."""
        return await call(request, Subjects.CATALOG_MODEL_GET, _ref(name), ModelEntry)

    @put("/models/{name:str}")
    async def put_model(request: Request, name: str, data: Model, revision: int | None = None) -> ModelEntry:
        """Create or replace a model; `?revision=` makes it compare-and-set (0: must not exist)."""
        if data.name != name:
            raise ApiError(
                400,
                f"the body names model '{data.name}' but the path '{name}'",
                "invalid_request_error",
                "name_mismatch",
            )
        put_ = ModelPut(model=data, revision=revision, by=request.state.key.name)
        return await call(request, Subjects.CATALOG_MODEL_PUT, put_, ModelEntry)

    @post("/models/{name:str}/change", status_code=200)
    async def change_model(request: Request, name: str, data: ChangeSpec) -> ModelEntry:
        """Stop, start, restart, scale, replicas per profile, context, GPUs, class, owner or aliases."""
        try:
            change = msgspec.convert(
                {**msgspec.to_builtins(data), "name": name, "by": request.state.key.name}, ModelChange
            )
        except msgspec.ValidationError as exc:
            raise ApiError(400, f"change of '{name}': {exc}", "invalid_request_error", "invalid_change") from None
        return await call(request, Subjects.CATALOG_MODEL_CHANGE, change, ModelEntry)

    @delete("/models/{name:str}", status_code=200)
    async def remove_model(request: Request, name: str) -> ModelEntry:
        """Remove a model from the catalog (its files stay)."""
        return await call(request, Subjects.CATALOG_MODEL_REMOVE, _ref(name), ModelEntry)

    @post("/models/{name:str}/purge", status_code=200)
    async def purge_model(request: Request, name: str) -> PurgeReport:
        """Remove a model and, once its replicas stopped, delete its files from the mirror and the nodes
        (keeping any file another model uses); says what it deleted and what it kept."""
        purge = ModelPurge(name=_ref(name).name, by=request.state.key.name)
        return await call(request, Subjects.CATALOG_MODEL_PURGE, purge, PurgeReport, timeout=150.0)

    @get("/keys")
    async def list_keys(request: Request) -> KeyList:
        """Every key by id, with its project, models, limits and expiry (never the key)."""
        return await router.list_keys(Empty())

    @post("/keys", status_code=201)
    async def create_key(request: Request, data: KeyCreate) -> KeyCreated:
        """A new key: the answer is the only time it is shown."""
        router.ctx.log.info("key created", name=data.name, project=data.project, by=request.state.key.name)
        return await router.create_key(data)

    @delete("/keys/{key_id:str}", status_code=200)
    async def revoke_key(request: Request, key_id: str) -> KeyList:
        """Revoke a key by id: it stops working at once on every router."""
        try:
            ref = msgspec.convert({"id": key_id}, KeyRef)
        except msgspec.ValidationError:
            raise ApiError(
                400,
                f"'{key_id}' is not a key id (16 hex digits; GET /api/v1/keys lists them)",
                "invalid_request_error",
                "bad_key_id",
            ) from None
        try:
            return await router.revoke_key(ref)
        except BusError as exc:
            raise ApiError(404, exc.message, "not_found_error", "key_not_found") from None

    @put("/projects/{name:str}")
    async def put_project(request: Request, name: str, data: Project) -> Project:
        """Create a project or change its limits (they hold for all its keys together)."""
        if data.name != name:
            raise ApiError(
                400,
                f"the body names project '{data.name}' but the path '{name}'",
                "invalid_request_error",
                "name_mismatch",
            )
        return await router.put_project(data)

    @get("/usage")
    async def usage(request: Request, since: float = 0.0, group_by: str = "model") -> UsageReport:
        """Requests and tokens since a Unix time, summed by model, project, key or replica."""
        try:
            query = msgspec.convert({"since": since, "group_by": group_by}, UsageQuery)
        except msgspec.ValidationError as exc:
            raise ApiError(400, f"usage query: {exc}", "invalid_request_error", "bad_query") from None
        return await router.sum_usage(query)

    return Router(
        "/api/v1",
        route_handlers=[
            list_models,
            get_model,
            put_model,
            change_model,
            remove_model,
            purge_model,
            list_keys,
            create_key,
            revoke_key,
            put_project,
            usage,
        ],
        guards=[admin_only],
    )


def _ref(name: str) -> ModelRef:
    try:
        return msgspec.convert({"name": name}, ModelRef)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"model name '{name}': {exc}", "invalid_request_error", "bad_name") from None
