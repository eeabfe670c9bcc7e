"""What each router does in the background for knowledge bases, in two tasks.

- `Ingest` embeds the documents that wait: it claims one in the bucket (compare-and-set, so two
  routers never embed the same one; a claim long past is taken over), reads and cuts it, asks
  its base's embedding model for the chunks' vectors through the router's own routing, and keeps
  them in the chunks store. A document whose model has no replica ready stays queued, saying
  so, and is tried again; one whose base's model changed is embedded again.
- `Follower` keeps this router's indexes as the bucket says: a document ready with its base's
  model now is in its base's index (its chunks read from the store), any other is not. A router
  started later, or again, builds the same indexes from the same store.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
import numpy as np
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from llmgw.bus import any_change, get_logger
from llmgw.proto.errors import described
from llmgw.proto.knowledge import Chunks, Document, KnowledgeBase
from llmgw.router.errors import ApiError, ContextTooLong
from llmgw.router.knowledge.chunk import chunks, halves
from llmgw.router.knowledge.index import BaseIndex
from llmgw.router.knowledge.parse import BadDocument, document_text
from llmgw.router.knowledge.store import Knowledge, chunks_name, delete_object

__all__ = ["CLAIM_S", "Follower", "Ingest"]

CLAIM_S = 600.0
"""How long a router's claim on a document holds before another takes it over."""
BATCH = 16
"""Chunks asked for in one embedding request."""
RETRY_S = 5.0
"""How long a document whose model could not embed it waits before it is tried again."""
AGAIN_S = 0.5
"""How soon an index that could not be brought up to date is tried again."""

_log = get_logger("router.knowledge")


class Ingest:
    """Embeds the documents that wait (one at a time: the engines are the fleet's)."""

    def __init__(self, knowledge: Knowledge) -> None:
        self.k = knowledge

    def due(self, doc: Document, now: float) -> bool:
        """Whether `doc` is this pass's to embed: queued, claimed long ago, or ready with a model
        its base no longer has."""
        base = self.k.bases.items.get(f"{doc.tenant}.{doc.base}")
        if base is None or self.k.waiting.get((doc.tenant, base.embedding), (0.0, ""))[0] > now:
            return False
        if doc.state == "queued":
            return True
        if doc.state == "embedding":
            return now - doc.claimed > CLAIM_S
        return doc.state == "ready" and doc.embedded_with != self.k.model_version(base.embedding)

    async def run(self) -> None:
        """Forever: embed what is due, then wait for a change (or the next retry)."""
        while True:
            docs, bases = self.k.docs, self.k.bases
            now = time.time()
            due = [k for k, d in list(docs.items.items()) if self.due(d, now)]
            for key in due:
                try:
                    await self.one(key)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # one document's failure never stops the others
                    _log.warning("embedding a document failed", key=key, error=described(exc))
            await any_change([docs, bases], docs.version + bases.version, timeout=RETRY_S)

    async def one(self, key: str) -> None:
        """Claim document `key` and embed it (or put it back, saying why)."""
        kv = self.k.docs.kv
        try:
            entry = await kv.get(key)
        except NotFoundError:
            return
        doc = msgspec.json.decode(entry.value, type=Document)
        base = self.k.bases.items.get(f"{doc.tenant}.{doc.base}")
        if base is None or not self.due(doc, time.time()):
            return
        claimed = msgspec.structs.replace(doc, state="embedding", reason="", claimed=time.time())
        try:
            revision = await kv.update(key, msgspec.json.encode(claimed), last=entry.revision)
        except KeyWrongLastSequenceError:
            return  # another router claimed it first, or it changed
        try:
            done = await self._embedded(key, claimed, base)
        except Exception as exc:  # the store failed it: put back, tried again by any router
            done = msgspec.structs.replace(doc, state="queued", reason=f"to be tried again: {described(exc)}")
            self.k.waiting[doc.tenant, base.embedding] = (time.time() + RETRY_S, described(exc))
        try:
            await kv.update(key, msgspec.json.encode(done), last=revision)
        except KeyWrongLastSequenceError:  # it was sent again (or removed) meanwhile: what is there now stands
            if done.state == "ready":
                await self._unless_named(key, done.sha256)

    async def _unless_named(self, key: str, sha256: str) -> None:
        """The chunks just kept for copy `sha256` of document `key` deleted, unless its record
        (sent again meanwhile) still names that copy: none are left that no document names."""
        try:
            now = msgspec.json.decode((await self.k.docs.kv.get(key)).value, type=Document)
            if now.sha256 == sha256:
                return
        except NotFoundError:  # removed (its base with it, say)
            pass
        await delete_object(self.k.chunk_store, chunks_name(key, sha256))

    async def _embedded(self, key: str, doc: Document, base: KnowledgeBase) -> Document:
        """`doc` read, cut, embedded and its chunks kept: the record it has then (ready, failed,
        or queued again where its model could not embed it now)."""
        version = self.k.model_version(base.embedding)
        if version is None:
            return self._wait(doc, base, f"no embedding model '{base.embedding}' in the catalog")
        try:
            data = (await self.k.files.get(key)).data or b""
            texts = await asyncio.to_thread(_cut, doc, data, base)
        except NotFoundError:
            return msgspec.structs.replace(doc, state="failed", reason="its file is gone: send it again")
        except BadDocument as exc:
            return msgspec.structs.replace(doc, state="failed", reason=str(exc))
        try:
            texts, vectors = await self._vectors(base, doc.tenant, texts)
        except ApiError as exc:
            if exc.status in (429, 502, 503):  # the model not ready, busy or failing: tried again
                return self._wait(doc, base, exc.message)
            return msgspec.structs.replace(doc, state="failed", reason=f"{base.embedding} refused it: {exc.message}")
        self.k.waiting.pop((doc.tenant, base.embedding), None)
        rows = np.asarray(vectors, dtype="<f4")
        kept = Chunks(sha256=doc.sha256, embedded_with=version, texts=texts, dim=rows.shape[1], vectors=rows.tobytes())
        await self.k.chunk_store.put(chunks_name(key, doc.sha256), msgspec.msgpack.encode(kept))
        return msgspec.structs.replace(
            doc, state="ready", reason="", chunks=len(texts), embedded_with=version, updated=time.time()
        )

    def _wait(self, doc: Document, base: KnowledgeBase, why: str) -> Document:
        """`doc` queued again: its model could not embed it now (tried again in `RETRY_S`)."""
        self.k.waiting[doc.tenant, base.embedding] = (time.time() + RETRY_S, why)
        return msgspec.structs.replace(doc, state="queued", reason=f"waiting for {base.embedding}: {why}")

    async def _vectors(self, base: KnowledgeBase, tenant: str, texts: list[str]) -> tuple[list[str], np.ndarray]:
        """Each chunk's vector, asked in batches; a chunk longer than the model takes at once is
        cut in two, and so on (the texts kept are those embedded)."""
        assert self.k.embed is not None
        kept: list[str] = []
        rows: list[np.ndarray] = []
        pending = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]
        while pending:
            batch = pending.pop(0)
            try:
                rows.append(await self.k.embed(base.embedding, batch, tenant))
                kept.extend(batch)
            except ApiError as exc:
                if exc.code != ContextTooLong.code:
                    raise
                # which one was too long is not said: one at a time, and one alone in halves
                pending[:0] = [[t] for t in batch] if len(batch) > 1 else [[h] for h in halves(batch[0])]
        return kept, np.concatenate(rows) if rows else np.zeros((0, 1), dtype="<f4")


class Follower:
    """Keeps `knowledge.indexes` as the buckets say."""

    def __init__(self, knowledge: Knowledge) -> None:
        self.k = knowledge
        self.loaded: dict[str, tuple[str, str]] = {}
        """document key -> (sha256, model) of the chunks in its base's index."""
        self.seen = -1
        self.lock = asyncio.Lock()

    async def run(self) -> None:
        """Forever: catch up whenever the buckets changed."""
        while True:
            await self.catch_up()
            if self.seen == -1:  # it failed
                await asyncio.sleep(AGAIN_S)
            await any_change([self.k.docs, self.k.bases], self.seen, timeout=RETRY_S)

    async def catch_up(self) -> None:
        """The indexes as the buckets are now (nothing to do where they did not change): what a
        search asks first, so a document the tree says is ready is found (where the store fails,
        it answers from what the index holds, said in the log)."""
        try:
            await self._catch_up()
        except Exception as exc:
            _log.warning("knowledge index not brought up to date", error=described(exc))
            self.seen = -1

    async def _catch_up(self) -> None:
        async with self.lock:
            now = self.k.docs.version + self.k.bases.version
            if now != self.seen:
                await self._sync()
                self.seen = now

    async def _sync(self) -> None:
        """One pass: the documents ready with their base's model in, every other out."""
        k, loaded = self.k, self.loaded
        wanted: dict[str, tuple[str, str]] = {}
        for key, doc in list(k.docs.items.items()):
            base = k.bases.items.get(f"{doc.tenant}.{doc.base}")
            version = k.model_version(base.embedding) if base else None
            if doc.state == "ready" and version and doc.embedded_with == version:
                wanted[key] = (doc.sha256, version)
        for key in [key for key in loaded if wanted.get(key) != loaded[key]]:
            index = k.indexes.get(_base_of(key))
            if index is not None:
                index.drop(key)
            del loaded[key]
        for key, version in wanted.items():
            if key not in loaded:
                await self._load(key, version)

    async def _load(self, key: str, version: tuple[str, str]) -> None:
        """A document's chunks read from the store into its base's index (a new index where the
        base's model changed)."""
        try:
            raw = (await self.k.chunk_store.get(chunks_name(key, version[0]))).data or b""
        except NotFoundError:
            return  # removed meanwhile
        kept = await asyncio.to_thread(msgspec.msgpack.decode, raw, type=Chunks)
        where = _base_of(key)
        index = self.k.indexes.get(where)
        if index is None or index.dim != kept.dim or index.model != version[1]:
            index = self.k.indexes[where] = BaseIndex(kept.dim, version[1])
            for other in [k for k in self.loaded if _base_of(k) == where]:
                del self.loaded[other]
        rows = np.frombuffer(kept.vectors, dtype="<f4").reshape(len(kept.texts), kept.dim)
        index.put(key, kept.sha256, kept.texts, rows)  # on the loop: usearch takes no search beside an add
        self.loaded[key] = version


def _cut(doc: Document, data: bytes, base: KnowledgeBase) -> list[str]:
    """A document's text cut into its base's chunks (in a worker thread: a PDF takes a while)."""
    return chunks(document_text(doc.path, data, doc.format), base.chunk_words, base.overlap_words)


def _base_of(key: str) -> tuple[str, str]:
    """A document key's (tenant, base)."""
    tenant, base = key.split(".")[:2]
    return tenant, base
