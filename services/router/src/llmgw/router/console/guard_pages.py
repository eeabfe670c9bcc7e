"""The guardrails page (admins, and operators for their tenants): each policy, where it is
attached and its checks, and the latest requests this router checked (what was found, how long
the checks took, whether it was blocked). Policies are changed with `llmgw ctl guard` or the
admin API; the page asks the same endpoint to list them."""

from __future__ import annotations

from litestar import get
from litestar.response import Response

from llmgw.proto import guard
from llmgw.proto.guard import PolicyQuery
from llmgw.router.console.web import View

__all__ = ["ROUTES"]


@get("/guard")
async def guard_page(view: View) -> Response:
    """Policies and the latest checks, newest first (an operator's: its tenants' only)."""
    who = view.principal
    assert who is not None
    policies = (await view.ask(guard.GUARD_LIST, PolicyQuery())).policies
    guards = view.console.gateway.guards
    recent = list(reversed(guards.recent)) if guards is not None else []
    if not who.admin:
        policies = [p for p in policies if who.roles.get(p.tenant) == "operator"]
        recent = [c for c in recent if who.roles.get(c.tenant) == "operator"]
    return view.render("guard.html", active="guard", policies=policies, recent=recent[:100])


ROUTES = (guard_page,)
