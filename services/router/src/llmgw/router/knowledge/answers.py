"""The answer cache as the router keeps it: how each tenant's answers to a model are kept (the
`answer_cache` bucket), the answers themselves with their questions' vectors (the `answers`
bucket, every router watching it, values expiring after 30 days and deleted once past their
policy's `ttl_s`), and per tenant, model and variant (what else a request must match,
`recall.variant_of`) an index of those vectors in memory, which follows the bucket's changes key
by key. Every lookup names its tenant: no tenant is ever answered with another's answer. The
operations every face calls are here: keep, list, remove, purge."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable

import msgspec
import numpy as np
from nats.aio.client import Client
from nats.js import JetStreamContext

from llmgw.bus import BadRequest, Context, KvTable, NotFound, get_logger, record_change, spawn
from llmgw.proto import BUCKETS
from llmgw.proto import knowledge as api
from llmgw.proto.knowledge import AnswerCache, BaseQuery, CachedAnswer, CacheList, CacheRef
from llmgw.proto.people import AuditEntry
from llmgw.router.knowledge.index import BaseIndex

__all__ = ["KEPT_S", "MOST_KEPT_BYTES", "SWEEP_S", "Answers"]

KEPT_S = 30 * 86400
"""How long the `answers` bucket keeps a value at most (a policy's `ttl_s` is shorter or equal)."""
MOST_KEPT_BYTES = 900_000
"""An answer larger than this (as kept) is not kept: a NATS message holds 1 MB."""
SWEEP_S = 300.0
"""How often the answers past their policy's `ttl_s` are deleted (by every router: a delete of one
already gone costs a message)."""

_log = get_logger("router")


class Answers:
    """The tenants' answer caches."""

    def __init__(
        self, policies: KvTable[AnswerCache], kept: KvTable[CachedAnswer], nc: Client, known_tenant: Callable
    ) -> None:
        self.policies, self.kept, self.nc, self.known_tenant = policies, kept, nc, known_tenant
        self.model_version: Callable[[str], str | None] = lambda _: None
        """An embedding model's name and file (None: no such embedding model): set when wired."""
        self.known_model: Callable[[str], bool] = lambda _: True
        self.indexes: dict[tuple[str, str, str], BaseIndex] = {}
        """(tenant, model, variant) -> the vectors of the answers kept for it."""
        self.loaded: dict[str, str] = {}
        """answer key -> the embedding model its vector in the index is of."""
        self.seen: tuple = ()
        """What the indexes were caught up to: the buckets' versions (answers, policies) and the
        policies' embedding models as the catalog names them."""
        self.tasks: set[asyncio.Task] = set()

    @classmethod
    async def open(cls, js: JetStreamContext, nc: Client, known_tenant: Callable[[str], None]) -> Answers:
        """Watch both buckets (creating them on first use)."""
        policies = await KvTable.open(js, BUCKETS["answer_cache"], AnswerCache)
        kept = await KvTable.open(js, BUCKETS["answers"], CachedAnswer, ttl=KEPT_S)
        return cls(policies, kept, nc, known_tenant)

    async def serve(self, ctx: Context) -> None:
        """Answer `router.cache.*`; sweep the answers past their time."""
        spawn(self.tasks, self._sweeping(), _log, "deleting answers past their policy's ttl_s")
        await ctx.serve(api.CACHE_PUT, self.put)
        await ctx.serve(api.CACHE_LIST, self.list_caches)
        await ctx.serve(api.CACHE_REMOVE, self.remove)
        await ctx.serve(api.CACHE_PURGE, self.purge)

    def stop(self) -> None:
        """Stop watching, and sweeping."""
        self.policies.stop()
        self.kept.stop()
        for task in self.tasks:
            task.cancel()

    def policy(self, tenant: str, model: str) -> AnswerCache | None:
        """How tenant `tenant`'s answers to `model` are kept (None: they are not)."""
        return self.policies.items.get(f"{tenant}.{model}")

    def lookup(self, policy: AnswerCache, vector: np.ndarray, variant: str) -> tuple[CachedAnswer, float] | None:
        """The answer kept for the question nearest `vector` (of `policy.embedding`) among those
        of the same `variant` (`recall.variant_of`), where it is close enough and young enough;
        None else."""
        self._catch_up()
        index = self.indexes.get((policy.tenant, policy.model, variant))
        if index is None or index.model != self.model_version(policy.embedding):
            return None
        for found in index.search(vector, 4):  # the nearest may be stale: a fresh one just behind it answers
            kept = self.kept.items.get(found.doc)
            if kept is not None and found.score >= policy.threshold and time.time() - kept.time <= policy.ttl_s:
                return kept, found.score
        return None

    async def keep(
        self, policy: AnswerCache, question: str, vector: np.ndarray, variant: str, answer: CachedAnswer
    ) -> None:
        """An answer kept for `question` (its vector given) of `variant`, in place of one kept for
        the same."""
        version = self.model_version(policy.embedding)
        if version is None:
            return
        digest = hashlib.sha256(question.encode()).hexdigest()[:32]
        kept = msgspec.structs.replace(
            answer, question=question, embedded_with=version, vector=vector.astype("<f4").tobytes()
        )
        value = msgspec.json.encode(kept)
        if len(value) <= MOST_KEPT_BYTES:
            await self.kept.kv.put(f"{policy.tenant}.{policy.model}.{variant}.{digest}", value)

    def _catch_up(self) -> None:
        """The indexes as the `answers` bucket is now (vectors are in its values: no I/O): the
        answers changed since the last look, each; all of them where the policies changed or the
        bucket's values were read whole again."""
        models = tuple(self.model_version(p.embedding) for p in self.policies.items.values())
        seen = (self.kept.version, self.policies.version, models)
        if seen == self.seen:
            return
        touched = self.kept.take_touched()
        if touched is None or seen[1:] != self.seen[1:]:  # the policies or their models changed
            touched = {*self.loaded, *self.kept.items}
        self.seen = seen
        for key in touched:
            try:
                self._follow(key)
            except ValueError as exc:  # a vector of another size than its index's, say
                _log.warning("a kept answer left out of its index", key=key, error=str(exc)[:200])

    def _follow(self, key: str) -> None:
        """One answer's vector into its index, or out of it where the answer is gone."""
        kept, where = self.kept.items.get(key), _where(key)
        if kept is None:
            if self.loaded.pop(key, None) is not None and (index := self.indexes.get(where)) is not None:
                index.drop(key)
            return
        policy = self.policies.items.get(f"{where[0]}.{where[1]}")
        now = self.model_version(policy.embedding) if policy is not None else None
        if self.loaded.get(key) == kept.embedded_with or kept.embedded_with != now:
            return  # in already, or of an embedding model its policy no longer names
        vector = np.frombuffer(kept.vector, dtype="<f4")
        index = self.indexes.get(where)
        if index is None or index.model != kept.embedded_with or index.dim != len(vector):
            index = self.indexes[where] = BaseIndex(len(vector), kept.embedded_with)
            for other in [k for k in self.loaded if _where(k) == where]:
                del self.loaded[other]
        index.put(key, kept.embedded_with, [kept.question], vector.reshape(1, -1))
        self.loaded[key] = kept.embedded_with

    async def _sweeping(self) -> None:
        """Every `SWEEP_S`, delete the answers past their policy's `ttl_s` (never answered again)
        or of a policy gone; only with both buckets read whole."""
        while True:
            await asyncio.sleep(SWEEP_S)
            if self.kept.synced and self.policies.synced:
                await self.sweep(time.time())

    async def sweep(self, now: float) -> int:
        """Delete the answers past their policy's `ttl_s` at `now`, or of a policy gone; how many."""
        stale = [key for key, kept in list(self.kept.items.items()) if self._past(key, kept, now)]
        gone = 0
        for key in stale:
            with contextlib.suppress(Exception):  # deleted by another router's sweep, say
                entry = await self.kept.kv.get(key)  # as it is now: kept again meanwhile, it stays
                kept = msgspec.json.decode(entry.value, type=CachedAnswer)
                if self._past(key, kept, now):
                    await self.kept.kv.delete(key, last=entry.revision)
                    gone += 1
        return gone

    def _past(self, key: str, kept: CachedAnswer, now: float) -> bool:
        """Whether answer `key` is past its policy's `ttl_s` at `now`, or of a policy gone."""
        tenant, model, _ = _where(key)
        policy = self.policies.items.get(f"{tenant}.{model}")
        return policy is None or now - kept.time > policy.ttl_s

    async def put(self, policy: AnswerCache) -> AnswerCache:
        """Keep a tenant's answers to a model (or change how), once its tenant, its model and an
        embedding model of that name exist."""
        self.known_tenant(policy.tenant)
        if not self.known_model(policy.model):
            raise BadRequest(f"answer cache: no model '{policy.model}' in the catalog: `llmgw ctl models`")
        if self.model_version(policy.embedding) is None:
            raise BadRequest(f"answer cache: no embedding model '{policy.embedding}' in the catalog")
        key = f"{policy.tenant}.{policy.model}"
        was = self.policies.items.get(key)
        kept = msgspec.structs.replace(policy, created=was.created if was else time.time())
        await self.policies.kv.put(key, msgspec.json.encode(kept))
        self.policies.items[key] = kept
        change = AuditEntry(time=0, who=policy.by, area="knowledge", action="put", subject=f"cache {policy.model}")
        await record_change(self.nc, msgspec.structs.replace(change, tenant=policy.tenant), was, kept)
        return kept

    async def list_caches(self, query: BaseQuery) -> CacheList:
        """The answer caches of a tenant (or every one) and how many answers each holds."""
        caches = [p for _, p in sorted(self.policies.items.items()) if not query.tenant or p.tenant == query.tenant]
        held: dict[str, int] = {}
        for key in self.kept.items:
            where = ".".join(_where(key)[:2])
            held[where] = held.get(where, 0) + 1
        return CacheList(
            caches=caches, held={f"{c.tenant}.{c.model}": held.get(f"{c.tenant}.{c.model}", 0) for c in caches}
        )

    async def remove(self, ref: CacheRef) -> CacheList:
        """Stop keeping a tenant's answers to a model, forgetting those kept."""
        policy = self.policy(ref.tenant, ref.model)
        if policy is None:
            raise NotFound(f"tenant {ref.tenant} keeps no answers of model '{ref.model}': `llmgw ctl cache list`")
        gone = await self.purge(ref)
        await self.policies.kv.delete(f"{ref.tenant}.{ref.model}")
        self.policies.items.pop(f"{ref.tenant}.{ref.model}", None)
        change = AuditEntry(time=0, who=ref.by, area="knowledge", action="remove", subject=f"cache {ref.model}")
        await record_change(self.nc, msgspec.structs.replace(change, tenant=ref.tenant), policy, None)
        return CacheList(caches=[policy], held=gone.held)

    async def purge(self, ref: CacheRef) -> CacheList:
        """Forget the answers kept for a tenant (and one model, where named); `held` says how many."""
        prefix = f"{ref.tenant}.{ref.model}." if ref.model else f"{ref.tenant}."
        keys = [k for k in self.kept.items if k.startswith(prefix)]
        for key in keys:
            await self.kept.kv.delete(key)
            self.kept.items.pop(key, None)
        self.kept.touch(keys)
        self.kept.version += 1
        return CacheList(caches=[], held={prefix.rstrip("."): len(keys)})


def _where(key: str) -> tuple[str, str, str]:
    """An answer key's (tenant, model, variant); "": kept before answers had variants (and
    answering none now)."""
    parts = key.split(".")
    return parts[0], parts[1], parts[2] if len(parts) > 3 else ""
