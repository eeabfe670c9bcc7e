"""Tenants' webhooks: kept in the `hooks` bucket (their secrets sealed), the endpoints that make,
list, test and remove them, and the notifier that sends them what the fleet does (`notices`).

Replica and mirror events come to one router of the fleet (a queue group); model states (the
`status` bucket) and lost nodes (the scheduler's node list) every router watches, and a notice
any router sends first is marked sent (`sent.<id>` in the dead-letter bucket) so that it goes out
once. A hook is posted a JSON `Notice` signed with its own secret (`X-Llmgw-Signature`), tried
`hook_tries` times with waits doubling from `hook_first_wait_s`; one that never got through is a
dead letter (kept 7 days) that `llmgw ctl hook dead` lists. Delivery lives in this router's
memory: a router stopped between tries drops that notice's remaining tries.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time

import aiohttp
import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from llmgw.bus import ADMIN_PORTS, BadRequest, Context, KvTable, NotFound, call, get_logger, kv_bucket, kv_scan, spawn
from llmgw.proto import BUCKETS, Empty, MirroredRepo, ModelStatus, ReplicaReport, agent, mirror, scheduler
from llmgw.proto import hooks as hooks_api
from llmgw.proto.hooks import DeadLetter, DeadLetters, Hook, HookList, HookQuery, HookRef, HookShown, HookTried, Notice
from llmgw.proto.people import AuditEntry
from llmgw.proto.release import RELEASE_CHANGED, Release
from llmgw.proto.scheduler import NodeHealth
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.accounts.people import People
from llmgw.router.accounts.sealed import Sealer
from llmgw.router.config import RouterConfig
from llmgw.router.notify.notices import (
    check_url,
    for_budget,
    for_fetch,
    for_node,
    for_release,
    for_replica,
    for_status,
    notice_id,
    receivers,
    signature,
)

__all__ = ["DEAD_DAYS", "Hooks"]

DEAD_DAYS = 7
"""How long a dead letter (and the mark of a notice sent) is kept."""
_QUEUE = "llmgw-notify"


class Hooks:
    """Webhooks and the notifier."""

    def __init__(self, table: KvTable[Hook], dead, accounts: Accounts, sealer: Sealer, config: RouterConfig) -> None:
        self.table, self.dead, self.accounts, self.sealer, self.config = table, dead, accounts, sealer, config
        assert accounts.people is not None
        self.people: People = accounts.people
        self.log = get_logger("router")
        self.tasks: set[asyncio.Task] = set()
        self.subs: list = []
        self.own_ports = {*ADMIN_PORTS.values(), config.http_port, config.admin_port}
        self.budgets_at = 0.0

    @classmethod
    async def open(cls, js: JetStreamContext, accounts: Accounts, seal_key: bytes, config: RouterConfig) -> Hooks:
        """Watch the hooks bucket; open the dead letters'."""
        table = await KvTable.open(js, BUCKETS["hooks"], Hook)
        dead = await kv_bucket(js, BUCKETS["hook_dead"], ttl=DEAD_DAYS * 86400.0)
        return cls(table, dead, accounts, Sealer(seal_key, "hooks"), config)

    async def serve(self, ctx: Context) -> None:
        """Answer `router.hook.*` and start telling hooks what happens."""
        await ctx.serve(hooks_api.HOOK_PUT, self.put)
        await ctx.serve(hooks_api.HOOK_LIST, self.list_hooks)
        await ctx.serve(hooks_api.HOOK_REMOVE, self.remove)
        await ctx.serve(hooks_api.HOOK_TEST, self.test)
        await ctx.serve(hooks_api.HOOK_DEAD, self.dead_letters)
        followed = (
            (agent.REPLICA_CHANGED.all, self._replica),
            (mirror.FETCH_CHANGED.all, self._fetch),
            (RELEASE_CHANGED.all, self._release),
        )
        for subject, handler in followed:
            self.subs.append(await ctx.nc.subscribe(subject, queue=_QUEUE, cb=handler))
        spawn(self.tasks, self._watch(ctx), self.log, "watching models and nodes for notices")

    def stop(self) -> None:
        """Stop watching and sending."""
        self.table.stop()
        for task in self.tasks:
            task.cancel()

    # -- endpoints ---------------------------------------------------------------------------------
    async def put(self, hook: Hook) -> HookShown:
        """Make a hook or change it; its secret made (and shown once) where none is given."""
        self.people.known_tenant(hook.tenant)
        if why := check_url(hook.url, self.own_ports):
            raise BadRequest(why)
        made = "" if hook.secret else secrets.token_urlsafe(24)
        key = f"{hook.tenant}.{hook.name}"
        was = self.table.items.get(key)
        kept = msgspec.structs.replace(
            hook, secret=self.sealer.seal(hook.secret or made), created=was.created if was else time.time()
        )
        await self.table.kv.put(key, msgspec.json.encode(kept))
        self.table.items[key] = kept
        change = AuditEntry(time=0, who=hook.by, area="hooks", action="put", subject=hook.name, tenant=hook.tenant)
        await self.people.audit.record(change, was and _shown(was), _shown(kept))
        return HookShown(hook=_shown(kept), secret=made)

    async def list_hooks(self, query: HookQuery) -> HookList:
        """The hooks of a tenant, or every one."""
        found = [h for _, h in sorted(self.table.items.items()) if not query.tenant or h.tenant == query.tenant]
        return HookList(hooks=[_shown(h) for h in found])

    async def remove(self, ref: HookRef) -> HookList:
        """Remove a hook."""
        key = f"{ref.tenant}.{ref.name}"
        hook = self.table.items.get(key)
        if hook is None:
            raise NotFound(f"tenant {ref.tenant} has no hook '{ref.name}': `llmgw ctl hook list` shows them")
        await self.table.kv.delete(key)
        self.table.items.pop(key, None)
        change = AuditEntry(time=0, who=ref.by, area="hooks", action="remove", subject=ref.name, tenant=ref.tenant)
        await self.people.audit.record(change, _shown(hook), None)
        return HookList(hooks=[_shown(hook)])

    async def test(self, ref: HookRef) -> HookTried:
        """Post the hook a test notice once: how it answered."""
        hook = self.table.items.get(f"{ref.tenant}.{ref.name}")
        if hook is None:
            raise NotFound(f"tenant {ref.tenant} has no hook '{ref.name}': `llmgw ctl hook list` shows them")
        text = f"a test notice for hook {hook.name} of tenant {hook.tenant}, sent by {ref.by or 'an operator'}"
        return await self._post(hook, Notice(kind="test", subject=hook.name, text=text, time=time.time()))

    async def dead_letters(self, query: HookQuery) -> DeadLetters:
        """The notices that never got through, newest first (the latest 200)."""
        found = [d for d, _ in (await kv_scan(self.dead, DeadLetter)).values()]
        found = [d for d in found if d.tenant and (not query.tenant or d.tenant == query.tenant)]
        return DeadLetters(letters=sorted(found, key=lambda d: -d.time)[:200])

    # -- what happens ------------------------------------------------------------------------------
    async def _replica(self, msg) -> None:
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            if notice := for_replica(msgspec.json.decode(msg.data, type=ReplicaReport), time.time()):
                await self.notify(notice)

    async def _fetch(self, msg) -> None:
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            if notice := for_fetch(msgspec.json.decode(msg.data, type=MirroredRepo), time.time()):
                await self.notify(notice)

    async def _release(self, msg) -> None:
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            if notice := for_release(msgspec.json.decode(msg.data, type=Release), time.time()):
                await self.notify(notice)

    async def _watch(self, ctx: Context) -> None:
        """Models going backing off or parked (the status bucket), nodes lost (the scheduler's
        list), compared with what was seen the time before; budgets nearly or wholly spent."""
        status = await KvTable.open(ctx.js, BUCKETS["status"], ModelStatus)
        models: dict[str, ModelStatus] = dict(status.items)
        nodes: dict[str, NodeHealth] | None = None
        try:
            while True:
                await asyncio.sleep(self.config.notify_every_s)
                if not self.table.items:  # no hook to tell: nothing asked, what is seen kept
                    models, nodes = dict(status.items), None
                    continue
                now = time.time()
                if now - self.budgets_at >= 10 * self.config.notify_every_s:  # a KV read a budget
                    self.budgets_at = now
                    await self._budgets(now)
                for name, state in list(status.items.items()):
                    if notice := for_status(models.get(name), state, now):
                        await self.notify(notice)
                models = dict(status.items)
                with contextlib.suppress(Exception):  # the scheduler not answering: asked again next time
                    health = (await call(ctx.nc, scheduler.NODE_LIST, Empty(), timeout=5.0)).health
                    for node, now_health in health.items() if nodes is not None else ():
                        if notice := for_node(node, nodes.get(node), now_health, now):
                            await self.notify(notice)
                    nodes = health
        finally:
            status.stop()

    async def _budgets(self, now: float) -> None:
        """Keys' and tenants' day and month budgets 80% used or spent (their counters as they are)."""
        day, month = time.strftime("day %Y-%m-%d", time.gmtime(now)), time.strftime("month %Y-%m", time.gmtime(now))
        scopes = [(f"key.{d[:16]}", f"key '{k.name}'", k.limits, k.tenant) for d, k in self.accounts.keys.items.items()]
        scopes += [
            (f"tenant.{t.name}", f"tenant '{t.name}'", t.limits, t.name) for t in self.people.tenants.items.values()
        ]
        for sid, what, limits, tenant in scopes:
            if not (limits.tokens_per_day or limits.tokens_per_month):
                continue
            counts = await self.accounts.quota.read(sid, now)
            for used, limit, period in (
                (counts.day_tokens, limits.tokens_per_day, day),
                (counts.month_tokens, limits.tokens_per_month, month),
            ):
                if notice := for_budget(what, tenant, used, limit, period, now):
                    await self.notify(notice)

    async def notify(self, notice: Notice) -> None:
        """Send `notice` to the hooks it goes to, once across the fleet's routers."""
        chosen = receivers(notice, self.table.items.values(), self.people.tenants.items)
        if not chosen:
            return
        try:
            await self.dead.create(f"sent.{notice_id(notice)}", b"1")
        except KeyWrongLastSequenceError:
            return  # another router sent it
        for hook in chosen:
            spawn(self.tasks, self._deliver(hook, notice), self.log, f"sending hook {hook.tenant}/{hook.name}")

    async def _deliver(self, hook: Hook, notice: Notice) -> None:
        wait, last = self.config.hook_first_wait_s, ""
        for tries in range(1, self.config.hook_tries + 1):
            answered = await self._post(hook, notice)
            if 200 <= answered.status < 300:
                return
            last = f"{answered.status or 'no answer'}: {answered.said}"
            if tries < self.config.hook_tries:
                await asyncio.sleep(wait)
                wait *= 2
        self.log.warning("a notice never got through", hook=hook.name, tenant=hook.tenant, kind=notice.kind, last=last)
        letter = DeadLetter(hook=hook.name, tenant=hook.tenant, notice=notice, tries=tries, last=last, time=time.time())
        await self.dead.put(f"{hook.tenant}.{hook.name}.{int(letter.time * 1000)}", msgspec.json.encode(letter))

    async def _post(self, hook: Hook, notice: Notice) -> HookTried:
        """Post `notice` to `hook` once, signed: its status (0: no answer) and what it said."""
        body = msgspec.json.encode(notice)
        stamp = str(int(time.time()))
        headers = {
            "content-type": "application/json",
            "x-llmgw-timestamp": stamp,
            "x-llmgw-signature": signature(self.sealer.open(hook.secret), stamp, body),
            "x-llmgw-event": notice.kind,
        }
        started = time.monotonic()
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.hook_timeout_s)
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.post(hook.url, data=body, headers=headers, allow_redirects=False) as answer,
            ):
                said = (await answer.content.read(300)).decode(errors="replace")
                status = answer.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            status, said = 0, f"{type(exc).__name__}: {exc}"[:300] if str(exc) else type(exc).__name__
        return HookTried(status=status, said=said, ms=round((time.monotonic() - started) * 1000))


def _shown(hook: Hook) -> Hook:
    """A hook as it is shown: never its secret."""
    return msgspec.structs.replace(hook, secret="")
