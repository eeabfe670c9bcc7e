"""Knowledge bases as the router keeps them: the bases and their documents in KV buckets every
router watches, each document's file and its chunks (with their vectors) in JetStream object
stores, replicated like the rest of llmgw's state; each router's index in memory is made from
them (`ingest.py` follows them). The operations every face calls are here: make, list and remove
bases, a base's tree, a document in and out, a question asked of a base.

A base belongs to a tenant: every key names its tenant, and every lookup goes through it, so a
question asked in one tenant never scores another's chunks (nor learns that they exist: the
same 404 either way)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable

import msgspec
import numpy as np
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from llmgw.bus import BadRequest, Context, Internal, KvTable, NotFound, obs_bucket, record_change
from llmgw.proto import BUCKETS, KB_CHUNKS, KB_FILES
from llmgw.proto import knowledge as api
from llmgw.proto.knowledge import (
    BaseList,
    BaseQuery,
    BaseRef,
    DocRef,
    Document,
    DocumentList,
    Hit,
    KnowledgeBase,
    SearchAnswer,
    SearchAsk,
)
from llmgw.proto.people import AuditEntry
from llmgw.router.errors import ApiError, ContextTooLong
from llmgw.router.knowledge.index import BaseIndex
from llmgw.router.knowledge.parse import BadDocument, document_format, document_text

__all__ = ["OPENING", "Embed", "Knowledge", "chunks_name", "delete_object", "doc_key", "no_base"]

Embed = Callable[[str, list[str], str], Awaitable[np.ndarray]]
"""(model, texts, tenant) -> one unit-length row a text, asked of the model through the router's
own routing; its refusals are the router's (`ApiError`: 503 no replica ready, 400 too long)."""


OPENING = "This router is still opening its knowledge bases; try again shortly."
"""What a request that needs the knowledge bases is told in a router's first seconds."""


def no_base(tenant: str, name: str) -> str:
    """What a base that is not there is answered with (the same for another tenant's)."""
    return f"tenant {tenant} has no knowledge base '{name}': `llmgw ctl kb list` lists them"


def chunks_name(key: str, sha256: str) -> str:
    """Where a document's chunks of one copy (its sha256) are in the chunks store: two routers
    embedding two copies never write over each other's."""
    return f"{key}.{sha256[:16]}"


def doc_key(tenant: str, base: str, path: str) -> str:
    """A document's key in the `kb_docs` bucket and the object stores."""
    return f"{tenant}.{base}.{hashlib.sha256(path.encode()).hexdigest()[:32]}"


class Knowledge:
    """The knowledge bases, their documents and the indexes made of them."""

    def __init__(
        self,
        bases: KvTable[KnowledgeBase],
        docs: KvTable[Document],
        stores: tuple[ObjectStore, ObjectStore],
        nc: Client,
        known_tenant: Callable[[str], None],
    ) -> None:
        self.bases, self.docs, self.nc, self.known_tenant = bases, docs, nc, known_tenant
        self.files, self.chunk_store = stores
        self.embed: Embed | None = None
        """Embeds through the router's routing (the gateway, once wired)."""
        self.chat_model: Callable[[str], bool] = lambda _: False
        """Whether the catalog has a chat model (or alias) of that name (once wired)."""
        self.model_version: Callable[[str], str | None] = lambda _: None
        """An embedding model's name and file as its documents record them (None: the catalog
        has no embedding model of that name): set once the directory is wired."""
        self.indexes: dict[tuple[str, str], BaseIndex] = {}
        """(tenant, base) -> its chunks in memory (`ingest.Follower` keeps them)."""
        self.tasks: list[asyncio.Task] = []
        self.catch_up: Callable[[], Awaitable[None]] | None = None
        """Brings the indexes up to the buckets (`ingest.Follower`, once wired)."""
        self.editions: dict[tuple[str, str], tuple[tuple[int, int], str]] = {}
        """(tenant, base) -> (the buckets' versions it was worked out at, `edition`)."""
        self.waiting: dict[tuple[str, str], tuple[float, str]] = {}
        """(tenant, embedding model) that could not embed lately -> (when it is tried again, why):
        what that tenant's queued documents wait for."""

    @classmethod
    async def open(cls, js: JetStreamContext, nc: Client, known_tenant: Callable[[str], None]) -> Knowledge:
        """Watch the buckets (creating them and the object stores on first use)."""
        bases = await KvTable.open(js, BUCKETS["kb"], KnowledgeBase)
        docs = await KvTable.open(js, BUCKETS["kb_docs"], Document)
        return cls(bases, docs, (await obs_bucket(js, KB_FILES), await obs_bucket(js, KB_CHUNKS)), nc, known_tenant)

    async def serve(self, ctx: Context) -> None:
        """Answer `router.kb.*`."""
        await ctx.serve(api.KB_PUT, self.put_base)
        await ctx.serve(api.KB_LIST, self.list_bases)
        await ctx.serve(api.KB_REMOVE, self.remove_base)
        await ctx.serve(api.DOC_LIST, self.documents)
        await ctx.serve(api.DOC_REMOVE, self.remove_documents)
        await ctx.serve(api.KB_SEARCH, self.search)

    def stop(self) -> None:
        """Stop watching and working."""
        for task in self.tasks:
            task.cancel()
        self.bases.stop()
        self.docs.stop()

    def base(self, tenant: str, name: str) -> KnowledgeBase:
        """Tenant `tenant`'s base `name`; NotFound (the same words whether another tenant has one
        of that name or none does)."""
        found = self.bases.items.get(f"{tenant}.{name}")
        if found is None:
            raise NotFound(no_base(tenant, name))
        return found

    def edition(self, tenant: str, name: str) -> str:
        """A digest of tenant `tenant`'s base `name` as it is now: its embedding model (and that
        model's file now), how many chunks it answers from, and each document's path, copy, state
        and embedding. Any change to what it answers from changes it (the answer cache keeps an
        answer for one edition). "": no such base."""
        base = self.bases.items.get(f"{tenant}.{name}")
        if base is None:
            return ""
        seen = (self.bases.version, self.docs.version)
        known = self.editions.get((tenant, name))
        if known is not None and known[0] == seen:
            return known[1]
        prefix = f"{tenant}.{name}."
        docs = sorted(
            (d.path, d.sha256, d.state, d.embedded_with) for k, d in self.docs.items.items() if k.startswith(prefix)
        )
        what = [base.embedding, self.model_version(base.embedding), base.top, base.created, docs]
        digest = hashlib.sha256(msgspec.json.encode(what)).hexdigest()[:16]
        self.editions[(tenant, name)] = (seen, digest)
        return digest

    async def put_base(self, base: KnowledgeBase) -> KnowledgeBase:
        """Make a base or change it, once its tenant exists and its model is an embedding model."""
        self.known_tenant(base.tenant)
        if self.model_version(base.embedding) is None:
            raise BadRequest(
                f"knowledge base {base.name}: no embedding model '{base.embedding}' in the catalog: serve one "
                "(`llmgw ctl serve ... --name NAME`, an embedding GGUF) and name it"
            )
        self._check_alias(base)
        key = f"{base.tenant}.{base.name}"
        was = self.bases.items.get(key)
        kept = msgspec.structs.replace(base, created=was.created if was else time.time())
        await self.bases.kv.put(key, msgspec.json.encode(kept))
        self.bases.items[key] = kept
        change = AuditEntry(time=0, who=base.by, area="knowledge", action="put", subject=base.name, tenant=base.tenant)
        await record_change(self.nc, change, was, kept)
        return kept

    def _check_alias(self, base: KnowledgeBase) -> None:
        """A base's alias names a chat model to answer it, and no model nor another base's alias."""
        if not base.alias:
            return
        if not base.model or not self.chat_model(base.model):
            raise BadRequest(f"knowledge base {base.name}: its alias is answered by a chat model: give 'model'")
        if self.chat_model(base.alias) or self.model_version(base.alias) is not None:
            raise BadRequest(f"knowledge base {base.name}: '{base.alias}' is a model's name already")
        other = self.bound(base.tenant, base.alias)
        if other is not None and other.name != base.name:
            raise BadRequest(f"knowledge base {base.name}: '{base.alias}' is knowledge base {other.name}'s alias")

    def bound(self, tenant: str, alias: str) -> KnowledgeBase | None:
        """The base of `tenant` whose alias `alias` is (None: none)."""
        return next((b for b in self.bases.items.values() if b.tenant == tenant and b.alias == alias), None)

    def aliases(self, tenant: str) -> list[str]:
        """The bases' aliases of `tenant`."""
        return [b.alias for b in self.bases.items.values() if b.tenant == tenant and b.alias]

    async def list_bases(self, query: BaseQuery) -> BaseList:
        """The bases of a tenant, or every one."""
        found = [b for _, b in sorted(self.bases.items.items()) if not query.tenant or b.tenant == query.tenant]
        return BaseList(bases=found)

    async def remove_base(self, ref: BaseRef) -> BaseList:
        """Remove a base with every document, file and chunk of it."""
        base = self.base(ref.tenant, ref.name)
        await self._forget([k for k in self.docs.items if k.startswith(f"{ref.tenant}.{ref.name}.")])
        await self.bases.kv.delete(f"{ref.tenant}.{ref.name}")
        self.bases.items.pop(f"{ref.tenant}.{ref.name}", None)
        self.indexes.pop((ref.tenant, ref.name), None)
        change = AuditEntry(time=0, who=ref.by, area="knowledge", action="remove", subject=ref.name, tenant=ref.tenant)
        await record_change(self.nc, change, base, None)
        return BaseList(bases=[base])

    async def documents(self, ref: BaseRef) -> DocumentList:
        """A base's documents (under `folder`), by path."""
        base = self.base(ref.tenant, ref.name)
        prefix, folder = f"{ref.tenant}.{ref.name}.", ref.folder.strip("/")
        found = [
            d
            for k, d in self.docs.items.items()
            if k.startswith(prefix) and (not folder or d.path.startswith(folder + "/"))
        ]
        why = self.waiting.get((ref.tenant, base.embedding), (0.0, ""))[1]
        if why:  # what the documents still queued wait for, as this router last heard it
            said = f"waiting for {base.embedding}: {why}"
            found = [msgspec.structs.replace(d, reason=said) if d.state == "queued" else d for d in found]
        return DocumentList(documents=sorted(found, key=lambda d: d.path))

    async def remove_documents(self, ref: DocRef) -> DocumentList:
        """Remove a document, or (a path ending in '/') every document under that folder."""
        self.base(ref.tenant, ref.base)
        prefix = f"{ref.tenant}.{ref.base}."
        if ref.path.endswith("/"):
            gone = {k: d for k, d in self.docs.items.items() if k.startswith(prefix) and d.path.startswith(ref.path)}
        else:
            key = doc_key(ref.tenant, ref.base, ref.path)
            gone = {key: self.docs.items[key]} if key in self.docs.items else {}
        if not gone:
            raise NotFound(f"knowledge base {ref.base} has no document '{ref.path}': `llmgw ctl kb tree {ref.base}`")
        await self._forget(list(gone))
        return DocumentList(documents=sorted(gone.values(), key=lambda d: d.path))

    async def upload(self, tenant: str, base: str, path: str, data: bytes, by: str) -> Document:
        """A document in (or in place of the one at `path`): read at once (a document that cannot
        be read is refused, and the one it would replace kept), kept, and queued to be embedded.
        The same bytes again change nothing (a push run again duplicates nothing)."""
        kb = self.base(tenant, base)
        try:
            msgspec.convert({"base": base, "path": path, "sha256": "", "size": 0, "format": "text"}, Document)
        except msgspec.ValidationError as exc:
            raise BadRequest(f"document path '{path[:200]}': {exc}") from None
        try:
            fmt = document_format(path, data)
            await asyncio.to_thread(document_text, path, data, fmt)  # a large PDF takes seconds: off the loop
        except BadDocument as exc:
            raise BadRequest(str(exc)) from None
        key, sha = doc_key(tenant, base, path), hashlib.sha256(data).hexdigest()
        was = self.docs.items.get(key)
        if was is not None and was.sha256 == sha and was.state != "failed":
            return was
        await self.files.put(key, data)
        if was is not None and was.sha256 != sha:
            await delete_object(self.chunk_store, chunks_name(key, was.sha256))  # the old copy's chunks
        doc = Document(
            tenant=tenant, base=base, path=path, sha256=sha, size=len(data), format=fmt,  # type: ignore[arg-type]
            reason=f"waiting to be embedded with {kb.embedding}", updated=time.time(), by=by,
        )  # fmt: skip
        await self.docs.kv.put(key, msgspec.json.encode(doc))
        self.docs.items[key] = doc
        return doc

    async def search(self, ask: SearchAsk) -> SearchAnswer:
        """The chunks of a base nearest a question (the router's refusals in the bus's terms)."""
        try:
            return SearchAnswer(hits=await self.retrieve(ask.tenant, ask.base, ask.query, ask.top))
        except ApiError as exc:
            raise (BadRequest if exc.status == 400 else NotFound if exc.status == 404 else Internal)(
                exc.message
            ) from None

    async def retrieve(self, tenant: str, base: str, question: str, top: int) -> list[Hit]:
        """The `top` chunks of tenant `tenant`'s base nearest `question`, best first (the
        router's refusals raised as they come: its embedding model not ready, the question longer
        than it takes)."""
        kb = self.base(tenant, base)
        assert self.embed is not None
        try:
            vector = (await self.embed(kb.embedding, [question], tenant))[0]  # even for an empty base: a 503 says why
        except ApiError as exc:
            if exc.code != ContextTooLong.code:
                raise
            raise BadRequest(
                f"the question is longer than knowledge base {base}'s embedding model {kb.embedding} reads at once "
                f"({exc.message}); ask it in fewer words"
            ) from None
        if self.catch_up is not None:
            await self.catch_up()
        index = self.indexes.get((tenant, base))
        if index is None or index.model != self.model_version(kb.embedding):
            return []  # none embedded yet with the base's model now
        paths = {k: d.path for k, d in self.docs.items.items() if k.startswith(f"{tenant}.{base}.")}
        return [
            Hit(path=paths.get(f.doc, "?"), chunk=f.chunk, score=round(f.score, 4), text=f.text)
            for f in index.search(vector, top)
            if f.doc in paths
        ]

    async def _forget(self, keys: list[str]) -> None:
        """Documents out of the bucket and the object stores (the indexes follow the bucket)."""
        for key in keys:
            await self.docs.kv.delete(key)
            doc = self.docs.items.pop(key, None)
            await delete_object(self.files, key)
            if doc is not None:
                await delete_object(self.chunk_store, chunks_name(key, doc.sha256))


async def delete_object(store: ObjectStore, name: str) -> None:
    """Delete object `name` of `store`, where it is there."""
    try:
        await store.delete(name)
    except NotFoundError:
        pass
