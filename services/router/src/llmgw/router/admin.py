"""The admin API under /api/v1/: the catalog's operations over HTTP, for admin keys only.

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
    Model,
    ModelChange,
    ModelEntry,
    ModelList,
    ModelPurge,
    ModelPut,
    ModelRef,
    PurgeReport,
    Subjects,
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
        connection.state.key = router._authorize(connection, admin=True)

    async def call(req: Request, subject: str, message: msgspec.Struct, reply: type, timeout: float = 10.0):
        router.ctx.log.info("admin call", subject=subject, key=req.state.key.name)
        try:
            return await request(router.ctx.nc, subject, message, reply, timeout=timeout)
        except BusError as exc:
            raise ApiError(int(exc.code), exc.message, _TYPES.get(exc.code, "server_error"), f"catalog_{exc.code}") from None

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
            raise ApiError(400, f"the body names model '{data.name}' but the path '{name}'", "invalid_request_error", "name_mismatch")
        put_ = ModelPut(model=data, revision=revision, by=request.state.key.name)
        return await call(request, Subjects.CATALOG_MODEL_PUT, put_, ModelEntry)

    @post("/models/{name:str}/change", status_code=200)
    async def change_model(request: Request, name: str, data: ChangeSpec) -> ModelEntry:
        """Stop, start, restart, scale, replicas per profile, context, GPUs, class, owner or aliases."""
        try:
            change = msgspec.convert({**msgspec.to_builtins(data), "name": name, "by": request.state.key.name}, ModelChange)
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

    return Router("/api/v1", route_handlers=[list_models, get_model, put_model, change_model, remove_model, purge_model],
                  guards=[admin_only])


def _ref(name: str) -> ModelRef:
    try:
        return msgspec.convert({"name": name}, ModelRef)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"model name '{name}': {exc}", "invalid_request_error", "bad_name") from None
