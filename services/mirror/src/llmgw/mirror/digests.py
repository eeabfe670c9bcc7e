"""Hashing files on the mirror's disk: sha256 kept in a '.<name>.sha256' sidecar until the file
changes, and the one-pass check of a fetched file against what was published for it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from llmgw.mirror.checks import blob_header

__all__ = ["CHUNK", "Digest", "digest", "hashes", "known_digest", "remember_digest"]

CHUNK = 1 << 20


class Digest(msgspec.Struct):
    """A file's sha256 as of its size and mtime."""

    size: int
    mtime_ns: int
    sha256: str


def _sidecar(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256")


def known_digest(path: Path) -> Digest | None:
    """The sha256 its sidecar keeps, if the file has not changed since."""
    st = path.stat()
    side = _sidecar(path)
    if side.exists():
        try:
            known = msgspec.json.decode(side.read_bytes(), type=Digest)
            if (known.size, known.mtime_ns) == (st.st_size, st.st_mtime_ns):
                return known
        except msgspec.DecodeError:
            pass
    return None


def remember_digest(path: Path, sha256: str) -> Digest:
    """Keep `sha256` as the file's digest (as of its size and mtime now)."""
    st = path.stat()
    found = Digest(st.st_size, st.st_mtime_ns, sha256)
    tmp = _sidecar(path).with_suffix(".part")
    tmp.write_bytes(msgspec.json.encode(found))
    tmp.replace(_sidecar(path))
    return found


def digest(path: Path) -> Digest:
    """sha256 of a file, from its sidecar or hashed (and kept there)."""
    return known_digest(path) or remember_digest(path, hashes(path)[0])


def hashes(path: Path, blob: bool = True) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file, in one read; the sha1 only with `blob` (else empty:
    it is checked only for small files, which have no published sha256)."""
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(blob_header(path.stat().st_size)) if blob else None
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            sha256.update(block)
            if sha1:
                sha1.update(block)
    return sha256.hexdigest(), sha1.hexdigest() if sha1 else ""
