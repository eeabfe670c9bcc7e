"""Operators' operations as the router's faces ask them: `ask` (the admin API and the web console
call it; `llmgw ctl` calls `llmgw.bus.call` the same way) and the admin API's routes made from the
endpoint tables (`Endpoint.admin`), with their OpenAPI.

An operation is written once: its endpoint in proto says its subject, messages, timeout and admin
route; the service answers it; here it becomes a route, and a refusal becomes the same HTTP
status and body on every face (`errors.refused`).
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Iterable
from typing import Annotated, Any, get_args, get_origin

import msgspec
from litestar import Request, route
from litestar.handlers import HTTPRouteHandler
from nats.aio.client import Client

from llmgw.bus import BusError, call, get_logger
from llmgw.proto import Endpoint, plainly
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.admin.scoped import narrowed_ask, narrowed_reply
from llmgw.router.errors import ApiError, InvalidRequest, refused

__all__ = ["ask", "operator_routes"]

_log = get_logger("router")


async def ask(
    nc: Client, endpoint: Endpoint, message: msgspec.Struct, by: str = "", within: float | None = None
) -> Any:
    """What `endpoint` answers (within its `timeout_s`, or `within` for a part a page is drawn
    without); its refusal raised as the `ApiError` every face answers with. `by`: who asks."""
    _log.info("operator call", subject=endpoint.subject(), by=by)
    try:
        return await call(nc, endpoint, message, timeout=within)
    except BusError as exc:
        raise refused(endpoint.service, exc.code, exc.message) from None


def operator_routes(endpoints: Iterable[Endpoint]) -> list[HTTPRouteHandler]:
    """A route for each endpoint with an admin route (the rest are left out)."""
    return [_route(e) for e in endpoints if e.admin is not None]


def _plain(tp: Any) -> Any:
    """A field's type as a query parameter is declared (its msgspec constraints are checked after)."""
    return get_args(tp)[0] if get_origin(tp) is Annotated else tp


def _route(endpoint: Endpoint) -> HTTPRouteHandler:
    admin = endpoint.admin
    assert admin is not None
    params = [name for _, name, _, _ in string.Formatter().parse(admin.path) if name]
    made = {field: template for field, template in admin.fields} | {p: f"{{{p}}}" for p in params}
    fields = {f.name: f for f in msgspec.structs.fields(endpoint.request)}
    made = {field: template for field, template in made.items() if field in fields}
    body = admin.method in ("POST", "PUT") and admin.body
    # a path or query value it cannot take: named for the path's first field, or the query
    bad = f"bad_{next(iter(made), 'query')}"

    async def handler(request: Request, nc: Client, accounts: Accounts, **values: Any) -> Any:
        raw = {field: template.format(**values) for field, template in made.items()}
        if body:
            raw = msgspec.to_builtins(values["data"]) | raw
        else:
            asked = {name: value for name, value in values.items() if value is not None and name not in made}
            raw |= {name: value for name, value in asked.items() if name in fields}
        who = request.state.who
        if "by" in fields:
            raw["by"] = who.name
        try:
            message = msgspec.convert(raw, endpoint.request, strict=False)
        except msgspec.ValidationError as exc:
            raise _bad(bad, f"{endpoint.name}: {plainly(exc)}") from None
        message = await narrowed_ask(who, endpoint, message, accounts)
        return await narrowed_reply(who, endpoint, message, await ask(nc, endpoint, message, who.name), accounts)

    signature = [
        inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, annotation=Request),
        inspect.Parameter("nc", inspect.Parameter.KEYWORD_ONLY, annotation=Client),
        inspect.Parameter("accounts", inspect.Parameter.KEYWORD_ONLY, annotation=Accounts),
        *(inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=str) for p in params),
    ]
    if body:  # a body whose message the path completes is read as JSON, then checked with the path's fields
        shape = dict[str, Any] if made else endpoint.request
        signature.append(inspect.Parameter("data", inspect.Parameter.KEYWORD_ONLY, annotation=shape))
    else:
        for name, f in fields.items():
            if name in made or name == "by":
                continue
            default = None if f.default is msgspec.NODEFAULT else f.default
            annotation = _plain(f.type) if default is not None else _plain(f.type) | None
            signature.append(
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
            )
    handler.__signature__ = inspect.Signature(signature, return_annotation=endpoint.reply)
    handler.__annotations__ = {p.name: p.annotation for p in signature} | {"return": endpoint.reply}
    handler.__name__ = handler.__qualname__ = endpoint.name.replace(".", "_")
    handler.__doc__ = endpoint.doc
    path = admin.path.replace("}", ":str}")
    return route(
        path,
        http_method=[admin.method],
        status_code=admin.status,
        summary=endpoint.doc,
        operation_id=f"{endpoint.service}.{endpoint.name}",
        tags=[endpoint.service],
        opt={"least": admin.least},
    )(handler)


def _bad(code: str, message: str) -> ApiError:
    error = InvalidRequest(message)
    error.code = code
    return error
