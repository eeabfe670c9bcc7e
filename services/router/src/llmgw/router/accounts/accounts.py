"""Who may use the router and what they used: API keys and projects (KV buckets every router
watches), their limits (KV counters, `quota.py`), and usage (a JetStream stream); with the
router's NATS endpoints for keys, projects and usage sums."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from llmgw.bus import Context, KvTable, NotFound, event_stream, get_logger, kv_bucket, spawn
from llmgw.proto import (
    BUCKETS,
    USAGE_STREAM,
    Empty,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyRecord,
    KeyRef,
    Limits,
    Page,
    Project,
    RequestLog,
    RequestLogAsk,
    UsageQuery,
    UsageRecord,
    UsageReport,
    page_of,
)
from llmgw.proto import router as router_api
from llmgw.proto.people import AuditEntry
from llmgw.router.accounts.access import Principal, key_principal, user_principal
from llmgw.router.accounts.keys import authorize, key_hash
from llmgw.router.accounts.limits import Verdict
from llmgw.router.accounts.people import People
from llmgw.router.accounts.quota import Quota, Scope
from llmgw.router.config import RouterConfig
from llmgw.router.errors import NotAdmin
from llmgw.router.usage.book import UsageBook
from llmgw.router.usage.recent import request_log
from llmgw.router.usage.spool import Spooled, UsageSpool, message_id

__all__ = ["DEDUP_S", "USAGE_ACK_S", "USAGE_BATCH", "USAGE_LINGER_S", "Accounts"]

USAGE_ACK_S = 5.0
"""How long a usage message's publish waits for the stream's acknowledgement."""
DEDUP_S = 600.0
"""How long the usage stream remembers a message's id: one sent again within it (its first
acknowledgement lost) is taken once."""
USAGE_LINGER_S = 0.02
"""How long the first finished request's usage waits for others to go in one message with it."""
USAGE_BATCH = 256
"""The most requests' usage in one message (~350 bytes each: well under NATS's 1 MB a message)."""
_NO_LIMITS = Limits()


async def _remember_ids(js: JetStreamContext) -> None:
    """An older usage stream remembers ids for NATS's default 2 minutes: `DEDUP_S`, so usage sent
    again from a spool later than that is still taken once."""
    with contextlib.suppress(NatsError):
        config = (await js.stream_info(USAGE_STREAM)).config
        if (config.duplicate_window or 0) < DEDUP_S:
            config.duplicate_window = DEDUP_S
            await js.update_stream(config)


class Accounts:
    """Keys, projects, limits and usage."""

    def __init__(
        self,
        js: JetStreamContext,
        keys: KvTable[KeyRecord],
        projects: KvTable[Project],
        quota: Quota,
        book: UsageBook | None = None,
    ) -> None:
        self.js, self.keys, self.projects, self.quota = js, keys, projects, quota
        self.book = book
        """The usage stream's reports and its summing into slots (None: no reports, as in tests of the rest)."""
        self.usage: asyncio.Queue[UsageRecord] = asyncio.Queue(maxsize=100_000)
        """Finished requests, on their way to the usage stream."""
        self.tasks: set[asyncio.Task] = set()
        self.spool: UsageSpool | None = None
        """Usage the stream did not take, kept until it does (`open` makes it)."""
        self.log = get_logger("router")
        self.people: People | None = None
        """Users and tenants (the service opens them after the accounts: tests of the rest go without)."""

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        router: str,
        config: RouterConfig,
        online: Callable[[], bool] = lambda: True,
        *,
        nc: Client,
    ) -> Accounts:
        """Watch the keys and projects buckets, open the limit counters (`router`: this instance's
        id in them; `online`: whether NATS is there now, else they count locally) and make sure
        the usage stream exists (kept `config.usage_days`); start publishing usage, kept under
        the data folder while the stream does not take it, and, where `config.usage_summing` says
        so, summing it into slots on this loop (`nc`: the connection `js` is on)."""
        usage_days = config.usage_days
        keys = await KvTable.open(js, BUCKETS["keys"], KeyRecord)
        projects = await KvTable.open(js, BUCKETS["projects"], Project)
        quota = Quota(await kv_bucket(js, BUCKETS["limits"], ttl=32 * 86400), router, online=online)
        if not await event_stream(js, USAGE_STREAM, [router_api.USAGE.all], usage_days, duplicate_window=DEDUP_S):
            await _remember_ids(js)  # there already, made otherwise (fewer copies, other max_age)
        book = await UsageBook.open(nc, js, usage_days, roll=config.usage_summing == "inline")
        accounts = cls(js, keys, projects, quota, book)
        accounts.spool = UsageSpool(config.home() / "router" / "usage-spool", js, USAGE_ACK_S)
        accounts.spool.open()
        spawn(accounts.tasks, accounts._publish_usage(), accounts.log, "publishing usage")
        spawn(accounts.tasks, accounts.spool.run(), accounts.log, "keeping usage the stream has not taken")
        spawn(accounts.tasks, quota.keep_alive(20.0), accounts.log, "keeping this router's requests in flight counted")
        return accounts

    async def serve(self, ctx: Context) -> None:
        """Answer the router's NATS endpoints (`llmgw ctl key ...`, `project`, `usage`)."""
        await ctx.serve(router_api.KEY_CREATE, self.create_key)
        await ctx.serve(router_api.KEY_LIST, self.key_page)
        await ctx.serve(router_api.KEY_REVOKE, self.revoke_key)
        await ctx.serve(router_api.PROJECT_PUT, self.put_project)
        await ctx.serve(router_api.USAGE_SUM, self.usage_page)
        await ctx.serve(router_api.REQUEST_LOG, self.request_log)

    def stop(self) -> None:
        """Stop watching and publishing (usage not yet taken stays in the spool's file)."""
        for task in self.tasks:
            task.cancel()
        if self.spool:
            self.spool.close()
        if self.book:
            self.book.stop()
        self.quota.stop()
        self.keys.stop()
        self.projects.stop()

    # -- a request's key and limits --------------------------------------------------------------
    def authorize(self, header: str, admin: bool = False) -> tuple[str, KeyRecord]:
        """The key an `Authorization` header names (its id, its record); 401 or 403 saying why not."""
        return authorize(header, self.keys.items, time.time(), admin)

    def principal(self, header: str) -> Principal:
        """Who an `Authorization` header's key acts for on the admin API: an admin key's holder
        (an admin of the fleet), or the user that owns the key, with the role it has now in the
        key's tenant (a key carries no role of its user's elsewhere). 401 for a key that does not
        hold, 403 for one that only asks models (a service account's)."""
        key_id, key = self.authorize(header)
        if key.admin:
            return key_principal(key_id, key)
        owner = self.people.user(key.owner) if key.owner and self.people is not None else None
        if owner is None:
            raise NotAdmin("This key asks models only: the admin API takes an admin key or a key a user owns.")
        if key.tenant not in owner.roles:
            raise NotAdmin(f"This key's user has no role in its tenant '{key.tenant}' any more.")
        return user_principal(msgspec.structs.replace(owner, roles={key.tenant: owner.roles[key.tenant]}))

    def scopes(self, key_id: str, key: KeyRecord) -> list[Scope]:
        """The limits a request with this key counts against: its own, its project's and, where
        its tenant has limits, its tenant's."""
        scopes = [(f"key.{key_id}", f"key '{key.name}'", key.limits), self.project_scope(key.project)]
        tenant = self.people.tenants.items.get(key.tenant) if self.people is not None else None
        if tenant is not None and tenant.limits != _NO_LIMITS:
            scopes.append((f"tenant.{tenant.name}", f"tenant '{tenant.name}'", tenant.limits))
        return scopes

    def project_scope(self, name: str) -> Scope:
        """The limits of project `name`, which all its keys' requests count against together."""
        project = self.projects.items.get(name) or Project(name=name)
        return (f"project.{project.name}", f"project '{project.name}'", project.limits)

    async def admit(self, scopes: list[Scope], now: float, reserve: int) -> Verdict:
        """Count a request, which may use up to `reserve` tokens (held until it ends), against its
        scopes' limits, or say which refuses it (nothing counted)."""
        return await self.quota.admit(scopes, now, reserve)

    def ended(self, scopes: list[Scope], reserve: int, tokens: int, now: float, usage: UsageRecord | None) -> None:
        """An admitted request that held `reserve` tokens ended having used `tokens`: its limits
        are told off the hot path (the answer does not wait for the counters), its usage goes to
        the stream."""
        if rest := self.quota.finish_leased(scopes, tokens, now, reserve):  # the others: written
            what = "telling the limit counters a request ended"  # lost, it is sent with the next change
            spawn(self.tasks, self.quota.finish(rest, tokens, now, reserve), self.log, what)
        if usage is None:
            return
        try:
            self.usage.put_nowait(usage)
        except asyncio.QueueFull:
            self.log.warning("usage queue full: a request's usage is not recorded", request=usage.request_id)

    def give_back(self, scopes: list[Scope], admitted: float, reserve: int, now: float) -> None:
        """A request admitted at `admitted`, holding `reserve` tokens, was refused after all, for
        itself (its prompt, measured once its model woke, does not fit): its admission is given
        back, off the hot path."""
        if scopes:
            what = "giving a refused request's admission back to the limit counters"
            spawn(self.tasks, self.quota.give_back(scopes, admitted, now, reserve), self.log, what)

    async def _publish_usage(self) -> None:
        """Finished requests' usage to the stream: what ended within `USAGE_LINGER_S` of the
        first (at most `USAGE_BATCH`) in one message per project and model, one publish and one
        acknowledgement for them all (one each cost the router a third of its requests a second);
        without waiting on each acknowledgement in turn. A message refused, or not acknowledged
        within `USAGE_ACK_S`, is logged with its requests."""
        loop = asyncio.get_running_loop()
        while True:
            records = [await self.usage.get()]
            await asyncio.sleep(USAGE_LINGER_S)
            while len(records) < USAGE_BATCH and not self.usage.empty():
                records.append(self.usage.get_nowait())
            batches: dict[str, list[UsageRecord]] = {}
            for r in records:
                batches.setdefault(router_api.USAGE.subject(r.project, r.model), []).append(r)
            for subject, batch in batches.items():
                message = Spooled(id=message_id(batch), subject=subject, records=batch)
                try:
                    acked = await self.js.publish_async(
                        subject, msgspec.json.encode(batch), headers={"Nats-Msg-Id": message.id}
                    )
                except Exception as exc:
                    self._kept(message, str(exc))
                    continue
                late = loop.call_later(USAGE_ACK_S, acked.cancel)
                acked.add_done_callback(lambda done, message=message, late=late: self._acked(done, message, late))

    def _acked(self, done: asyncio.Future, message: Spooled, late: asyncio.TimerHandle) -> None:
        """A usage message's publish was answered (or given up on: then it is kept to send again)."""
        late.cancel()
        if done.cancelled():
            self._kept(message, f"no acknowledgement within {USAGE_ACK_S:g} s")
        elif (exc := done.exception()) is not None:
            self._kept(message, str(exc))

    def _kept(self, message: Spooled, why: str) -> None:
        """The stream did not take a usage message: kept (on disk) and sent again until it does."""
        if self.spool is None:
            self.log.warning("usage not recorded", requests=[r.request_id for r in message.records], error=why)
            return
        if not self.spool.pending:
            self.log.warning("usage kept to send again: the stream did not take it", error=why)
        self.spool.keep(message)

    # -- keys, projects, usage (NATS and the admin API) --------------------------------------------
    async def create_key(self, req: KeyCreate) -> KeyCreated:
        """A new key (its project made if missing), usable at once on this router."""
        key = "sk-llmgw-" + secrets.token_urlsafe(32)
        now = time.time()
        if self.people is not None:
            self.people.known_tenant(req.tenant)
        record = KeyRecord(
            name=req.name,
            created=now,
            admin=req.admin,
            project=req.project,
            tenant=req.tenant,
            owner=req.owner,
            expires=now + req.expires_in_s if req.expires_in_s else None,
            models=req.models,
            limits=req.limits,
        )
        if req.project not in self.projects.items:
            project = Project(name=req.project, created=now)
            await self.projects.kv.put(req.project, msgspec.json.encode(project))
            self.projects.items[req.project] = project
        await self.keys.kv.put(key_hash(key), msgspec.json.encode(record))
        self.keys.items[key_hash(key)] = record  # usable at once, before the watch delivers it
        await self._audit("keys", "create", f"{req.name} ({key_hash(key)[:16]})", req.by, (None, record))
        return KeyCreated(name=req.name, key=key, id=key_hash(key)[:16])

    async def list_keys(self, _: Empty | None = None) -> KeyList:
        """Every key by id, oldest first (never the key): for the admin API and the console."""
        return KeyList(keys=dict(self._keys_oldest_first()))

    async def key_page(self, ask: Page) -> KeyList:
        """A page of the keys, oldest first (`llmgw ctl key list` asks for them all, page by page)."""
        page, after = page_of(self._keys_oldest_first(), ask, lambda kv: (kv[1].created, kv[0]), "the key list")
        return KeyList(keys=dict(page), next=after)

    def _keys_oldest_first(self) -> list[tuple[str, KeyRecord]]:
        """(id, record) of every key, oldest first (by id where made at once)."""
        return sorted(((h[:16], r) for h, r in self.keys.items.items()), key=lambda kv: (kv[1].created, kv[0]))

    async def revoke_key(self, ref: KeyRef) -> KeyList:
        """Revoke a key by id on every router; 404 where no key has it."""
        found = [h for h in self.keys.items if h.startswith(ref.id)]
        if not found:
            raise NotFound(f"no key has the id '{ref.id}'; `llmgw ctl key list` shows them")
        record = self.keys.items[found[0]]
        await self.keys.kv.delete(found[0])
        self.keys.items.pop(found[0], None)  # gone at once here; the watch tells every other router
        await self._audit("keys", "revoke", f"{record.name} ({ref.id})", ref.by, (record, None))
        return KeyList(keys={ref.id: record})

    async def put_project(self, project: Project) -> Project:
        """Create a project or change its limits."""
        was = self.projects.items.get(project.name)
        project = msgspec.structs.replace(project, created=project.created or time.time())
        await self.projects.kv.put(project.name, msgspec.json.encode(project))
        self.projects.items[project.name] = project
        await self._audit("projects", "put", project.name, project.by, (was, project))
        return project

    async def _audit(self, area, action: str, subject: str, who: str, change: tuple) -> None:
        """A change to keys or projects on the audit trail (`change`: what it was and became)."""
        if self.people is not None:
            entry = AuditEntry(time=0, who=who, area=area, action=action, subject=subject)
            await self.people.audit.record(entry, *change)

    async def sum_usage(self, query: UsageQuery) -> UsageReport:
        """Every request since `query.since`, summed (`UsageBook.report`): for the admin API and the console."""
        assert self.book is not None, "Accounts made without a UsageBook answer no usage reports"
        return await self.book.report(query, time.time())

    async def request_log(self, ask: RequestLogAsk) -> RequestLog:
        """The latest requests, newest first (`usage.recent`): for ctl, the admin API, the console."""
        assert self.book is not None, "Accounts made without a UsageBook answer no request log"
        return await request_log(self.book.nc, self.book.js, ask)

    async def usage_page(self, query: UsageQuery) -> UsageReport:
        """The same over NATS (`llmgw ctl usage`), in pages where it does not fit in one message."""
        assert self.book is not None, "Accounts made without a UsageBook answer no usage reports"
        return await self.book.report_page(query, time.time())
