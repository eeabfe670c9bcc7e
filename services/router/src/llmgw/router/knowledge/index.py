"""One knowledge base's chunks in memory, searched by cosine similarity: usearch (its HNSW graph
past `EXACT_UNDER` chunks, an exact scan below; docs/knowledge.md has the measurement that chose
it), with each chunk's document and text beside it. Without I/O: the store feeds it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from usearch.index import Index

__all__ = ["EXACT_UNDER", "BaseIndex", "Found"]

EXACT_UNDER = 20_000
"""Below this many chunks a search scans them all (exact, and as fast as the graph)."""


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
        self.index = Index(ndim=dim, metric="cos", dtype="f32")
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
        found = self.index.search(
            vector.astype(np.float32, copy=False), min(top, len(self.chunks)), exact=len(self.chunks) < EXACT_UNDER
        )
        out = []
        for key, distance in zip(found.keys.tolist(), found.distances.tolist(), strict=True):
            held = self.chunks.get(key)
            if held is not None:
                out.append(Found(held[0], held[1], 1.0 - float(distance), held[2]))
        return out
