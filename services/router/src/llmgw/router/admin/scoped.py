"""The admin API for someone who is not an admin of the fleet: the one rule
(`accounts/access.py`) applied to an operation's message before it is asked and to its reply
after. A member asks for its own keys, usage and requests; an operator also for the models its
tenants may use (the fleet's replicas of those only), the mirror, the nodes and their audit
trail. What is not theirs reads as what
is not there (the same 404 words either way), so nothing leaks."""

from __future__ import annotations

from typing import Any

import msgspec

from llmgw.proto import Empty, Endpoint, Page, catalog, knowledge, people, router, scheduler, tools
from llmgw.proto.people import Role
from llmgw.router.accounts.access import Principal
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.errors import Forbidden, KeyNotFound, ModelNotFound
from llmgw.router.knowledge.store import no_base

__all__ = ["narrowed_ask", "narrowed_reply"]


async def narrowed_ask(who: Principal, endpoint: Endpoint, message: Any, accounts: Accounts) -> Any:
    """`message` as `who` may ask it of `endpoint`; 403 or 404 where it may not."""
    if who.admin:
        return message
    if isinstance(message, Page):  # every page, joined and narrowed: no cursor names what is not theirs
        message = msgspec.structs.replace(message, after="", limit=0)
    if endpoint is router.KEY_CREATE:
        return who.key_to_make(message)
    if endpoint is router.KEY_REVOKE:
        if message.id not in who.seen_keys((await accounts.list_keys(Empty())).keys):
            raise KeyNotFound(f"No key of yours has id '{message.id}'; GET /api/v1/keys lists them.")
    elif endpoint is router.USAGE_SUM:
        if message.group_by not in who.usage_groups():
            mine = " or ".join(who.usage_groups())
            raise Forbidden(f"You may sum usage by {mine} (yours only), not by {message.group_by}.")
    elif endpoint is router.REQUEST_LOG:
        return who.seen_log(message, (await accounts.list_keys(Empty())).keys)
    elif endpoint.service == "catalog" or endpoint is scheduler.MODEL_ROOM:
        check_model(who, getattr(message, "name", None), accounts)
    elif endpoint in knowledge.ENDPOINTS and endpoint not in (knowledge.KB_LIST, knowledge.CACHE_LIST):
        _check_base(who, endpoint, message)
    elif endpoint in tools.ENDPOINTS and endpoint not in _TOOL_LISTS:
        _check_tools(who, endpoint, message)
    return message


_TOOL_LISTS = (tools.MCP_LIST, tools.RULE_LIST, tools.MCP_CALLS)


def _least(endpoint: Endpoint) -> Role:
    return "operator" if endpoint.admin is not None and endpoint.admin.least == "operator" else "member"


def _check_tools(who: Principal, endpoint: Endpoint, message: Any) -> None:
    """Another tenant's servers and rules read as not there; changing them takes its operator."""
    missing = f"No tenant '{message.tenant}' among yours: GET /api/v1/mcp-servers lists them."
    who.check_tenant(message.tenant, _least(endpoint), missing, "Changing its MCP servers and tool rules")
    if endpoint is tools.MCP_PUT and message.transport == "stdio":  # admins pass before this
        raise Forbidden("A stdio MCP server is a program every router runs as itself: only an admin registers one.")


def _check_base(who: Principal, endpoint: Endpoint, message: Any) -> None:
    """A base of another tenant reads as one not there; a member may not make or remove bases."""
    if endpoint.name.startswith("cache."):
        missing = f"tenant {message.tenant} keeps no answers of model '{message.model}'"
    else:
        missing = no_base(message.tenant, getattr(message, "base", None) or getattr(message, "name", ""))
    who.check_tenant(message.tenant, _least(endpoint), missing, "Changing its knowledge bases and answer caches")


async def narrowed_reply(who: Principal, endpoint: Endpoint, message: Any, reply: Any, accounts: Accounts) -> Any:
    """What of `reply` `who` sees."""
    if who.admin:
        return reply
    if endpoint in (router.KEY_LIST, router.KEY_REVOKE):
        return msgspec.structs.replace(reply, keys=who.seen_keys(reply.keys))
    if endpoint is router.USAGE_SUM:
        keys = (await accounts.list_keys(Empty())).keys
        return msgspec.structs.replace(reply, rows=who.seen_usage(message.group_by, reply.rows, keys))
    if endpoint is knowledge.KB_LIST:
        return msgspec.structs.replace(reply, bases=[b for b in reply.bases if b.tenant in who.roles])
    if endpoint is knowledge.CACHE_LIST:
        caches = [c for c in reply.caches if c.tenant in who.roles]
        held = {k: n for k, n in reply.held.items() if k.split(".")[0] in who.roles}
        return msgspec.structs.replace(reply, caches=caches, held=held)
    if endpoint in _TOOL_LISTS:
        return _seen_tools(who, endpoint, reply)
    if endpoint is people.AUDIT_LOG:
        tenants = _tenants(accounts)
        return msgspec.structs.replace(reply, entries=[e for e in reply.entries if who.sees_entry(e, tenants)])
    tenants = _tenants(accounts)
    if endpoint is catalog.MODEL_LIST:
        return msgspec.structs.replace(reply, models=[e for e in reply.models if who.runs_model(e.model.name, tenants)])
    if endpoint is scheduler.MODEL_STATUS:
        return msgspec.structs.replace(reply, models=[m for m in reply.models if who.runs_model(m.model, tenants)])
    if endpoint is scheduler.REPLICA_LIST:
        return msgspec.structs.replace(reply, replicas=[r for r in reply.replicas if who.runs_model(r.model, tenants)])
    return reply


def _seen_tools(who: Principal, endpoint: Endpoint, reply: Any) -> Any:
    """The servers and rules of `who`'s tenants; the calls of those it operates."""
    if endpoint is tools.MCP_LIST:
        states = {k: v for k, v in reply.states.items() if k.split(".")[0] in who.roles}
        return msgspec.structs.replace(
            reply, servers=[s for s in reply.servers if s.tenant in who.roles], states=states
        )
    if endpoint is tools.RULE_LIST:
        return msgspec.structs.replace(reply, rules=[r for r in reply.rules if r.tenant in who.roles])
    operated = who.operates
    return msgspec.structs.replace(reply, calls=[c for c in reply.calls if c.tenant in operated])


def check_model(who: Principal, name: str | None, accounts: Accounts) -> None:
    """404 for a model `who` does not run, in the words a model not there gets from it."""
    if isinstance(name, str) and not who.runs_model(name, _tenants(accounts)):
        raise ModelNotFound(f"No model '{name}' among those your tenants may use; GET /api/v1/models lists them.")


def _tenants(accounts: Accounts) -> dict[str, people.Tenant]:
    return dict(accounts.people.tenants.items) if accounts.people is not None else {}
