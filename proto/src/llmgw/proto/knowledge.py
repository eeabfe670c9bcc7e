"""Knowledge: a tenant's knowledge bases, each a tree of documents (text, Markdown, HTML, PDF)
cut into chunks and embedded by the router with an embedding model the fleet serves. A chat
completion that names a base (`"knowledge": "handbook"`) is answered from its best chunks, and
says which it used; `/v1/vector_stores/{base}/search` asks a base alone. The router keeps them
(the `kb` and `kb_docs` buckets; the files and their chunks in object stores) and answers these
endpoints; `llmgw ctl kb`, `llmgw kb push` and the admin API ask them."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

from llmgw.proto._endpoint import AdminRoute, Endpoint
from llmgw.proto._types import Name, NameOrEmpty
from llmgw.proto.people import DEFAULT_TENANT

__all__ = [
    "CACHE_LIST",
    "CACHE_PURGE",
    "CACHE_PUT",
    "CACHE_REMOVE",
    "DOC_LIST",
    "DOC_REMOVE",
    "ENDPOINTS",
    "FORMATS",
    "KB_LIST",
    "KB_PUT",
    "KB_REMOVE",
    "KB_SEARCH",
    "MOST_BYTES",
    "AnswerCache",
    "BaseList",
    "BaseQuery",
    "BaseRef",
    "CacheList",
    "CacheRef",
    "CachedAnswer",
    "Chunks",
    "DocPath",
    "DocRef",
    "Document",
    "DocumentList",
    "Hit",
    "KnowledgeBase",
    "SearchAnswer",
    "SearchAsk",
]

MOST_BYTES = 20 * 1024 * 1024
"""The largest document a knowledge base takes (20 MiB)."""

FORMATS = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html"}
FORMATS |= {".htm": "html", ".pdf": "pdf"}
"""What a document's name ends with -> how it is read."""

DocPath = Annotated[
    str,
    Meta(
        pattern=r"^(?!.*(^|/)\.{1,2}(/|$))[^/\x00-\x1f][^\x00-\x1f]{0,510}(?<!/)$",
        description="a path inside the base, folders split by '/': no '.' or '..' part, at most 511 characters",
    ),
]
"""Where a document sits in its base's tree (`policies/travel.md`)."""

State = Literal["queued", "embedding", "ready", "failed"]
"""queued: in, waiting for its embedding model; embedding: being cut and embedded; ready:
answered from; failed: it could not be read (`reason` says why; sending it again retries)."""


class KnowledgeBase(Struct, kw_only=True):
    """A tenant's knowledge base."""

    name: Name
    tenant: Name = DEFAULT_TENANT
    embedding: Name
    """The catalog's embedding model its chunks are embedded with (changing it embeds them again)."""
    description: Annotated[str, Meta(max_length=500)] = ""
    chunk_words: Annotated[int, Meta(ge=20, le=1000)] = 160
    """About how many words a chunk holds (a chunk never crosses its model's context: one that
    does is cut again)."""
    overlap_words: Annotated[int, Meta(ge=0, le=200)] = 20
    """How many words of a chunk's end the next one starts with."""
    top: Annotated[int, Meta(ge=1, le=50)] = 5
    """How many chunks a chat completion is answered from (at most; as many as fit its context)."""
    alias: NameOrEmpty = ""
    """A model name the base's tenant asks for (`/v1/models` lists it): a chat completion to it is
    one to `model` answered from this base."""
    model: NameOrEmpty = ""
    """The chat model its alias is answered by."""
    created: float = 0.0
    by: str = ""


class Document(Struct, kw_only=True):
    """A document in a base, and how far it is."""

    tenant: Name = DEFAULT_TENANT
    base: Name
    path: DocPath
    sha256: str
    size: int
    format: Literal["text", "markdown", "html", "pdf"]
    state: State = "queued"
    reason: str = ""
    """queued: what it waits for; failed: why it could not be read."""
    chunks: int = 0
    embedded_with: str = ""
    """The embedding model (name and file) its chunks were embedded with."""
    updated: float = 0.0
    by: str = ""
    claimed: float = 0.0
    """When a router began embedding it (another takes it over when this is long past)."""


class Chunks(Struct, kw_only=True):
    """A document's chunks and their vectors, as the `llmgw_kb_chunks` object store keeps them
    (msgpack): what a router builds its index from."""

    sha256: str
    """The document's, as embedded."""
    embedded_with: str
    texts: list[str]
    dim: int
    vectors: bytes
    """float32, little-endian, one row of `dim` a chunk, each of length 1."""


class BaseQuery(Struct, kw_only=True):
    """The bases of a tenant ("": every tenant)."""

    tenant: str = ""


class BaseList(Struct, kw_only=True):
    """Knowledge bases, by tenant and name."""

    bases: list[KnowledgeBase]


class BaseRef(Struct, kw_only=True):
    """A base; `folder` narrows its tree to what lies under it."""

    name: Name
    tenant: Name = DEFAULT_TENANT
    folder: Annotated[str, Meta(max_length=511)] = ""
    by: str = ""


class DocRef(Struct, kw_only=True):
    """A document, or (`path` ending in '/') every document under a folder."""

    base: Name
    path: Annotated[str, Meta(min_length=1, max_length=512)]
    tenant: Name = DEFAULT_TENANT
    by: str = ""


class DocumentList(Struct, kw_only=True):
    """Documents, by path."""

    documents: list[Document]


class SearchAsk(Struct, kw_only=True):
    """A question asked of a base."""

    base: Name
    query: Annotated[str, Meta(min_length=1, max_length=20_000)]
    tenant: Name = DEFAULT_TENANT
    top: Annotated[int, Meta(ge=1, le=50)] = 5


class Hit(Struct, kw_only=True):
    """A chunk found, best first."""

    path: str
    chunk: int
    """Which chunk of the document (from 0)."""
    score: float
    """Cosine similarity to the question (1: the same direction)."""
    text: str


class SearchAnswer(Struct, kw_only=True):
    """The chunks found, best first."""

    hits: list[Hit]


class AnswerCache(Struct, kw_only=True):
    """Answers to similar questions kept for a tenant's requests to a model: a chat completion
    whose conversation embeds close enough to one answered before (and not long ago) is answered
    as that one was, without asking the model."""

    tenant: Name = DEFAULT_TENANT
    model: Name
    """The chat model whose answers are kept."""
    embedding: Name
    """The embedding model questions are compared with."""
    threshold: Annotated[float, Meta(ge=0.5, le=1.0)] = 0.9
    """How close (cosine) a question must be to one answered before (with all-MiniLM-L6-v2, 0.9
    answered 60% of paraphrases as before and 1 of 30 changed questions wrongly:
    docs/benchmarks.md)."""
    ttl_s: Annotated[int, Meta(ge=60, le=30 * 86400)] = 86400
    """How long an answer is kept."""
    max_temperature: Annotated[float, Meta(ge=0.0, le=2.0)] = 0.5
    """Requests sampled hotter than this are neither answered from nor kept (unless they ask:
    `"cache": "force"`); nor are requests with tools."""
    created: float = 0.0
    by: str = ""


class CachedAnswer(Struct, kw_only=True):
    """One answer kept (the `answers` bucket): the conversation it answered (its text and
    vector), and the answer as its client got it."""

    question: str
    embedded_with: str
    vector: bytes
    """float32, little-endian, length 1."""
    content: str
    """The answer's text."""
    events: bytes = b""
    """The answer's SSE events as they were streamed (b"": it was not streamed)."""
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    time: float


class CacheRef(Struct, kw_only=True):
    """A tenant's answer cache for a model ("": every model of the tenant, for a purge)."""

    tenant: Name = DEFAULT_TENANT
    model: Annotated[str, Meta(max_length=63)] = ""
    by: str = ""


class CacheList(Struct, kw_only=True):
    """Answer caches, by tenant and model, and how many answers each holds now."""

    caches: list[AnswerCache]
    held: dict[str, int] = {}
    """`<tenant>.<model>` -> answers kept."""


KB_PUT = Endpoint(
    "router",
    "kb.put",
    KnowledgeBase,
    KnowledgeBase,
    "Make a knowledge base or change it (another embedding model embeds its documents again).",
    admin=AdminRoute("PUT", "/knowledge/{tenant}/{base}", fields=(("name", "{base}"),), least="operator"),
)
KB_LIST = Endpoint(
    "router",
    "kb.list",
    BaseQuery,
    BaseList,
    "Knowledge bases.",
    admin=AdminRoute("GET", "/knowledge", least="member"),
)
KB_REMOVE = Endpoint(
    "router",
    "kb.remove",
    BaseRef,
    BaseList,
    "Remove a knowledge base with its documents.",
    admin=AdminRoute("DELETE", "/knowledge/{tenant}/{base}", fields=(("name", "{base}"),), least="operator"),
)
DOC_LIST = Endpoint(
    "router",
    "kb.documents",
    BaseRef,
    DocumentList,
    "A knowledge base's tree: its documents (under a folder) and how far each is.",
    admin=AdminRoute("GET", "/knowledge/{tenant}/{base}/documents", fields=(("name", "{base}"),), least="member"),
)
DOC_REMOVE = Endpoint(
    "router",
    "kb.document.remove",
    DocRef,
    DocumentList,
    "Remove a document (or a folder's documents) from a knowledge base.",
    admin=AdminRoute("DELETE", "/knowledge/{tenant}/{base}/documents", least="member", body=False),
)
KB_SEARCH = Endpoint(
    "router",
    "kb.search",
    SearchAsk,
    SearchAnswer,
    "The chunks of a knowledge base nearest a question.",
    admin=AdminRoute("POST", "/knowledge/{tenant}/{base}/search", status=200, least="member"),
    timeout_s=30.0,
)
CACHE_PUT = Endpoint(
    "router",
    "cache.put",
    AnswerCache,
    AnswerCache,
    "Keep a tenant's answers to a model, answering similar questions from them (or change how).",
    admin=AdminRoute("PUT", "/answer-cache/{tenant}/{model}", least="operator"),
)
CACHE_LIST = Endpoint(
    "router",
    "cache.list",
    BaseQuery,
    CacheList,
    "Answer caches.",
    admin=AdminRoute("GET", "/answer-cache", least="member"),
)
CACHE_REMOVE = Endpoint(
    "router",
    "cache.remove",
    CacheRef,
    CacheList,
    "Stop keeping a tenant's answers to a model, and forget those kept.",
    admin=AdminRoute("DELETE", "/answer-cache/{tenant}/{model}", least="operator"),
)
CACHE_PURGE = Endpoint(
    "router",
    "cache.purge",
    CacheRef,
    CacheList,
    "Forget the answers kept for a tenant (and model), keeping on keeping new ones.",
    admin=AdminRoute("POST", "/answer-cache/{tenant}/purge", least="operator"),
)
ENDPOINTS = (
    KB_PUT,
    KB_LIST,
    KB_REMOVE,
    DOC_LIST,
    DOC_REMOVE,
    KB_SEARCH,
    CACHE_PUT,
    CACHE_LIST,
    CACHE_REMOVE,
    CACHE_PURGE,
)
"""The knowledge endpoints (the router answers them). Documents come in over HTTP (the admin
API's `PUT /knowledge/{tenant}/{base}/documents/{path}`), not NATS: a file is larger than a
message."""
