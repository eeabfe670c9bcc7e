"""The tenants' MCP servers and tool rules: kept in the `mcp` and `mcp_rules` buckets (every
router watches both and keeps its own link to every server), the endpoints that change and list
them (`llmgw ctl mcp`, the admin API), and a key's calls: only the tools its rules let through,
its arguments and the result checked by its guardrail policy where that policy covers tools, and
every call recorded on the tool-call stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext

from llmgw.bus import BadRequest, Context, KvTable, NotFound, any_change, event_stream, get_logger, record_change
from llmgw.proto import BUCKETS, TOOL_STREAM
from llmgw.proto import tools as tools_api
from llmgw.proto.guard import Policy
from llmgw.proto.people import AuditEntry
from llmgw.proto.router import KeyRecord
from llmgw.proto.tools import (
    SEPARATOR,
    CallLog,
    CallQuery,
    McpServer,
    McpServerList,
    ServerRef,
    ToolCall,
    ToolQuery,
    ToolRule,
    ToolRuleList,
    ToolRuleRef,
)
from llmgw.router.accounts.sealed import Sealer
from llmgw.router.errors import ApiError
from llmgw.router.guard.redact import Redaction
from llmgw.router.tools.leaves import KeyClash, TooDeep, check_in_place
from llmgw.router.tools.link import CallFailed, Link
from llmgw.router.tools.rights import listable, listed_name, may_use, rule_key, split_name
from llmgw.router.usage.recent import Tail, read_back

if TYPE_CHECKING:  # the MCP SDK loads with the first server linked (`link`)
    import mcp_types as types

__all__ = ["CALLS_DAYS", "HIDDEN", "Offered", "ToolRefused", "Tools"]

HIDDEN = "(hidden)"
"""What a server's header values read as when listed (sent back as it is: the value is kept)."""
CALLS_DAYS = 90
"""How long the tool-call stream keeps a call."""
Offered = dict[str, tuple[Link, "types.Tool"]]
"""Listed name -> the link to its server and the tool as its server lists it."""
GuardTexts = Callable[[Policy, list[str], str, Redaction], Awaitable[list[str]]]
Counted = Callable[[str, KeyRecord], contextlib.AbstractAsyncContextManager]

_log = get_logger("router")


class ToolRefused(Exception):
    """A call that was not made: `outcome` (refused, blocked) and why, in words for the caller."""

    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome, self.reason = outcome, reason


def _calls(data: bytes) -> list[ToolCall]:
    return [msgspec.json.decode(data, type=ToolCall)]


_TAIL: Tail[ToolCall] = Tail(TOOL_STREAM, _calls, lambda c: c.time)


class Tools:
    """The servers, the rules, each server's link, and the calls through them."""

    def __init__(self, servers: KvTable[McpServer], rules: KvTable[ToolRule], nc: Client, js: JetStreamContext) -> None:
        self.servers, self.rules, self.nc, self.js = servers, rules, nc, js
        self.known_tenant: Callable[[str], None] = lambda _: None
        self.sealer = Sealer(b"", "mcp headers")
        self.policy_for: Callable[[str, str, str], Policy | None] = lambda *_: None
        """The guardrail policy a key's calls meet (tenant, project, key id), where it covers tools."""
        self.guard_texts: GuardTexts | None = None
        """Texts checked by a policy's input or output checks (the gateway's, once wired)."""
        self.counted: Counted = lambda *_: contextlib.nullcontext()
        """Within it, a call counts against its key's limits (the gateway's, once wired); an
        `ApiError` where a limit refuses it."""
        self.links: dict[str, tuple[bytes, Link]] = {}
        """`<tenant>.<name>` -> the server as linked (encoded) and its link."""
        self._task: asyncio.Task | None = None

    @classmethod
    async def open(cls, js: JetStreamContext, nc: Client) -> Tools:
        """Watch the servers and rules; make sure the tool-call stream exists."""
        await event_stream(js, TOOL_STREAM, [tools_api.TOOL_CALL.all], CALLS_DAYS)
        servers = await KvTable.open(js, BUCKETS["mcp"], McpServer)
        return cls(servers, await KvTable.open(js, BUCKETS["mcp_rules"], ToolRule), nc, js)

    async def serve(self, ctx: Context) -> None:
        """Answer `router.mcp.*`, and keep a link to every server."""
        for endpoint, handler in (
            (tools_api.MCP_PUT, self.put),
            (tools_api.MCP_LIST, self.list_servers),
            (tools_api.MCP_REMOVE, self.remove),
            (tools_api.RULE_PUT, self.put_rule),
            (tools_api.RULE_LIST, self.list_rules),
            (tools_api.RULE_REMOVE, self.remove_rule),
            (tools_api.MCP_CALLS, self.calls),
        ):
            await ctx.serve(endpoint, handler)
        self._task = asyncio.create_task(self._keep_linked())

    def stop(self) -> None:
        """Stop watching; close every link."""
        if self._task is not None:
            self._task.cancel()
        for _, link in self.links.values():
            link.stop()
        self.servers.stop()
        self.rules.stop()

    async def _keep_linked(self) -> None:
        """Every server in the bucket linked, as it is now (a changed one linked again), each
        time the bucket changes."""
        while True:
            seen = self.servers.version
            wanted = {key: (msgspec.json.encode(s), s) for key, s in self.servers.items.items()}
            for key in [k for k, (was, _) in self.links.items() if wanted.get(k, (None,))[0] != was]:
                self.links.pop(key)[1].stop()
            for key, (encoded, server) in wanted.items():
                if key not in self.links:
                    try:
                        headers = {h: self.sealer.open(v) for h, v in server.headers.items()}
                    except Exception as exc:  # one server's record must not stop the others' links
                        _log.warning("an MCP server's headers do not open", server=key, error=type(exc).__name__)
                        headers = {}
                    link = Link(server, headers)
                    link.start()
                    self.links[key] = (encoded, link)
            await any_change([self.servers], seen)

    async def put(self, server: McpServer) -> McpServer:
        """Keep a server once its tenant exists and its way to be reached is whole."""
        self.known_tenant(server.tenant)
        if not listable(server.name):
            raise BadRequest(
                f"MCP server {server.name}: a server's name holds no '{SEPARATOR}' and does not end in '_' "
                f"(its tools are listed as <server>{SEPARATOR}<tool>)"
            )
        if server.transport == "http" and urlsplit(server.url).scheme not in ("http", "https"):
            raise BadRequest(f"MCP server {server.name}: an http server gives its http:// or https:// URL")
        if server.transport == "stdio" and not server.command:
            raise BadRequest(f"MCP server {server.name}: a stdio server gives the command the router runs")
        key = f"{server.tenant}.{server.name}"
        was = self.servers.items.get(key)
        before = was.headers if was and was.url == server.url else {}  # kept for the URL they were given for
        if any(self.sealer.is_sealed(v) for v in server.headers.values()):
            raise BadRequest(f"MCP server {server.name}: a header's value is the header itself, not a sealed one")
        if missing := [h for h, v in server.headers.items() if v == HIDDEN and not before.get(h)]:
            raise BadRequest(
                f"MCP server {server.name}: give the value of {', '.join(missing)} (a new header, or a new URL)"
            )
        headers = {h: before[h] if v == HIDDEN else self.sealer.seal(v) for h, v in server.headers.items()}
        kept = msgspec.structs.replace(server, headers=headers, created=was.created if was else time.time())
        await self.servers.kv.put(key, msgspec.json.encode(kept))
        self.servers.items[key] = kept
        await self._audit(server.by, "put", server.name, server.tenant, was and _shown(was), _shown(kept))
        return _shown(kept)

    async def list_servers(self, query: ToolQuery) -> McpServerList:
        """A tenant's servers (or every one) and how each is from here."""
        found = [(k, s) for k, s in sorted(self.servers.items.items()) if not query.tenant or s.tenant == query.tenant]
        states = {k: self.links[k][1].state for k, _ in found if k in self.links}
        return McpServerList(servers=[_shown(s) for _, s in found], states=states)

    async def remove(self, ref: ServerRef) -> McpServerList:
        """Remove a server: its tools are gone from every key's list."""
        key = f"{ref.tenant}.{ref.name}"
        server = self.servers.items.get(key)
        if server is None:
            raise NotFound(f"tenant {ref.tenant} has no MCP server '{ref.name}': `llmgw ctl mcp list`")
        await self.servers.kv.delete(key)
        self.servers.items.pop(key, None)
        await self._audit(ref.by, "remove", ref.name, ref.tenant, _shown(server), None)
        return McpServerList(servers=[_shown(server)])

    async def put_rule(self, rule: ToolRule) -> ToolRule:
        """Keep a rule for a tenant, one of its projects or one of its keys."""
        self.known_tenant(rule.tenant)
        if rule.applies_to != "tenant" and not rule.target:
            raise BadRequest(f"a rule attached to a {rule.applies_to} names it: give its target")
        key = rule_key(rule.tenant, rule.applies_to, rule.target)
        was = self.rules.items.get(key)
        kept = msgspec.structs.replace(rule, created=was.created if was else time.time())
        await self.rules.kv.put(key, msgspec.json.encode(kept))
        self.rules.items[key] = kept
        await self._audit(rule.by, "put", f"rule {rule.applies_to} {rule.target}".strip(), rule.tenant, was, kept)
        return kept

    async def list_rules(self, query: ToolQuery) -> ToolRuleList:
        """A tenant's rules (or every one)."""
        return ToolRuleList(
            rules=[r for _, r in sorted(self.rules.items.items()) if not query.tenant or r.tenant == query.tenant]
        )

    async def remove_rule(self, ref: ToolRuleRef) -> ToolRuleList:
        """Remove a rule: its level lets every tool through again."""
        key = rule_key(ref.tenant, ref.applies_to, ref.target)
        rule = self.rules.items.get(key)
        if rule is None:
            where = f"{ref.applies_to} {ref.target}".strip()
            raise NotFound(f"tenant {ref.tenant} has no tool rule on {where}: `llmgw ctl mcp rules`")
        await self.rules.kv.delete(key)
        self.rules.items.pop(key, None)
        await self._audit(ref.by, "remove", f"rule {ref.applies_to} {ref.target}".strip(), ref.tenant, rule, None)
        return ToolRuleList(rules=[rule])

    async def calls(self, query: CallQuery) -> CallLog:
        """A page of the tool calls, newest first."""

        def wanted(c: ToolCall) -> bool:
            return (not query.tenant or c.tenant == query.tenant) and (not query.server or c.server == query.server)

        got, after = await read_back(self.nc, self.js, _TAIL, (query.before, query.limit), wanted)
        return CallLog(calls=got, next=after)

    async def _audit(self, by: str, action: str, subject: str, tenant: str, was: object, now: object) -> None:
        change = AuditEntry(time=0, who=by, area="tools", action=action, subject=subject, tenant=tenant)
        await record_change(self.nc, change, was, now)

    def offered(self, key_id: str, key: KeyRecord) -> Offered:
        """The tools a key may use, by the name it sees them under (its tenant's ready servers only)."""
        rules = self.rules.items
        out: Offered = {}
        for _, link in self.links.values():
            server = link.server
            if server.tenant != key.tenant or link.state.state != "ready":
                continue
            for name, tool in link.tools.items():
                listed = listed_name(server.name, name)
                if may_use(rules, key.tenant, key.project, key_id, listed):
                    out[listed] = (link, tool)
        return out

    async def call(self, key_id: str, key: KeyRecord, name: str, arguments: dict) -> types.CallToolResult:
        """Call the tool listed as `name` for a key: ToolRefused where it is not the key's (or a
        policy blocks it), CallFailed where it got no result; recorded either way (its arguments,
        as the tool got them, where its server keeps them)."""
        started = time.time()
        server, tool = split_name(name) or ("", name)
        record = ToolCall(
            time=started, tenant=key.tenant, key=key_id, who=_who(key), project=key.project, server=server,
            tool=tool, ms=0.0, outcome="ok",
        )  # fmt: skip
        try:
            async with self.counted(key_id, key):
                result = await self._call(key_id, key, name, arguments, record)
            if result.is_error:
                record.outcome, record.reason = "error", "the tool said it failed"
            return result
        except ApiError as exc:  # a limit of the key's refused it
            record.outcome, record.reason = "refused", exc.message
            raise ToolRefused("refused", exc.message) from None
        except (ToolRefused, CallFailed) as exc:
            record.outcome, record.reason = exc.outcome, exc.reason  # type: ignore[assignment]
            raise
        finally:
            record.ms = round((time.time() - started) * 1000, 2)
            with contextlib.suppress(Exception):  # the call stands: its record is not waited on
                await self.nc.publish(tools_api.TOOL_CALL.subject(key.tenant), msgspec.json.encode(record))

    async def _call(
        self, key_id: str, key: KeyRecord, name: str, arguments: dict, record: ToolCall
    ) -> types.CallToolResult:
        found = self.offered(key_id, key).get(name)
        if found is None:
            raise ToolRefused("refused", f"No tool '{name}' among those this key may use: tools/list lists them.")
        link, tool = found
        policy = self.policy_for(key.tenant, key.project, key_id)
        redaction = Redaction()
        if policy is not None and self.guard_texts is not None:
            arguments = msgspec.json.decode(msgspec.json.encode(arguments))  # checked in a copy of its own
            await self._guarded(policy, arguments, "input", redaction)
        if link.server.record_arguments:
            record.arguments = msgspec.json.encode(arguments).decode()
        result = await link.call(tool.name, arguments)
        if policy is None or self.guard_texts is None:
            return result
        import mcp_types as types  # loaded already: the result is one

        blocks = [b.resource if isinstance(b, types.EmbeddedResource) else b for b in result.content]
        texts = [b for b in blocks if isinstance(b, types.TextContent | types.TextResourceContents)]
        # the values the arguments' checks redacted put back first; then the result's own checks,
        # whose redactions stay (as an answer's do)
        output = Redaction()
        checked = await self._checked(policy, [redaction.restore(b.text) for b in texts], "output", output)
        for block, text in zip(texts, checked, strict=True):
            block.text = text
        if result.structured_content is not None:
            await self._guarded(policy, result.structured_content, "output", output, restore=redaction)
        return result

    async def _guarded(
        self, policy: Policy, value: dict, way: str, redaction: Redaction, restore: Redaction | None = None
    ) -> None:
        """The strings in `value`, values and keys, checked in place (`restore`'s placeholders put
        back first); a value nested too deep to be walked is refused, never passed unchecked."""
        try:
            await check_in_place(
                value, lambda texts: self._checked(policy, texts, way, redaction), restore.restore if restore else None
            )
        except TooDeep as exc:
            raise ToolRefused("blocked", f"{exc}: a guardrail policy checks every string, so it is refused") from None
        except KeyClash as exc:
            raise ToolRefused("blocked", f"{exc}: redacting it would lose a value, so it is refused") from None

    async def _checked(self, policy: Policy, texts: list[str], way: str, redaction: Redaction) -> list[str]:
        assert self.guard_texts is not None
        if not texts:
            return texts
        try:
            return await self.guard_texts(policy, texts, way, redaction)
        except ApiError as exc:
            raise ToolRefused("blocked", exc.message) from None


def _shown(server: McpServer) -> McpServer:
    """A server as it is shown: its header values hidden."""
    return msgspec.structs.replace(server, headers=dict.fromkeys(server.headers, HIDDEN))


def _who(key: KeyRecord) -> str:
    return f"{key.name} ({key.owner})" if key.owner else key.name
