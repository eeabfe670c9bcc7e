"""The mirror's one config Struct, and what its parts (`repos`, `peer`) take of the service."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import msgspec

from llmgw.bus import ADMIN_PORTS, BusConfig, Context
from llmgw.mirror.fetches import Fetches
from llmgw.mirror.hub import Hub
from llmgw.mirror.imports import Import

__all__ = ["MirrorConfig", "MirrorParts"]


class MirrorConfig(BusConfig, kw_only=True):
    """Mirror settings."""

    admin_port: int = ADMIN_PORTS["mirror"]

    root: str = ""
    """Directory of files, laid out '<owner>/<repo>/<file>' (default: <data_dir>/mirror)."""
    http_host: str = "127.0.0.1"
    http_port: int = 0
    """Port agents fetch files from; 0 picks a free one."""
    site: str = ""
    """Where this mirror is (agents at the same site take it first)."""
    hub_endpoint: str = ""
    """The Hugging Face Hub (or one that speaks its API); default: HF_ENDPOINT, else huggingface.co."""
    token_file: str = ""
    """A file holding the Hub token (default: the HF_TOKEN environment variable). Never logged."""
    parallel_files: int = 4
    """Files fetched at once."""
    keep_free_bytes: int = 1_000_000_000
    """A fetch that would leave less free space than this on the mirror's disk is refused."""
    imports: list[Import] = msgspec.field(default_factory=list)
    """Files on this machine to take in (checked against their sha256) and serve."""
    catalog_check_s: float = 5.0
    """How long removing a repo waits for the catalog to say which models use it."""
    primary: str = ""
    """The primary mirror's HTTP URL (where it serves files): this mirror then copies, and
    verifies again, every repo it holds ready (`llmgw.mirror.peer`); repos are added there."""
    sync_s: float = 30.0
    """How often a secondary mirror asks its primary what it holds."""

    def hub_url(self) -> str:
        """The Hub this mirror fetches from."""
        return (self.hub_endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")

    def hub_token(self) -> str:
        """The Hub token: from token_file, else HF_TOKEN, else none."""
        if self.token_file:
            return Path(self.token_file).read_text().strip()
        return os.environ.get("HF_TOKEN", "").strip()


class MirrorParts(Protocol):
    """What the repo desk and the peer use of the mirror service (not the service itself: they
    are its parts, and import nothing of it)."""

    config: MirrorConfig
    root: Path
    ctx: Context | None
    hub: Hub
    fetches: Fetches
