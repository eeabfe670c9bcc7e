"""The guardrail policies: kept in the `guard` bucket (every router watches it), indexed by where
each is attached for the request path (a dict read a request), and the endpoints that make, list
and remove them (`llmgw ctl guard`, the admin API). A policy's patterns are compiled before it is
kept: one RE2 does not take is refused, saying why. Every change is on the audit trail."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple
from urllib.parse import urlsplit

import aiohttp
import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext

from llmgw.bus import BadRequest, Context, KvTable, NotFound, record_change
from llmgw.proto import BUCKETS
from llmgw.proto import guard as guard_api
from llmgw.proto.guard import Check, Policy, PolicyList, PolicyQuery, PolicyRef, ServiceAsk, ServiceVerdict
from llmgw.proto.people import AuditEntry
from llmgw.router.guard.find import PatternError, compile_pattern
from llmgw.router.guard.policies import Index, index, narrowest

__all__ = ["Checked", "Guards", "JudgeUnavailable"]


class Checked(NamedTuple):
    """A request a policy checked: when, which, what it found (category, action), how long the
    checks took, and whether it was blocked."""

    time: float
    tenant: str
    policy: str
    seen: tuple[tuple[str, str], ...]
    ms: float
    blocked: bool


class JudgeUnavailable(Exception):
    """A judge could not be asked (no replica ready, it failed): said plainly."""


class Guards:
    """The policies, and which one a request meets."""

    def __init__(self, table: KvTable[Policy], nc: Client, known_tenant: Callable[[str], None]) -> None:
        self.table, self.nc, self.known_tenant = table, nc, known_tenant
        self.known_model: Callable[[str], bool] = lambda _: True
        """Whether a model (a judge) is in the catalog (the router's directory, once wired)."""
        self.ask_judge: Callable[[str, list[dict], str, str], Awaitable[str]] | None = None
        """Ask a judge model through the router's own routing: (model, messages, grammar, tenant)
        -> its answer; JudgeUnavailable where it cannot answer (the gateway, once wired)."""
        self.patterns: dict[str, object] = {}
        """Each tenant pattern compiled once (RE2), by its text."""
        self.http: aiohttp.ClientSession | None = None
        """Where outside guardrail services are asked (made on first use)."""
        self.recent: deque[Checked] = deque(maxlen=200)
        """The latest requests this router checked, newest last (the console shows them)."""

    @classmethod
    async def open(cls, js: JetStreamContext, nc: Client, known_tenant: Callable[[str], None]) -> Guards:
        """Watch the guard bucket; `known_tenant` raises where a tenant does not exist."""
        return cls(await KvTable.open(js, BUCKETS["guard"], Policy), nc, known_tenant)

    async def serve(self, ctx: Context) -> None:
        """Answer `router.guard.*`."""
        await ctx.serve(guard_api.GUARD_PUT, self.put)
        await ctx.serve(guard_api.GUARD_LIST, self.list_policies)
        await ctx.serve(guard_api.GUARD_REMOVE, self.remove)

    def stop(self) -> None:
        """Stop watching."""
        self.table.stop()
        if self.http is not None:
            asyncio.get_event_loop().create_task(self.http.close())

    def remember(self, policy: Policy, seen: list[tuple[str, str]], ms: float, blocked: bool) -> None:
        """One request checked: what was found, how long it took, whether it was blocked."""
        self.recent.append(Checked(time.time(), policy.tenant, policy.name, tuple(seen), ms, blocked))

    async def ask_service(self, check: Check, ask: ServiceAsk) -> ServiceVerdict | str:
        """An outside guardrail service's verdict on `ask`, or why there is none (no answer in
        its time, a status not 200, a body that is not a verdict)."""
        if self.http is None:
            self.http = aiohttp.ClientSession()
        try:
            timeout = aiohttp.ClientTimeout(total=check.timeout_s)
            async with self.http.post(check.url, data=msgspec.json.encode(ask), timeout=timeout) as answer:
                body = await answer.content.read(1_000_000)
                status = answer.status
        except TimeoutError:
            return f"it did not answer in {check.timeout_s:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            return f"it could not be reached ({type(exc).__name__})"
        if status != 200:
            return f"it answered {status}"
        try:
            return msgspec.json.decode(body, type=ServiceVerdict)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return f"its answer is not a verdict ({str(exc)[:120]})"

    def policy_for(self, tenant: str, project: str, key_id: str, model: str) -> Policy | None:
        """The narrowest policy a request meets (None: none: nothing checked)."""
        idx: Index = self.table.derived(index)
        return narrowest(idx, tenant, project, key_id, model)

    def tool_policy_for(self, tenant: str, project: str, key_id: str) -> Policy | None:
        """The narrowest policy a key's MCP tool calls meet: one that covers tools (None: none)."""
        policy = narrowest(self.table.derived(index), tenant, project, key_id, "")
        return policy if policy is not None and policy.tools else None

    async def put(self, policy: Policy) -> Policy:
        """Keep a policy once its tenant exists and its patterns compile."""
        self.known_tenant(policy.tenant)
        if policy.applies_to != "tenant" and not policy.target:
            raise BadRequest(f"a policy attached to a {policy.applies_to} names it: give its target")
        for check in [*policy.input, *policy.output]:
            if check.kind == "judge" and not (check.judge and self.known_model(check.judge)):
                raise BadRequest(f"policy {policy.name}: no model '{check.judge}' to judge with: `llmgw ctl models`")
            if check.kind == "service" and urlsplit(check.url).scheme not in ("http", "https"):
                raise BadRequest(f"policy {policy.name}: a service check gives its http:// or https:// URL")
            if check.kind == "pattern":
                if not check.pattern:
                    raise BadRequest(f"policy {policy.name}: a pattern check gives its pattern (RE2)")
                try:
                    self.patterns[check.pattern] = compile_pattern(check.pattern)
                except PatternError as exc:
                    raise BadRequest(f"policy {policy.name}: {exc}") from None
        key = f"{policy.tenant}.{policy.name}"
        was = self.table.items.get(key)
        kept = msgspec.structs.replace(policy, created=was.created if was else time.time())
        await self.table.kv.put(key, msgspec.json.encode(kept))
        self.table.items[key] = kept
        self.table.version += 1  # the index is built again for the next request
        change = AuditEntry(
            time=0, who=policy.by, area="guard", action="put", subject=policy.name, tenant=policy.tenant
        )
        await record_change(self.nc, change, was, kept)
        return kept

    async def list_policies(self, query: PolicyQuery) -> PolicyList:
        """The policies of a tenant, or every one."""
        found = [p for _, p in sorted(self.table.items.items()) if not query.tenant or p.tenant == query.tenant]
        return PolicyList(policies=found)

    async def remove(self, ref: PolicyRef) -> PolicyList:
        """Remove a policy: the requests it checked are checked by the next narrowest, or not."""
        key = f"{ref.tenant}.{ref.name}"
        policy = self.table.items.get(key)
        if policy is None:
            raise NotFound(f"tenant {ref.tenant} has no guardrail policy '{ref.name}': `llmgw ctl guard list`")
        await self.table.kv.delete(key)
        self.table.items.pop(key, None)
        self.table.version += 1
        change = AuditEntry(time=0, who=ref.by, area="guard", action="remove", subject=ref.name, tenant=ref.tenant)
        await record_change(self.nc, change, policy, None)
        return PolicyList(policies=[policy])
