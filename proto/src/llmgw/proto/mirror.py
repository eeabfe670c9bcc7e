"""The mirror's contract: the weights files it holds, deleting them, and its endpoints."""

from __future__ import annotations

from msgspec import Struct, field

from llmgw.proto._endpoint import Endpoint
from llmgw.proto._types import Empty, NonNegative, Source

__all__ = [
    "ENDPOINTS",
    "FILE_DELETE",
    "FILE_LIST",
    "FILE_STAT",
    "FileInfo",
    "FileList",
    "FilePlace",
    "FileRef",
    "WeightsDelete",
    "WeightsDeleted",
]


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


class FileList(Struct, kw_only=True):
    """Every file the mirror holds."""

    files: list[FileInfo]


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


FILE_STAT = Endpoint("mirror", "file.stat", FileRef, FileInfo, "One file's size, hash and HTTP URL.")
FILE_LIST = Endpoint("mirror", "file.list", Empty, FileList, "Every file the mirror holds.")
FILE_DELETE = Endpoint("mirror", "file.delete", WeightsDelete, WeightsDeleted, "Delete files from the mirror.")
ENDPOINTS = (FILE_STAT, FILE_LIST, FILE_DELETE)
"""The mirror's endpoints."""
