"""The admin API under /api/v1/, for admin keys only: the operators' endpoints of the catalog and
the mirror (their routes made from the endpoint tables: `operations.py`), the model changes that
check more than a message can (the name in the path and the body, a revision's bounds), and the
router's own keys, projects and usage.

A service's errors keep their meaning (400, 404, 409) and come back in the OpenAI error body.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Router, delete, get, post, put
from litestar.connection import ASGIConnection
from litestar.di import Provide
from nats.aio.client import Client
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmgw.bus import BusError, get_logger
from llmgw.proto import (
    Empty,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyRef,
    Model,
    ModelChange,
    ModelEntry,
    ModelPurge,
    ModelPut,
    ModelRef,
    Project,
    PurgeReport,
    UsageQuery,
    UsageReport,
    catalog,
    mirror,
    people,
    router,
    scheduler,
)
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.admin.operations import ask, operator_routes
from llmgw.router.errors import (
    BadKeyId,
    BadName,
    BadQuery,
    BadRevision,
    InvalidChange,
    KeyNotFound,
    NameMismatch,
    refused,
)
from llmgw.router.request.prepare import check_body

__all__ = ["admin_api", "metrics_route"]

_log = get_logger("router")

_LATEST = 253_402_300_799.0
"""The last second of the year 9999: the latest `since` a usage query may name."""


def _admin_only(accounts: Accounts):
    def admin_only(connection: ASGIConnection, _handler) -> None:
        """Runs before the body is read: no admin key, no further."""
        connection.state.key = accounts.authorize(connection.headers.get("authorization", ""), admin=True)[1]

    return admin_only


def metrics_route(accounts: Accounts, registry: CollectorRegistry) -> Router:
    """GET /metrics on the HTTP port, for an admin key (Prometheus: `authorization:
    {credentials_file: ...}`): the router's series, as its admin port serves them. The fleet's
    gauges are the scheduler's and the mirror's, on their admin ports."""

    @get("/", media_type=CONTENT_TYPE_LATEST)
    async def scrape() -> bytes:
        """The router's Prometheus series."""
        return generate_latest(registry)

    return Router("/metrics", route_handlers=[scrape], guards=[_admin_only(accounts)], include_in_schema=False)


def admin_api(accounts: Accounts, nc: Client) -> Router:
    """The /api/v1 routes: the catalog's over `nc`, the keys, projects and usage of `accounts`
    (both given to the routes as dependencies)."""
    admin_only = _admin_only(accounts)

    return Router(
        "/api/v1",
        route_handlers=[
            *operator_routes(
                (*catalog.ENDPOINTS, *mirror.ENDPOINTS, *scheduler.ENDPOINTS, *router.ENDPOINTS, *people.ENDPOINTS)
            ),
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
        before_request=_readable_body,
        dependencies={
            "accounts": Provide(lambda: accounts, sync_to_thread=False),
            "nc": Provide(lambda: nc, sync_to_thread=False),
        },
    )


async def _readable_body(request: Request) -> None:
    """Runs after the key is checked, before Litestar reads the body into the route's message:
    sent as JSON (415 else) and nested no deeper than the router reads (400)."""
    if request.method in ("POST", "PUT", "PATCH"):
        check_body(request.headers.get("content-type"), await request.body())


@put("/models/{name:str}")
async def put_model(request: Request, nc: Client, name: str, data: Model, revision: int | None = None) -> ModelEntry:
    """Create or replace a model; `?revision=` makes it compare-and-set (0: must not exist)."""
    if data.name != name:
        raise NameMismatch(f"the body names model '{data.name}' but the path '{name}'")
    _check_revision(revision)
    by = request.state.key.name
    return await ask(nc, catalog.MODEL_PUT, ModelPut(model=data, revision=revision, by=by), by)


@post("/models/{name:str}/change", status_code=200)
async def change_model(request: Request, nc: Client, name: str, data: dict[str, Any]) -> ModelEntry:
    """Stop, start, restart, scale, replicas per profile, context, GPUs, class, owner or aliases: the
    body is one change, `{"action": "scale", "scaling": {...}}`, as `catalog.model.change` takes it
    without the name (the path gives it) and who asks (the key's name)."""
    by = request.state.key.name
    return await ask(nc, catalog.MODEL_CHANGE, _change(name, data, by), by)


@delete("/models/{name:str}", status_code=200)
async def remove_model(request: Request, nc: Client, name: str, revision: int | None = None) -> ModelEntry:
    """Remove a model from the catalog (its files stay); `?revision=` removes it only at that
    revision (409 else)."""
    _check_revision(revision)
    ref = msgspec.structs.replace(_ref(name), revision=revision, by=request.state.key.name)
    return await ask(nc, catalog.MODEL_REMOVE, ref, request.state.key.name)


@post("/models/{name:str}/purge", status_code=200)
async def purge_model(request: Request, nc: Client, name: str, revision: int | None = None) -> PurgeReport:
    """Remove a model and, once its replicas stopped, delete its files from the mirror and the nodes
    (keeping any file another model uses); says what it deleted and what it kept. `?revision=`:
    only at that revision (409 else)."""
    _check_revision(revision)
    purge = ModelPurge(name=_ref(name).name, by=request.state.key.name, revision=revision)
    return await ask(nc, catalog.MODEL_PURGE, purge, purge.by)


@get("/keys")
async def list_keys(accounts: Accounts) -> KeyList:
    """Every key by id, with its project, models, limits and expiry (never the key)."""
    return await accounts.list_keys(Empty())


@post("/keys", status_code=201)
async def create_key(request: Request, accounts: Accounts, data: KeyCreate) -> KeyCreated:
    """A new key: the answer is the only time it is shown."""
    try:
        made = await accounts.create_key(msgspec.structs.replace(data, by=request.state.key.name))
    except BusError as exc:  # a tenant there is not
        raise refused("router", exc.code, exc.message) from None
    _log.info("key created", name=data.name, project=data.project, by=request.state.key.name)
    return made


@delete("/keys/{key_id:str}", status_code=200)
async def revoke_key(request: Request, accounts: Accounts, key_id: str) -> KeyList:
    """Revoke a key by id: it stops working at once on every router."""
    try:
        ref = msgspec.convert({"id": key_id, "by": request.state.key.name}, KeyRef)
    except msgspec.ValidationError:
        raise BadKeyId(f"'{key_id}' is not a key id (16 hex digits; GET /api/v1/keys lists them)") from None
    try:
        return await accounts.revoke_key(ref)
    except BusError as exc:
        raise KeyNotFound(exc.message) from None


@put("/projects/{name:str}")
async def put_project(request: Request, accounts: Accounts, name: str, data: Project) -> Project:
    """Create a project or change its limits (they hold for all its keys together)."""
    if data.name != name:
        raise NameMismatch(f"the body names project '{data.name}' but the path '{name}'")
    return await accounts.put_project(msgspec.structs.replace(data, by=request.state.key.name))


@get("/usage")
async def usage(accounts: Accounts, since: float = 0.0, group_by: str = "model") -> UsageReport:
    """Requests and tokens since a Unix time, summed by model, project, key or replica."""
    if not 0 <= since <= _LATEST:  # NaN too
        raise BadQuery(f"usage query: 'since' is {since}; it must be a Unix time in seconds, from 0 to {_LATEST:.0f}")
    try:
        query = msgspec.convert({"since": since, "group_by": group_by}, UsageQuery)
    except msgspec.ValidationError as exc:
        raise BadQuery(f"usage query: {exc}") from None
    return await accounts.sum_usage(query)


def _check_revision(revision: int | None) -> None:
    if revision is not None and not 0 <= revision <= catalog.MOST_REVISION:
        raise BadRevision(
            f"'revision' is {revision}; it must be from 0 (must not exist yet) to {catalog.MOST_REVISION}"
        )


def _change(name: str, body: dict[str, Any], by: str) -> ModelChange:
    """The catalog's change message for what the admin API was sent about model `name`."""
    try:
        return msgspec.convert({**body, "name": name, "by": by}, ModelChange)
    except msgspec.ValidationError as exc:
        raise InvalidChange(f"change of '{name}': {exc}") from None


def _ref(name: str) -> ModelRef:
    try:
        return msgspec.convert({"name": name}, ModelRef)
    except msgspec.ValidationError as exc:
        raise BadName(f"model name '{name}': {exc}") from None
