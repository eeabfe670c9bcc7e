"""The mirror's contract: repos fetched from Hugging Face (pinned, verified), the weights files it
holds, deleting them, its endpoints and its fetch events."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from llmgw.proto._endpoint import AdminRoute, Endpoint, Event
from llmgw.proto._page import Page
from llmgw.proto._shape import ModelFacts
from llmgw.proto._types import NonNegative, RepoId, Source
from llmgw.proto.hub import HubFound, HubSearch

__all__ = [
    "ADAPTER_CHECK",
    "ENDPOINTS",
    "EVENTS",
    "FETCH_CHANGED",
    "FILE_DELETE",
    "FILE_LIST",
    "FILE_STAT",
    "FILE_WHERE",
    "HUB_SEARCH",
    "REPO_ADD",
    "REPO_LIST",
    "REPO_REMOVE",
    "REPO_SHOW",
    "REPO_UPDATE",
    "AdapterCheck",
    "AdapterFacts",
    "Commit",
    "FetchState",
    "FileInfo",
    "FileList",
    "FilePlace",
    "FileRef",
    "MirroredFile",
    "MirroredRepo",
    "RepoAdd",
    "RepoList",
    "RepoRef",
    "SkippedFile",
    "WeightsDelete",
    "WeightsDeleted",
]

Commit = Annotated[str, Meta(pattern=r"^[0-9a-f]{40}$", description="a git commit, 40 hex digits")]

FetchState = Literal["queued", "fetching", "verifying", "ready", "failed"]
"""A fetch's life: waiting its turn, bytes coming, hashes being checked, every file verified and
served, or stopped with the reason (nothing of a failed file is served)."""


class FileRef(Struct, kw_only=True):
    """A weights file by its source."""

    source: Source
    digest: bool = True
    """False: a quick answer, hashing nothing now: its sha256 only where already known, else
    empty (the catalog's check of a file at put)."""


class FileInfo(Struct, kw_only=True):
    """A file the mirror holds."""

    source: str
    size: NonNegative
    sha256: str
    url: str
    """Where agents fetch it over HTTP (range requests allowed)."""
    header_error: str = ""
    """Why a `.gguf` file's header does not read (not GGUF, cut short, damaged); empty when it
    reads, and for other files."""
    verified: bool = False
    """Its bytes were checked against the hash published for them (by Hugging Face at the commit
    in its source, by the primary mirror, or given when it was imported). False for a file
    placed on the mirror by hand."""
    mirror: str = ""
    """Which mirror answered (its node name)."""
    site: str = ""
    """The site that mirror is at (agents prefer a mirror at their own site)."""
    facts: ModelFacts | None = None
    """What a `.gguf` file's header says the model is (read once by the mirror; None for other
    files, a header that does not read, or a part of a split model after the first)."""


class FileList(Struct, kw_only=True):
    """Every file the mirror holds (or a page of them, by source)."""

    files: list[FileInfo]
    next: str = ""
    """Where the next page starts (ask again with it as `Page.after`); "": this is the last."""


class FilePlace(Struct, kw_only=True):
    """A weights file in one place (the mirror or a node), and what became of it."""

    source: str
    where: str
    """'mirror' or the node's name."""
    why: str = ""
    """Why it was kept (another model uses it, a replica still runs on it), or empty."""


class WeightsDelete(Struct, kw_only=True):
    """Delete these files from a weights store (the mirror, or every node's cache)."""

    sources: list[Source]


class WeightsDeleted(Struct, kw_only=True):
    """One store's answer to WeightsDelete."""

    where: str
    """'mirror' or the node's name."""
    deleted: list[str] = field(default_factory=list)
    kept: list[FilePlace] = field(default_factory=list)


class RepoAdd(Struct, kw_only=True):
    """Fetch a repo from Hugging Face, pinned to the commit its revision names now."""

    repo: RepoId
    revision: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")] = "main"
    """A branch, a tag or a commit; what it names now is what is kept."""
    include: list[Annotated[str, Meta(min_length=1, max_length=200)]] = field(default_factory=list)
    """Glob patterns of the files wanted (`*Q4_K_M.gguf`); empty: every GGUF and safetensors
    file with the configs and tokenizer files beside them."""
    by: str = ""
    """Who asked (recorded)."""


class RepoRef(Struct, kw_only=True):
    """A mirrored repo, at one commit or at every commit held."""

    repo: RepoId
    commit: Annotated[str, Meta(pattern=r"^([0-9a-f]{40})?$")] = ""
    """Empty: every commit of it the mirror holds (for update: the newest)."""
    by: str = ""
    """On remove and update: who asks (the audit trail says)."""


class MirroredFile(Struct, kw_only=True):
    """One file of a mirrored repo, as published and as fetched."""

    path: str
    """Its path in the repo."""
    size: NonNegative
    sha256: str = ""
    """Published by the Hub for a large (LFS) file; for a small one, found once it verified."""
    blob_id: str = ""
    """The git blob sha1 the Hub published (what a small file is checked against)."""
    done: NonNegative = 0
    """Bytes fetched so far."""
    state: Literal["pending", "fetching", "verifying", "ready", "failed"] = "pending"
    error: str = ""


class SkippedFile(Struct, kw_only=True):
    """A file of the repo the mirror left out, and why."""

    path: str
    why: str


class MirroredRepo(Struct, kw_only=True):
    """A repo at one commit on the mirror: what was asked, what is fetched, how far it is."""

    repo: str
    commit: Annotated[str, Meta(pattern=r"^([0-9a-f]{40})?$")]
    """The 40-hex commit its files were fetched at; empty for files imported from the mirror's
    own disk with a known sha256 (the demo model), whose sources carry no commit."""
    revision: str
    """The revision asked for (a branch `ctl mirror update` follows, a tag, or the commit)."""
    origin: str
    """Where the bytes come from: the Hub's URL, the primary mirror's, or `file:` for an import."""
    state: FetchState
    files: list[MirroredFile] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    include: list[str] = field(default_factory=list)
    size: NonNegative = 0
    """Bytes of every file chosen."""
    done: NonNegative = 0
    """Bytes fetched so far."""
    rate: float = 0.0
    """Bytes a second over the last few seconds."""
    eta_s: float | None = None
    """Seconds left at that rate (None: unknown)."""
    error: str = ""
    """Why it failed (state 'failed')."""
    added_by: str = ""
    added_at: float = 0.0
    updated_at: float = 0.0


class RepoList(Struct, kw_only=True):
    """Mirrored repos, each at one commit (a list: a page of them, by repo, newest commit first)."""

    repos: list[MirroredRepo] = field(default_factory=list)
    next: str = ""
    """Where the next page starts (ask again with it as `Page.after`); "": this is the last."""


_RESOLVE_S = 60.0
"""An add or update resolves the revision on the Hub and lists its files before it answers."""
_REPO = (("repo", "{owner}/{name}"),)

REPO_ADD = Endpoint(
    "mirror",
    "repo.add",
    RepoAdd,
    MirroredRepo,
    "Fetch a repo from Hugging Face, pinned to its revision's commit (queued: its state says how far).",
    timeout_s=_RESOLVE_S,
    admin=AdminRoute("POST", "/mirror", 202, least="operator"),
)
REPO_LIST = Endpoint(
    "mirror",
    "repo.list",
    Page,
    RepoList,
    "Every repo fetched or being fetched, at each commit; in pages.",
    admin=AdminRoute("GET", "/mirror", least="operator"),
)
REPO_SHOW = Endpoint(
    "mirror",
    "repo.show",
    RepoRef,
    RepoList,
    "One repo, at one commit or at every commit held: each file's size, hash and state.",
    admin=AdminRoute("GET", "/mirror/{owner}/{name}", fields=_REPO, least="operator"),
)
REPO_REMOVE = Endpoint(
    "mirror",
    "repo.remove",
    RepoRef,
    RepoList,
    "Delete a repo's files (one commit or all) that no model uses; says what was removed.",
    admin=AdminRoute("DELETE", "/mirror/{owner}/{name}", fields=_REPO, least="operator"),
)
REPO_UPDATE = Endpoint(
    "mirror",
    "repo.update",
    RepoRef,
    MirroredRepo,
    "Fetch the newest commit of a repo's branch beside the old.",
    timeout_s=_RESOLVE_S,
    admin=AdminRoute("POST", "/mirror/{owner}/{name}/update", 202, fields=_REPO, body=False, least="operator"),
)
FILE_WHERE = Endpoint(
    "mirror",
    "file.where",
    FileRef,
    FileInfo,
    "Every mirror holding a verified copy of a file answers (agents take the nearest).",
    every_instance=True,
)


class AdapterCheck(Struct, kw_only=True):
    """Whether a LoRA adapter file fits a model's weights file (both on the mirror)."""

    source: Source
    """The adapter."""
    base: Source
    """The model's weights it is meant for."""


class AdapterFacts(Struct, kw_only=True):
    """What an adapter's header says, once it is known to fit its base."""

    source: str
    architecture: str
    rank: NonNegative
    """The rank of its low-rank matrices (the largest, where they differ)."""
    alpha: float = 0.0
    """Its LoRA alpha (0: the file does not say; the scale is then taken as it is)."""
    tensors: NonNegative = 0
    """The base's tensors it adapts."""
    size: NonNegative = 0
    """Its bytes."""


FILE_STAT = Endpoint("mirror", "file.stat", FileRef, FileInfo, "One file's size, hash and HTTP URL.")
FILE_LIST = Endpoint("mirror", "file.list", Page, FileList, "Every file the mirror holds, in pages.")
FILE_DELETE = Endpoint("mirror", "file.delete", WeightsDelete, WeightsDeleted, "Delete files from the mirror.")
HUB_SEARCH = Endpoint(
    "mirror",
    "hub.search",
    HubSearch,
    HubFound,
    "Models on the Hub with their GGUF files, each file's header read by HTTP range requests.",
    timeout_s=80.0,
)
ADAPTER_CHECK = Endpoint(
    "mirror",
    "adapter.check",
    AdapterCheck,
    AdapterFacts,
    "Whether a LoRA adapter file on the mirror was made for a model's weights (their headers read).",
)
ENDPOINTS = (
    REPO_ADD,
    REPO_LIST,
    REPO_SHOW,
    REPO_REMOVE,
    REPO_UPDATE,
    FILE_STAT,
    FILE_WHERE,
    FILE_LIST,
    FILE_DELETE,
    HUB_SEARCH,
    ADAPTER_CHECK,
)
"""The mirror's endpoints."""

FETCH_CHANGED = Event(
    "mirror.fetch", MirroredRepo, "A fetch moved on (state, bytes, rate, time left).", ("commit",), "mirror"
)
EVENTS = (FETCH_CHANGED,)
"""What the mirror publishes."""
