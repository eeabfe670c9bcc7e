"""A document's embedding racing its replacement and its base's removal, on a real NATS and the
real object stores (the embedding model a stand-in function: no engine is what is tested): no
chunks are left behind that no document names."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
from nats.js.errors import NotFoundError

from llmgw.proto.knowledge import KnowledgeBase
from llmgw.router.knowledge.ingest import Ingest
from llmgw.router.knowledge.store import Knowledge, doc_key

BASE = KnowledgeBase(tenant="lab", name="docs", embedding="mini")
KEY = doc_key("lab", "docs", "a.txt")


async def _knowledge(nc) -> Knowledge:
    k = await Knowledge.open(nc.jetstream(), nc, lambda _: None)
    k.model_version = lambda name: "mini@1" if name == "mini" else None
    await k.bases.kv.put("lab.docs", msgspec.json.encode(BASE))  # as put_base keeps it
    for _ in range(200):
        if "lab.docs" in k.bases.items and k.docs.synced:
            return k
        await asyncio.sleep(0.02)
    raise AssertionError("the buckets were never read")


async def _until(check) -> None:
    """Until `check()` holds, as the watch brings the records (10 s at most)."""
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never")


async def _chunk_objects(k: Knowledge) -> list[str]:
    try:
        return sorted(o.name for o in await k.chunk_store.list() if not o.deleted)
    except NotFoundError:  # an empty store
        return []


def _embedding(during):
    """A stand-in embedding model that runs `during` while it embeds the first batch."""
    asked = []

    async def embed(model: str, texts: list[str], tenant: str) -> np.ndarray:
        if not asked:
            asked.append(texts)
            await during()
        return np.full((len(texts), 4), 0.5, dtype=np.float32)

    return embed


async def test_a_document_replaced_while_it_is_embedded_leaves_no_chunks_of_the_old_copy(nc):
    k = await _knowledge(nc)
    try:
        await k.upload("lab", "docs", "a.txt", b"the first copy of the document", "t")
        k.embed = _embedding(lambda: k.upload("lab", "docs", "a.txt", b"the second copy, sent meanwhile", "t"))
        await Ingest(k).one(KEY)  # the first copy's chunks made, its record changed meanwhile
        await _until(lambda: k.docs.items[KEY].state == "queued")  # the second copy waits its turn
        assert await _chunk_objects(k) == []
        await Ingest(k).one(KEY)
        await _until(lambda: k.docs.items[KEY].state == "ready")
        assert len(await _chunk_objects(k)) == 1  # the second copy's alone
    finally:
        for task in k.tasks:
            task.cancel()


async def test_a_base_removed_while_a_document_is_embedded_leaves_no_chunks(nc):
    k = await _knowledge(nc)
    try:
        await k.upload("lab", "docs", "a.txt", b"a document of a base about to go", "t")
        k.embed = _embedding(lambda: k._forget([KEY]))  # what remove_base does with each document
        await Ingest(k).one(KEY)
        assert KEY not in k.docs.items
        assert await _chunk_objects(k) == []
    finally:
        for task in k.tasks:
            task.cancel()
