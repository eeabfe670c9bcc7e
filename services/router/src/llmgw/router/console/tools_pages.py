"""The tools page (admins, and operators for their tenants): each MCP server and how it is on this
router (its tools, or why it failed), the tool rules, the latest tool calls (who, which tool, how
long, how it ended); for admins, the outside providers and each key's state (its limits, what it
spent this minute, whether it is cooling down and why). Changes are made with `llmgw ctl mcp` and
`llmgw ctl provider` or the admin API; the page asks the same endpoints to list them."""

from __future__ import annotations

from litestar import get
from litestar.response import Response

from llmgw.proto import Empty, providers, tools
from llmgw.proto.tools import CallQuery, ToolQuery
from llmgw.router.console.web import View

__all__ = ["ROUTES"]


@get("/tools")
async def tools_page(view: View) -> Response:
    """Servers, rules and the latest calls (an operator's: its tenants' only); providers (admins)."""
    who = view.principal
    assert who is not None
    listed = await view.ask(tools.MCP_LIST, ToolQuery())
    rules = (await view.ask(tools.RULE_LIST, ToolQuery())).rules
    calls = (await view.ask(tools.MCP_CALLS, CallQuery(limit=50), optional=True)).calls
    servers, states = listed.servers, listed.states
    if not who.admin:
        mine = who.operates
        servers = [s for s in servers if s.tenant in mine]
        rules = [r for r in rules if r.tenant in mine]
        calls = [c for c in calls if c.tenant in mine]
    outside = await view.ask(providers.PROVIDER_LIST, Empty()) if who.admin else None
    return view.render(
        "tools.html", active="tools", servers=servers, states=states, rules=rules, calls=calls, outside=outside
    )


ROUTES = (tools_page,)
