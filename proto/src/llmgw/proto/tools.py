"""Tools: the company's MCP servers behind the router's one MCP endpoint (`/mcp`). An operator
registers a tenant's servers (streamable HTTP ones by URL, stdio ones by the command the router
runs and keeps running); a client signs in with its llmgw key and sees only the tools its rules
let it use, each named `<server>__<tool>`. Every call is recorded (who, which tool, how long,
how it ended; its arguments only where the server's registration says so) on the tool-call
stream. The router keeps the servers and rules (the `mcp` and `mcp_rules` buckets) and answers
these endpoints; `llmgw ctl mcp` and the admin API ask them."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from llmgw.proto._endpoint import AdminRoute, Endpoint, Event
from llmgw.proto._types import Name, NameOrEmpty, NonNegative
from llmgw.proto.people import DEFAULT_TENANT

__all__ = [
    "ENDPOINTS",
    "EVENTS",
    "MCP_CALLS",
    "MCP_LIST",
    "MCP_PUT",
    "MCP_REMOVE",
    "RULE_LIST",
    "RULE_PUT",
    "RULE_REMOVE",
    "SEPARATOR",
    "TOOL_CALL",
    "CallLog",
    "CallQuery",
    "McpServer",
    "McpServerList",
    "ServerRef",
    "ServerState",
    "ToolCall",
    "ToolQuery",
    "ToolRule",
    "ToolRuleList",
    "ToolRuleRef",
]

SEPARATOR = "__"
"""Between a server's name and its tool's in the names the gateway lists (`files__read`)."""

Pattern = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9_*?.\-\[\]]{1,200}$",
        description="a tool name as listed (`<server>__<tool>`), '*' any run of characters, '?' one",
    ),
]


class McpServer(Struct, kw_only=True):
    """An MCP server of a tenant's, reached over streamable HTTP or run by the router (stdio)."""

    name: Name
    """What its tools are listed under (`<name>__<tool>`)."""
    tenant: Name = DEFAULT_TENANT
    transport: Literal["http", "stdio"] = "http"
    url: Annotated[str, Meta(max_length=2000)] = ""
    """http: its streamable HTTP endpoint (`https://tools.example/mcp`)."""
    command: list[Annotated[str, Meta(max_length=2000)]] = field(default_factory=list)
    """stdio: the program and its arguments, run by every router and started again when it ends."""
    env: dict[str, str] = field(default_factory=dict)
    """stdio: environment variables the program gets (not secrets: they are shown back)."""
    headers: dict[str, str] = field(default_factory=dict)
    """http: headers sent with every request (a token): sealed under the fleet's secret when kept,
    never shown back (listed with their values hidden)."""
    record_arguments: bool = False
    """Keep each call's arguments in its record (off: who, which tool, how long and how it ended only)."""
    timeout_s: Annotated[float, Meta(gt=0, le=600)] = 30.0
    """How long a call may take before it is given up."""
    description: Annotated[str, Meta(max_length=500)] = ""
    created: float = 0.0
    by: str = ""


class ServerState(Struct, kw_only=True):
    """How a server is, as the router that answered sees it."""

    state: Literal["connecting", "ready", "failed"] = "connecting"
    reason: str = ""
    """failed: why (not reached, not MCP, its program ended); ready: what was left out, if anything."""
    tools: NonNegative = 0
    """The tools it lists (at most `MOST_TOOLS` of them offered)."""
    since: float = 0.0


class McpServerList(Struct, kw_only=True):
    """Servers, by tenant and name, and how each is."""

    servers: list[McpServer]
    states: dict[str, ServerState] = {}
    """`<tenant>.<name>` -> its state on the router that answered."""


class ToolQuery(Struct, kw_only=True):
    """The servers or rules of one tenant ("": every tenant)."""

    tenant: str = ""


class ServerRef(Struct, kw_only=True):
    """One server."""

    name: Name
    tenant: Name = DEFAULT_TENANT
    by: str = ""


class ToolRule(Struct, kw_only=True):
    """Which of its tenant's tools the keys it applies to may use: a tool passes the tenant's rule,
    then its project's, then its key's (a level without a rule lets everything through); within
    a rule, a tool must match an `allow` pattern and no `deny` one."""

    tenant: Name = DEFAULT_TENANT
    applies_to: Literal["tenant", "project", "key"] = "tenant"
    target: NameOrEmpty = ""
    """The project or key id it is attached to ("" for the tenant itself)."""
    allow: list[Pattern] = field(default_factory=lambda: ["*"])
    """Patterns of the tools allowed ([]: none)."""
    deny: list[Pattern] = field(default_factory=list)
    created: float = 0.0
    by: str = ""


class ToolRuleRef(Struct, kw_only=True):
    """One rule: where it is attached."""

    tenant: Name = DEFAULT_TENANT
    applies_to: Literal["tenant", "project", "key"] = "tenant"
    target: NameOrEmpty = ""
    by: str = ""


class ToolRuleList(Struct, kw_only=True):
    """Rules, by tenant and where they are attached."""

    rules: list[ToolRule]


class ToolCall(Struct, kw_only=True):
    """One call of a tool through the gateway, as the tool-call stream keeps it."""

    time: float
    tenant: str
    key: str
    """The calling key's id."""
    who: str
    """The key's name (and its owner's, where a user owns it)."""
    project: str = ""
    server: str
    tool: str
    ms: float
    outcome: Literal["ok", "error", "refused", "blocked", "timeout"]
    """ok; error: the tool said it failed, or its server did; refused: not the key's to call;
    blocked: a guardrail policy stopped it; timeout: no answer within the server's time."""
    reason: str = ""
    arguments: str = ""
    """The arguments as JSON, only where the server's registration keeps them."""


class CallQuery(Struct, kw_only=True):
    """A page of tool calls, newest first: of one tenant ("": all), one server ("": all)."""

    tenant: str = ""
    server: str = ""
    limit: Annotated[int, Meta(ge=1, le=1000)] = 100
    before: NonNegative = 0
    """Older than this stream sequence (a page's `next`); 0: the latest."""


class CallLog(Struct, kw_only=True):
    """A page of tool calls, newest first."""

    calls: list[ToolCall]
    next: NonNegative = 0


TOOL_CALL = Event(
    "tool",
    ToolCall,
    "A tool called through the gateway's MCP endpoint (the tool-call stream keeps these).",
    ("tenant",),
    "router",
)
MCP_PUT = Endpoint(
    "router",
    "mcp.put",
    McpServer,
    McpServer,
    "Register a tenant's MCP server or change it (its tools are listed once it answers).",
    admin=AdminRoute("PUT", "/mcp-servers/{tenant}/{name}", least="operator"),
)
MCP_LIST = Endpoint(
    "router",
    "mcp.list",
    ToolQuery,
    McpServerList,
    "MCP servers and how each is.",
    admin=AdminRoute("GET", "/mcp-servers", least="member"),
)
MCP_REMOVE = Endpoint(
    "router",
    "mcp.remove",
    ServerRef,
    McpServerList,
    "Remove an MCP server (a stdio one's program is stopped).",
    admin=AdminRoute("DELETE", "/mcp-servers/{tenant}/{name}", least="operator"),
)
RULE_PUT = Endpoint(
    "router",
    "mcp.rule.put",
    ToolRule,
    ToolRule,
    "Set which tools a tenant's, a project's or a key's requests may use.",
    admin=AdminRoute("PUT", "/tool-rules/{tenant}", least="operator"),
)
RULE_LIST = Endpoint(
    "router",
    "mcp.rule.list",
    ToolQuery,
    ToolRuleList,
    "Tool rules.",
    admin=AdminRoute("GET", "/tool-rules", least="member"),
)
RULE_REMOVE = Endpoint(
    "router",
    "mcp.rule.remove",
    ToolRuleRef,
    ToolRuleList,
    "Remove a tool rule (its level lets every tool through again).",
    admin=AdminRoute("DELETE", "/tool-rules/{tenant}", least="operator", body=False),
)
MCP_CALLS = Endpoint(
    "router",
    "mcp.calls",
    CallQuery,
    CallLog,
    "The tool calls made through the gateway, newest first.",
    admin=AdminRoute("GET", "/tool-calls", least="operator"),
)
ENDPOINTS = (MCP_PUT, MCP_LIST, MCP_REMOVE, RULE_PUT, RULE_LIST, RULE_REMOVE, MCP_CALLS)
EVENTS = (TOOL_CALL,)
