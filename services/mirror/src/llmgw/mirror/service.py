"""The mirror service: fetches repos from Hugging Face (pinned, verified), answers for the files
it holds over NATS, and serves them over HTTP."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import msgspec
from litestar import Litestar, Request, get
from litestar.response import Response, Stream

from llmgw.bus import Context, HttpServer, NotFound, ScrapeCollector, delete_under, entry_point
from llmgw.gguf import GGUFError, read_header, read_model, split_parts
from llmgw.mirror.adapters import adapter_facts
from llmgw.mirror.config import MirrorConfig
from llmgw.mirror.core import RangeNotSatisfiable, parse_range, source_path
from llmgw.mirror.digests import CHUNK, Digest, digest, known_digest
from llmgw.mirror.fetches import Fetches
from llmgw.mirror.gauges import mirror_series
from llmgw.mirror.hub import Hub
from llmgw.mirror.imports import LocalFiles, import_entry
from llmgw.mirror.peer import Peer
from llmgw.mirror.repos import RepoDesk
from llmgw.mirror.search import search
from llmgw.modelplan import facts_from_gguf
from llmgw.proto import FileInfo, FileList, FileRef, ModelFacts, Page, WeightsDelete, WeightsDeleted, page_of
from llmgw.proto import mirror as mirror_api
from llmgw.proto.hub import HubFound, HubSearch
from llmgw.proto.mirror import AdapterCheck, AdapterFacts

__all__ = ["Mirror", "MirrorConfig", "main"]


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
        self._headers: dict[Path, tuple[int, int, str, ModelFacts | None]] = {}
        """What reading each file's header found (why it does not read, what the model is), as of
        its (size, mtime_ns): read once per file, and every caller gets it from `stat`."""
        self.hub = Hub(config.hub_url(), config.hub_token())
        self.fetches = Fetches(self.root, self._published, config.parallel_files)
        self.fetches.origins = {self.hub.endpoint: self.hub, "file:": LocalFiles()}
        self.desk = RepoDesk(self)
        self.peer = Peer(self)

    async def start(self, ctx: Context) -> None:
        """Serve the files over HTTP, take up the fetches a stop cut short, then answer over NATS."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.http = HttpServer(self._app(), self.config.http_host, self.config.http_port)
        await self.http.start()
        self.ctx = ctx
        ctx.metrics.register(ScrapeCollector(mirror_series(self.fetches)))
        await asyncio.to_thread(self.fetches.load)
        for item in self.config.imports:
            await self.fetches.queue(await asyncio.to_thread(import_entry, item))
        self.fetches.start()
        self.peer.start()
        endpoints = {
            **self.desk.handlers(),
            mirror_api.FILE_STAT: self.stat,
            mirror_api.FILE_LIST: self.list,
            mirror_api.FILE_DELETE: self.delete,
            mirror_api.HUB_SEARCH: self.search,
            mirror_api.ADAPTER_CHECK: self.check_adapter,
        }
        if self.config.primary:  # a copy: the primary answers for the fleet (a request goes to one mirror)
            endpoints = {}
        endpoints[mirror_api.FILE_WHERE] = self.where  # every mirror says what it holds: agents take the nearest
        for endpoint, handler in endpoints.items():
            await ctx.serve(endpoint, handler)
        ctx.log.info("serving files", root=str(self.root), url=self.http.url, hub=self.hub.endpoint)

    async def stop(self) -> None:
        """Stop fetching (partial files are kept, to resume) and serving files."""
        await self.peer.stop()
        await self.fetches.stop()
        if self.http:
            await self.http.stop()

    async def _published(self, repo) -> None:
        if self.ctx is not None:
            fetch_id = repo.commit or "local"
            await self.ctx.nc.publish(mirror_api.FETCH_CHANGED.subject(fetch_id), msgspec.json.encode(repo))

    def ready(self) -> bool:
        """Ready once files are served."""
        return self.http is not None

    def _file(self, source: str) -> Path:
        try:
            path = self.root / source_path(source)
        except ValueError as exc:
            raise NotFound(str(exc)) from None
        if not path.is_file() or self.root.resolve() not in path.resolve().parents:
            raise NotFound(f"the mirror holds no file '{source}' under {self.root}{self.desk.held_hint(source)}")
        if "@" in source.split("/")[1] and self.fetches.file(source) is None:
            raise NotFound(f"the mirror holds '{source}' but has not verified it; fetch it with `llmgw ctl mirror add`")
        return path

    async def stat(self, ref: FileRef) -> FileInfo:
        """One file's size, sha256 (unless `ref.digest` is False and it is not known yet), URL,
        and what its GGUF header says (the model's facts, or what is wrong with it); NotFound when
        the mirror does not hold it."""
        path = self._file(ref.source)
        st = path.stat()
        found: Digest | None = await asyncio.to_thread(digest if ref.digest else known_digest, path)
        verified = self.fetches.file(ref.source)
        if verified and found and found.sha256 != verified.sha256:
            raise NotFound(
                f"{ref.source} changed on the mirror's disk since it was verified (sha256 {found.sha256}, verified "
                f"{verified.sha256}); remove it and fetch it again"
            )
        error, facts = await self._header(path, ref.source, st.st_size, st.st_mtime_ns)
        return FileInfo(
            source=ref.source,
            size=st.st_size,
            sha256=verified.sha256 if verified else found.sha256 if found else "",
            url=f"{self.http.url}/files/{ref.source}",
            header_error=error,
            verified=verified is not None,
            mirror=self.config.node_name(),
            site=self.config.site,
            facts=facts,
        )

    async def where(self, ref: FileRef) -> FileInfo:
        """This mirror's verified copy of a file (every mirror answers; NotFound where it has none)."""
        info = await self.stat(ref)
        if not info.verified:
            raise NotFound(f"mirror {info.mirror} holds no verified copy of {ref.source}")
        return info

    async def _header(self, path: Path, source: str, size: int, mtime_ns: int) -> tuple[str, ModelFacts | None]:
        """Why the GGUF header of `path` does not read (its path said as `source`), or empty; and
        what it says the model is (None where it does not read, for a part after the first, and
        for a split model while a part is missing: kept only once known)."""
        if not path.name.endswith(".gguf"):
            return "", None
        known = self._headers.get(path)
        if known and known[:2] == (size, mtime_ns):
            return known[2], known[3]
        error, facts, final = await asyncio.to_thread(_read_header, path, source)
        if final:
            self._headers[path] = (size, mtime_ns, error, facts)
        return error, facts

    async def list(self, ask: Page) -> FileList:
        """Every file held, as '<owner>/<repo>/<file>', by source (a page of them)."""
        sources = sorted(
            str(p.relative_to(self.root))
            for p in self.root.rglob("*")
            if p.is_file()
            and len(p.relative_to(self.root).parts) >= 3
            and not any(part.startswith(".") for part in p.relative_to(self.root).parts)
        )
        files = []
        for source in sources:
            try:
                files.append(await self.stat(FileRef(source=source)))
            except NotFound:  # a file in a pinned folder that no fetch verified: not offered
                continue
        page, after = page_of(files, ask, lambda f: (f.source,), "the file list")
        return FileList(files=page, next=after)

    async def search(self, ask: HubSearch) -> HubFound:
        """Models on the Hub with their GGUF files' headers (`llmgw.mirror.search`)."""
        return await asyncio.to_thread(search, self.hub, ask)

    async def check_adapter(self, ask: AdapterCheck) -> AdapterFacts:
        """Whether an adapter it holds fits a model's weights it holds (`llmgw.mirror.adapters`)."""
        return await asyncio.to_thread(adapter_facts, ask, self._file(ask.source), self._file(ask.base))

    async def delete(self, req: WeightsDelete) -> WeightsDeleted:
        """Delete files (and their digests); those it does not hold are left out of the answer."""
        deleted = []
        for source in req.sources:
            if await asyncio.to_thread(delete_under, self.root, str(source_path(source))):
                deleted.append(source)
                self.ctx.log.info("file deleted", source=source)
            await self.fetches.forget_file(source)
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

        return Litestar([serve_file, mirror.peer.route()])


def _read(path: Path, first: int, last: int):
    with open(path, "rb") as f:
        f.seek(first)
        left = last - first + 1
        while left > 0:
            block = f.read(min(CHUNK, left))
            if not block:
                return
            left -= len(block)
            yield block


main = entry_point(Mirror, MirrorConfig)
"""Run the mirror until SIGTERM or SIGINT (`llmgw service mirror`, systemd, Nix)."""


if __name__ == "__main__":
    sys.exit(main())


def _read_header(path: Path, source: str) -> tuple[str, ModelFacts | None, bool]:
    """(In a thread.) What `path`'s header says: why it does not read, the model's facts (read from
    every part of a split model, from its first), and whether that is final."""
    try:
        header = read_header(path)
    except GGUFError as exc:
        return str(exc).replace(str(path), source), None, True
    parts = split_parts(str(path))
    if parts[0] != str(path):
        return "", None, True  # a later part: the first part's facts are the model's
    if len(parts) > 1:
        try:
            header = read_model(path)
        except (GGUFError, OSError):
            return "", None, False  # a part not there (yet): asked again next time
    return "", facts_from_gguf(header), True
