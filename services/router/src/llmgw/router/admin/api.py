"""The admin API under /api/v1/: the operators' endpoints of every service, the router's keys,
projects, usage and people among them (their routes made from the endpoint tables:
`operations.py`), and the model changes that check more than a message can (the name in the path
and the body, a revision's bounds).

An admin key acts for an admin of the fleet; a key a user owns for that user, with its roles as
they are now: each route names the least role it takes, and `scoped.py` narrows what a member
or an operator asks and sees by the one rule every face follows.

A service's errors keep their meaning (400, 404, 409) and come back in the OpenAI error body.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Router, delete, get, post, put
from litestar.connection import ASGIConnection
from litestar.di import Provide
from litestar.handlers import BaseRouteHandler
from nats.aio.client import Client
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmgw.proto import (
    Model,
    ModelChange,
    ModelEntry,
    ModelPurge,
    ModelPut,
    ModelRef,
    PurgeReport,
    catalog,
    knowledge,
    mirror,
    people,
    providers,
    router,
    scheduler,
    tools,
)
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.admin.operations import ask, operator_routes
from llmgw.router.admin.scoped import check_model
from llmgw.router.errors import (
    BadName,
    BadRevision,
    InvalidChange,
    NameMismatch,
    NotAdmin,
)
from llmgw.router.request.prepare import check_body

__all__ = ["admin_api", "metrics_route"]


def _who_may(accounts: Accounts):
    def who_may(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
        """Runs before the body is read: whose key it is, and whether its role reaches the route's."""
        who = accounts.principal(connection.headers.get("authorization", ""))
        least = handler.opt.get("least", "admin")
        if not who.calls(least):
            raise NotAdmin(f"This needs the {least} role; your key's user has {who.role}.")
        connection.state.who = who

    return who_may


def metrics_route(accounts: Accounts, registry: CollectorRegistry) -> Router:
    """GET /metrics on the HTTP port, for an admin key (Prometheus: `authorization:
    {credentials_file: ...}`): the router's series, as its admin port serves them. The fleet's
    gauges are the scheduler's and the mirror's, on their admin ports."""

    @get("/", media_type=CONTENT_TYPE_LATEST)
    async def scrape() -> bytes:
        """The router's Prometheus series."""
        return generate_latest(registry)

    return Router("/metrics", route_handlers=[scrape], guards=[_who_may(accounts)], include_in_schema=False)


def admin_api(accounts: Accounts, nc: Client) -> Router:
    """The /api/v1 routes: the catalog's over `nc`, the keys, projects and usage of `accounts`
    (both given to the routes as dependencies)."""
    return Router(
        "/api/v1",
        route_handlers=[
            *operator_routes(
                (
                    *catalog.ENDPOINTS,
                    *mirror.ENDPOINTS,
                    *scheduler.ENDPOINTS,
                    *router.ENDPOINTS,
                    *people.ENDPOINTS,
                    *knowledge.ENDPOINTS,
                    *tools.ENDPOINTS,
                    *providers.ENDPOINTS,
                )
            ),
            put_model,
            change_model,
            remove_model,
            purge_model,
        ],
        guards=[_who_may(accounts)],
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


_OPERATORS = {"least": "operator"}
"""A route for operators: the models its tenants may use (`scoped.check_model`)."""


@put("/models/{name:str}", opt=_OPERATORS)
async def put_model(
    request: Request, nc: Client, accounts: Accounts, name: str, data: Model, revision: int | None = None
) -> ModelEntry:
    """Create or replace a model; `?revision=` makes it compare-and-set (0: must not exist)."""
    check_model(request.state.who, name, accounts)
    if data.name != name:
        raise NameMismatch(f"the body names model '{data.name}' but the path '{name}'")
    _check_revision(revision)
    by = request.state.who.name
    return await ask(nc, catalog.MODEL_PUT, ModelPut(model=data, revision=revision, by=by), by)


@post("/models/{name:str}/change", status_code=200, opt=_OPERATORS)
async def change_model(request: Request, nc: Client, accounts: Accounts, name: str, data: dict[str, Any]) -> ModelEntry:
    """Stop, start, restart, scale, replicas per profile, context, GPUs, resources, class, owner,
    aliases or adapters: the body is one change, `{"action": "scale", "scaling": {...}}`, as
    `catalog.model.change` takes it without the name (the path gives it) and who asks (the key's
    name)."""
    check_model(request.state.who, name, accounts)
    by = request.state.who.name
    return await ask(nc, catalog.MODEL_CHANGE, _change(name, data, by), by)


@delete("/models/{name:str}", status_code=200, opt=_OPERATORS)
async def remove_model(
    request: Request, nc: Client, accounts: Accounts, name: str, revision: int | None = None
) -> ModelEntry:
    """Remove a model from the catalog (its files stay); `?revision=` removes it only at that
    revision (409 else)."""
    check_model(request.state.who, name, accounts)
    _check_revision(revision)
    ref = msgspec.structs.replace(_ref(name), revision=revision, by=request.state.who.name)
    return await ask(nc, catalog.MODEL_REMOVE, ref, request.state.who.name)


@post("/models/{name:str}/purge", status_code=200, opt=_OPERATORS)
async def purge_model(
    request: Request, nc: Client, accounts: Accounts, name: str, revision: int | None = None
) -> PurgeReport:
    """Remove a model and, once its replicas stopped, delete its files from the mirror and the nodes
    (keeping any file another model uses); says what it deleted and what it kept. `?revision=`:
    only at that revision (409 else)."""
    check_model(request.state.who, name, accounts)
    _check_revision(revision)
    purge = ModelPurge(name=_ref(name).name, by=request.state.who.name, revision=revision)
    return await ask(nc, catalog.MODEL_PURGE, purge, purge.by)


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
