"""The mirror service: answers for the files it holds (over NATS) and serves them over HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path

import msgspec
from litestar import Litestar, Request, get
from litestar.response import Response, Stream

from llmgw.bus import ADMIN_PORTS, BusConfig, Context, HttpServer, NotFound, delete_under, entry_point
from llmgw.gguf import GGUFError, read_header
from llmgw.mirror.core import RangeNotSatisfiable, parse_range, source_path
from llmgw.proto import Empty, FileInfo, FileList, FileRef, WeightsDelete, WeightsDeleted
from llmgw.proto import mirror as mirror_api

__all__ = ["Mirror", "MirrorConfig", "main"]

_CHUNK = 1 << 20


class MirrorConfig(BusConfig, kw_only=True):
    """Mirror settings."""

    admin_port: int = ADMIN_PORTS["mirror"]

    root: str = ""
    """Directory of files, laid out '<owner>/<repo>/<file>' (default: <data_dir>/mirror)."""
    http_host: str = "127.0.0.1"
    http_port: int = 0
    """Port agents fetch files from; 0 picks a free one."""


class _Digest(msgspec.Struct):
    size: int
    mtime_ns: int
    sha256: str


class Mirror:
    """Holds weights files under one root."""

    name = "mirror"
    version = "0.1.0"
    description = "weights held, verified and served over HTTP"

    def __init__(self, config: MirrorConfig) -> None:
        self.config = config
        self.root = Path(config.root) if config.root else config.home() / "mirror"
        self.http: HttpServer | None = None
        self.ctx: Context | None = None
        self._headers: dict[Path, tuple[int, int, str]] = {}
        """What reading each file's header found, as of its (size, mtime_ns)."""

    async def start(self, ctx: Context) -> None:
        """Serve the files over HTTP, then answer for them over NATS."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.http = HttpServer(self._app(), self.config.http_host, self.config.http_port)
        await self.http.start()
        self.ctx = ctx
        await ctx.serve(mirror_api.FILE_STAT, self.stat)
        await ctx.serve(mirror_api.FILE_LIST, self.list)
        await ctx.serve(mirror_api.FILE_DELETE, self.delete)
        ctx.log.info("serving files", root=str(self.root), url=self.http.url)

    async def stop(self) -> None:
        """Stop serving files."""
        if self.http:
            await self.http.stop()

    def ready(self) -> bool:
        """Ready once files are served."""
        return self.http is not None

    def _file(self, source: str) -> Path:
        try:
            path = self.root / source_path(source)
        except ValueError as exc:
            raise NotFound(str(exc)) from None
        if not path.is_file():
            raise NotFound(f"the mirror holds no file '{source}' under {self.root}")
        return path

    async def stat(self, ref: FileRef) -> FileInfo:
        """One file's size, sha256 (unless `ref.digest` is False and it is not known yet), URL,
        and what is wrong with its GGUF header; NotFound when the mirror does not hold it."""
        path = self._file(ref.source)
        st = path.stat()
        digest = await asyncio.to_thread(_digest if ref.digest else _known_digest, path)
        return FileInfo(
            source=ref.source,
            size=st.st_size,
            sha256=digest.sha256 if digest else "",
            url=f"{self.http.url}/files/{ref.source}",
            header_error=await self._header_error(path, ref.source, st.st_size, st.st_mtime_ns),
        )

    async def _header_error(self, path: Path, source: str, size: int, mtime_ns: int) -> str:
        """Why the GGUF header of `path` does not read (its path said as `source`), or empty."""
        if not path.name.endswith(".gguf"):
            return ""
        known = self._headers.get(path)
        if known and known[:2] == (size, mtime_ns):
            return known[2]
        try:
            await asyncio.to_thread(read_header, path)
            error = ""
        except GGUFError as exc:
            error = str(exc).replace(str(path), source)
        self._headers[path] = (size, mtime_ns, error)
        return error

    async def list(self, _: Empty) -> FileList:
        """Every file held, as '<owner>/<repo>/<file>'."""
        sources = sorted(
            str(p.relative_to(self.root))
            for p in self.root.rglob("*")
            if p.is_file() and not p.name.startswith(".") and len(p.relative_to(self.root).parts) >= 3
        )
        return FileList(files=[await self.stat(FileRef(source=s)) for s in sources])

    async def delete(self, req: WeightsDelete) -> WeightsDeleted:
        """Delete files (and their digests); those it does not hold are left out of the answer."""
        deleted = []
        for source in req.sources:
            if await asyncio.to_thread(delete_under, self.root, str(source_path(source))):
                deleted.append(source)
                self.ctx.log.info("file deleted", source=source)
        return WeightsDeleted(where="mirror", deleted=deleted)

    def _app(self) -> Litestar:
        mirror = self

        @get("/files/{source:path}", sync_to_thread=False)
        def serve_file(request: Request, source: str) -> Response:
            try:
                path = mirror._file(source.lstrip("/"))
            except NotFound as exc:
                return Response(exc.message + "\n", status_code=404, media_type="text/plain")
            size = path.stat().st_size
            try:
                wanted = parse_range(request.headers.get("range"), size)
            except RangeNotSatisfiable as exc:
                return Response(
                    str(exc) + "\n",
                    status_code=416,
                    media_type="text/plain",
                    headers={"content-range": f"bytes */{size}"},
                )
            first, last = wanted or (0, size - 1)
            headers = {"accept-ranges": "bytes", "content-length": str(last - first + 1)}
            if wanted:
                headers["content-range"] = f"bytes {first}-{last}/{size}"
            return Stream(
                _read(path, first, last),
                status_code=206 if wanted else 200,
                media_type="application/octet-stream",
                headers=headers,
            )

        return Litestar([serve_file])


def _read(path: Path, first: int, last: int):
    with open(path, "rb") as f:
        f.seek(first)
        left = last - first + 1
        while left > 0:
            block = f.read(min(_CHUNK, left))
            if not block:
                return
            left -= len(block)
            yield block


def _known_digest(path: Path) -> _Digest | None:
    """The sha256 its '.<name>.sha256' sidecar keeps, if the file has not changed since."""
    st = path.stat()
    side = path.with_name(f".{path.name}.sha256")
    if side.exists():
        try:
            known = msgspec.json.decode(side.read_bytes(), type=_Digest)
            if (known.size, known.mtime_ns) == (st.st_size, st.st_mtime_ns):
                return known
        except msgspec.DecodeError:
            pass
    return None


def _digest(path: Path) -> _Digest:
    """sha256 of a file, kept in a '.<name>.sha256' sidecar until the file changes."""
    known = _known_digest(path)
    if known:
        return known
    st = path.stat()
    side = path.with_name(f".{path.name}.sha256")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    digest = _Digest(st.st_size, st.st_mtime_ns, h.hexdigest())
    tmp = side.with_suffix(".part")
    tmp.write_bytes(msgspec.json.encode(digest))
    tmp.replace(side)
    return digest


main = entry_point(Mirror, MirrorConfig)
"""Run the mirror until SIGTERM or SIGINT (`llmgw service mirror`, systemd, Nix)."""


if __name__ == "__main__":
    sys.exit(main())
