"""The Hub searched for what fits: models on Hugging Face (or `HF_ENDPOINT`) with their GGUF
files, each file's header read by HTTP range requests (no download), and for each the ways it
would run on the fleet now. The mirror searches (`mirror.hub.search`); the catalog adds the ways
(`catalog.hub.search`), as its serve plan reckons them for a mirrored file."""

from __future__ import annotations

import re
from typing import Annotated

from msgspec import Meta, Struct, field

from llmgw.proto._serve import ServePlan
from llmgw.proto._shape import ModelFacts
from llmgw.proto._types import NonNegative, RepoId

__all__ = ["HubFile", "HubFound", "HubModel", "HubSearch", "HubWays", "fetch_glob"]

_SPLIT = re.compile(r"^(?P<stem>.*)-00001-of-(?P<count>\d{5})\.gguf$")


def fetch_glob(path: str) -> str:
    """The `RepoAdd.include` glob that fetches a file a search listed: every part of a split
    model with its first."""
    m = _SPLIT.match(path)
    return f"{m['stem']}-*-of-{m['count']}.gguf" if m else path


class HubSearch(Struct, kw_only=True):
    """What to look for on the Hub."""

    text: Annotated[str, Meta(min_length=1, max_length=200)]
    """Words in the repo's name ("qwen2.5 0.5b"): the Hub's own search (`text`, not `query`: the
    admin API takes the request's fields from the query string)."""
    limit: Annotated[int, Meta(ge=1, le=50)] = 10
    """Models at most, most downloaded first."""
    files: Annotated[int, Meta(ge=1, le=200)] = 40
    """GGUF files whose headers are read at most, over all the models (the rest are listed unread)."""


class HubFile(Struct, kw_only=True):
    """One GGUF model file of a repo (a split model: its first part, for every part)."""

    path: str
    """Its path in the repo."""
    source: str
    """How the catalog names it once mirrored: OWNER/REPO@COMMIT/PATH."""
    size: NonNegative = 0
    """Bytes of every part, as the header's tensors say (0: not read)."""
    parts: NonNegative = 1
    facts: ModelFacts | None = None
    """What its header says; None where it was not read (`error` says why)."""
    error: str = ""


class HubModel(Struct, kw_only=True):
    """A model repo found on the Hub, at the commit its main branch names now."""

    repo: RepoId
    commit: str
    downloads: NonNegative = 0
    likes: NonNegative = 0
    updated: str = ""
    """When it last changed (the Hub's lastModified)."""
    gated: bool = False
    """Its files need an accepted licence and a token."""
    files: list[HubFile] = field(default_factory=list)


class HubFound(Struct, kw_only=True):
    """What the Hub answered a search with."""

    models: list[HubModel] = field(default_factory=list)
    endpoint: str = ""
    """The Hub searched."""
    headers_read: NonNegative = 0
    bytes_read: NonNegative = 0
    """Of the files' bytes, what reading their headers took (range requests)."""


class HubWays(Struct, kw_only=True):
    """A search's models, and for each file read the ways it would run on the fleet now."""

    found: HubFound
    plans: dict[str, ServePlan] = field(default_factory=dict)
    """File source -> its serve plan (every way, best first, with ~tok/s and slow marks)."""
    nodes: NonNegative = 0
    """Nodes the plans were made on (0: no node registered; the plans are empty)."""
