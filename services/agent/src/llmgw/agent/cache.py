"""The node's weights cache: each file fetched once from the mirror, kept under its sha256.

Layout: `<cache>/<sha256>/<file name>` (the name kept, so the parts of a split GGUF find each
other), with `.sources` beside it listing the mirror sources that are this content. A fetch
holds a lock per hash (two replicas of one model fetch once), resumes a `.part` left by a break
with a range request, and keeps the file only if its hash is the mirror's. A failed fetch
removes what it wrote. A kept file is checked again (hashed) when it changed on disk since its
last check (`.<name>.checked` holds its size and mtime then): one that fails is removed, with a
log line, and fetched again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import shutil
from pathlib import Path

import httpx
import msgspec

from llmgw.bus import get_logger
from llmgw.proto import FileInfo

__all__ = ["FetchError", "WeightsCache"]

_CHUNK = 1 << 20
_log = get_logger("agent")


class _Checked(msgspec.Struct):
    """A cached file as it was when its hash was last found to be the mirror's."""

    size: int
    mtime_ns: int
    sha256: str


class FetchError(Exception):
    """A fetch that failed; the message says why (and nothing partial was kept)."""


class WeightsCache:
    """Weights on this node, by content."""

    def __init__(self, root: Path, http: httpx.AsyncClient) -> None:
        self.root, self.http = root, http
        self._locks: dict[str, asyncio.Lock] = {}
        self.fetches = 0
        """Files actually downloaded (not found in the cache) since start."""

    def path_for(self, info: FileInfo) -> Path:
        """Where the file of `info` is (or will be) kept."""
        return self.root / info.sha256 / info.source.rsplit("/", 1)[-1]

    async def fetch(self, info: FileInfo) -> Path:
        """The file, from the cache or fetched (resumed where a break left it) and checked."""
        async with self._locks.setdefault(info.sha256, asyncio.Lock()):
            dest = self.path_for(info)
            if not (dest.is_file() and dest.stat().st_size == info.size and await self._verified(info, dest)):
                await self._download(info, dest)
            self._remember(dest.parent, info.source)
            return dest

    async def _verified(self, info: FileInfo, dest: Path) -> bool:
        """Whether the cached `dest` is still the mirror's file: as it was at its last check, or
        hashed again; one that fails is removed (it is fetched again)."""
        if _checked(dest) == _Checked(*_stat(dest), info.sha256):
            return True
        if await asyncio.to_thread(_sha256, dest) == info.sha256:
            _mark_checked(dest, info.sha256)
            return True
        _log.warning("cached file failed verification; removed", source=info.source, path=str(dest), sha256=info.sha256)
        dest.unlink(missing_ok=True)
        _marker(dest).unlink(missing_ok=True)
        return False

    async def _download(self, info: FileInfo, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f".{dest.name}.part")
        h = hashlib.sha256()
        have = part.stat().st_size if part.exists() else 0
        if have > info.size:
            part.unlink()
            have = 0
        if have:
            with open(part, "rb") as f:  # what a break left: hashed again, then continued
                while block := f.read(_CHUNK):
                    h.update(block)
        headers = {"range": f"bytes={have}-"} if have else {}
        self.fetches += 1
        try:
            async with self.http.stream("GET", info.url, headers=headers) as r:
                if r.status_code not in (200, 206):
                    raise FetchError(f"mirror answered {r.status_code} for {info.url}")
                if r.status_code == 200 and have:  # the server ignored the range: start over
                    h, have = hashlib.sha256(), 0
                with open(part, "ab" if have else "wb") as f:
                    async for block in r.aiter_bytes(_CHUNK):
                        h.update(block)
                        f.write(block)
        except OSError as exc:
            part.unlink(missing_ok=True)
            if exc.errno == errno.ENOSPC:
                raise FetchError(
                    f"{info.source}: the disk under {self.root} is full while fetching "
                    f"{info.size / 2**30:.1f} GiB; free space or collect unused weights "
                    "(`llmgw ctl weights --collect`)"
                ) from None
            raise FetchError(f"{info.source}: writing {part}: {exc.strerror}") from None
        except httpx.HTTPError as exc:  # a break: the .part stays for the next try to resume
            raise FetchError(
                f"{info.source}: fetching from the mirror broke off ({exc}); the next start resumes"
            ) from None
        if h.hexdigest() != info.sha256:
            part.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # its folder, unless another file is in it
                dest.parent.rmdir()
            _log.warning("fetched file failed verification; removed", source=info.source, sha256=h.hexdigest())
            raise FetchError(f"{info.source}: sha256 {h.hexdigest()} is not the mirror's {info.sha256}; not used")
        part.replace(dest)
        _mark_checked(dest, info.sha256)

    def _remember(self, folder: Path, source: str) -> None:
        sources = self._sources(folder)
        if source not in sources:
            (folder / ".sources").write_text("\n".join([*sources, source]) + "\n")

    @staticmethod
    def _sources(folder: Path) -> list[str]:
        try:
            return [line for line in (folder / ".sources").read_text().splitlines() if line]
        except OSError:
            return []

    def entries(self) -> dict[Path, list[str]]:
        """Each cached content's folder and the sources that are it."""
        if not self.root.is_dir():
            return {}
        return {d: self._sources(d) for d in sorted(self.root.iterdir()) if d.is_dir() and not d.name.startswith(".")}

    def delete(self, folder: Path) -> None:
        """Delete one cached content."""
        shutil.rmtree(folder, ignore_errors=True)


def _marker(path: Path) -> Path:
    return path.with_name(f".{path.name}.checked")


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _checked(path: Path) -> _Checked | None:
    try:
        return msgspec.json.decode(_marker(path).read_bytes(), type=_Checked)
    except (OSError, msgspec.DecodeError):
        return None


def _mark_checked(path: Path, sha256: str) -> None:
    _marker(path).write_bytes(msgspec.json.encode(_Checked(*_stat(path), sha256)))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()
