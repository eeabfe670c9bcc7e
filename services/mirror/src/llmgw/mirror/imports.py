"""Files the mirror takes in from its own disk (the demo model from its wheel), checked against
the sha256 given for each: the same verified path as a fetch from the Hub, with a copy for a
download."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import msgspec

from llmgw.mirror.digests import CHUNK
from llmgw.mirror.hub import Stopped
from llmgw.proto import MirroredFile, MirroredRepo
from llmgw.proto._types import Source

__all__ = ["Import", "LocalFiles", "import_entry"]


class Import(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A file on the mirror's disk to take in and serve."""

    path: str
    """Where it is (read, never moved)."""
    source: Source
    """What it is served as, '<owner>/<repo>/<file>' (one import per '<owner>/<repo>')."""
    sha256: str
    """What its bytes must hash to (as its publisher gave it); anything else is refused."""


def import_entry(item: Import) -> MirroredRepo:
    """The fetch that takes `item` in."""
    owner, repo, name = item.source.split("/", 2)
    size = Path(item.path).stat().st_size
    return MirroredRepo(
        repo=f"{owner}/{repo}",
        commit="",
        revision="",
        origin=f"file:{item.path}",
        state="queued",
        files=[MirroredFile(path=name, size=size, sha256=item.sha256.lower())],
        size=size,
        added_by="config",
    )


class LocalFiles:
    """The mirror's own disk as an origin: `origin` is 'file:<path>' of the file to copy in."""

    def download(
        self,
        repo: MirroredRepo,
        file: MirroredFile,
        staging: Path,
        progress: Callable[[int], None],
        stop: threading.Event,
    ) -> Path:
        """Copy the file into `staging`, continuing a copy a stop cut short."""
        source = Path(repo.origin.removeprefix("file:"))
        dest = staging / file.path
        part = dest.with_name(dest.name + ".incomplete")
        done = part.stat().st_size if part.exists() else 0
        with open(source, "rb") as src, open(part, "ab") as out:
            src.seek(done)
            while block := src.read(CHUNK):
                if stop.is_set():
                    raise Stopped()
                out.write(block)
                done += len(block)
                progress(done)
        part.replace(dest)
        return dest
