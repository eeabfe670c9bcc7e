"""One knowledge base's chunks in memory, searched by cosine similarity: usearch (its HNSW graph
past `EXACT_UNDER` chunks, an exact scan below; docs/knowledge.md has the measurement that chose
it and its settings), with each chunk's document and text beside it. Without I/O: the store
feeds it.

Vectors are kept as float16 (half the memory; scores differ from float32's in the fourth
decimal); the graph is built with 64 candidates a step (twice as fast to build as usearch's 128,
the same recall once searched with 256: 0.99 of the exact top 10 at 200,000 chunks); a search
keeps more candidates the more chunks there are (`WIDTH`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from usearch.index import Index

__all__ = ["EXACT_UNDER", "WIDTH", "BaseIndex", "Found"]

EXACT_UNDER = 20_000
"""Below this many chunks a search scans them all (exact, and as fast as the graph)."""
WIDTH = (256, 1024)
"""How many candidates a search of the graph keeps: one for every 1,000 chunks, within these
(at 1,000,000 clustered chunks, 256 found a query's own chunk among its 10 in 81% of queries,
1,024 in 97% in 3 ms, 2,048 in 99.6% in 7 ms)."""


class Found(NamedTuple):
    """A chunk found: its document's key, its number in it, its cosine similarity and text."""

    doc: str
    chunk: int
    score: float
    text: str


class BaseIndex:
    """The chunks of one base's documents, by document."""

    def __init__(self, dim: int, model: str = "") -> None:
        self.dim, self.model = dim, model
        """How many numbers a vector has, and the embedding model (name and file) that made them."""
        self.index = Index(ndim=dim, metric="cos", dtype="f16", expansion_add=64, expansion_search=WIDTH[0])
        self.next_key = 0
        self.chunks: dict[int, tuple[str, int, str]] = {}
        """key -> (document, its chunk number, the chunk's text)."""
        self.docs: dict[str, tuple[str, np.ndarray]] = {}
        """document -> (what it was embedded as: sha256 and model, the keys of its chunks)."""

    def __len__(self) -> int:
        return len(self.chunks)

    def put(self, doc: str, version: str, texts: list[str], vectors: np.ndarray) -> None:
        """A document's chunks (a row of `vectors` each), in place of any it had."""
        if vectors.shape != (len(texts), self.dim):
            raise ValueError(f"{len(texts)} chunks of {self.dim} numbers each were expected, not {vectors.shape}")
        self.drop(doc)
        keys = np.arange(self.next_key, self.next_key + len(texts), dtype=np.uint64)
        self.next_key += len(texts)
        if len(keys):
            self.index.add(keys, vectors.astype(np.float32, copy=False))
        for key, (n, text) in zip(keys.tolist(), enumerate(texts), strict=True):
            self.chunks[key] = (doc, n, text)
        self.docs[doc] = (version, keys)

    def drop(self, doc: str) -> None:
        """A document's chunks out."""
        was = self.docs.pop(doc, None)
        if was is not None and len(was[1]):
            self.index.remove(was[1])
            for key in was[1].tolist():
                self.chunks.pop(key, None)

    def search(self, vector: np.ndarray, top: int) -> list[Found]:
        """The `top` chunks nearest `vector`, best first."""
        if not self.chunks:
            return []
        self.index.expansion_search = min(max(len(self.chunks) // 1000, WIDTH[0]), WIDTH[1])
        found = self.index.search(
            vector.astype(np.float32, copy=False), min(top, len(self.chunks)), exact=len(self.chunks) < EXACT_UNDER
        )
        out = []
        for key, distance in zip(found.keys.tolist(), found.distances.tolist(), strict=True):
            held = self.chunks.get(key)
            if held is not None:
                out.append(Found(held[0], held[1], 1.0 - float(distance), held[2]))
        return out
