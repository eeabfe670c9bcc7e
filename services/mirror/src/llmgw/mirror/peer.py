"""A second mirror kept in step with a primary one: it copies every repo the primary holds ready,
file by file over the primary's HTTP (resuming a partial file with a Range request), and
verifies each copy itself against the sha256 in the primary's manifest before serving it. A
repo gone from the primary goes from here. A site without Hugging Face access is served so.

Every mirror says what it holds at `GET /repos` (`Peer.route`): a RepoList of its ready repos.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec
from litestar import Response, get

from llmgw.bus import delete_under, get_logger
from llmgw.mirror.config import MirrorParts
from llmgw.mirror.digests import CHUNK
from llmgw.mirror.fetches import key_of
from llmgw.mirror.hub import Stopped
from llmgw.mirror.plan import Refused, check_room, safe_path
from llmgw.proto import MirroredFile, MirroredRepo, RepoList
from llmgw.proto.errors import Internal

__all__ = ["Peer", "PeerOrigin"]

_log = get_logger("mirror")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_BACKOFF_MAX_S = 3600.0


class PeerOrigin:
    """The primary mirror as an origin: a file of a repo is `<url>/files/<key>/<path>`."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._timeout = httpx.Timeout(timeout_s)

    def download(
        self,
        repo: MirroredRepo,
        file: MirroredFile,
        staging: Path,
        progress: Callable[[int], None],
        stop: threading.Event,
    ) -> Path:
        """Download the file into `staging`, continuing a `.incomplete` one a break left with a
        Range request; raises Stopped once `stop` is set (what came is kept, to resume)."""
        dest = staging / file.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".incomplete")
        done = part.stat().st_size if part.exists() else 0
        if done > file.size:
            part.unlink()
            done = 0
        progress(done)
        if done < file.size or not part.exists():
            self._get(f"{self.url}/files/{key_of(repo.repo, repo.commit)}/{file.path}", part, done, progress, stop)
        part.replace(dest)
        return dest

    def _get(self, url: str, part: Path, done: int, progress: Callable[[int], None], stop: threading.Event) -> None:
        headers = {"range": f"bytes={done}-"} if done else {}
        try:
            with httpx.stream("GET", url, headers=headers, timeout=self._timeout) as r:
                if r.status_code not in (200, 206):
                    raise Internal(f"the primary mirror answered {r.status_code} for {url}: {r.read()[:200]!r}")
                if r.status_code == 200:  # the whole file (no range asked, or it was ignored)
                    done = 0
                with open(part, "ab" if done else "wb") as out:
                    for block in r.iter_bytes(CHUNK):
                        if stop.is_set():
                            raise Stopped()
                        out.write(block)
                        done += len(block)
                        progress(done)
        except httpx.HTTPError as exc:  # a break: the .incomplete stays for the next try to resume
            raise Internal(f"copying {url} from the primary mirror broke off ({exc}); it is tried again") from None


class Peer:
    """A mirror's side of keeping mirrors in step. On every mirror: `GET /repos` (`route`), its
    ready repos, once the manifests are read. On a secondary (`primary` set): polls
    `<primary>/repos` every `sync_s` (and at start), queues a copy of each ready repo not held
    here, removes the copies of repos gone from the primary; a copy that failed is tried again
    later, less often each time."""

    def __init__(self, mirror: MirrorParts) -> None:
        self.mirror = mirror
        self.url = mirror.config.primary.rstrip("/")
        if self.url:  # ahead of the Hub's: origins match by prefix
            mirror.fetches.origins = {self.url: PeerOrigin(self.url), **mirror.fetches.origins}
        self.listing = False
        """Whether `GET /repos` answers: not before the manifests are read (an empty list then
        would have every secondary delete its copies)."""
        self._failures: dict[str, tuple[int, float]] = {}
        """Copies that failed: how often, and when to try again (monotonic)."""
        self._task: asyncio.Task | None = None

    def route(self):
        """`GET /repos`: the repos this mirror holds ready, with every file's size and sha256
        (what a secondary copies, and checks its copies against); 503 until they are known."""
        peer = self

        @get("/repos", sync_to_thread=False)
        def list_repos() -> Response:
            if not peer.listing:
                return Response("the mirror is starting; ask again\n", status_code=503, media_type="text/plain")
            repos = peer.mirror.fetches.repos.values()
            ready = sorted((r for r in repos if r.state == "ready"), key=lambda r: (r.repo, r.commit))
            return Response(msgspec.json.encode(RepoList(repos=ready)), media_type="application/json")

        return list_repos

    def start(self) -> None:
        """Answer `GET /repos` (the manifests are read); on a secondary, start keeping in step."""
        self.listing = True
        if self.url:
            self._task = asyncio.create_task(self._loop(), name="mirror-peer")

    async def stop(self) -> None:
        """Stop polling (copies in flight are the fetches' and stop with them)."""
        self.listing = False
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception as exc:  # the primary away or answering nonsense: try again next round
                _log.warning(
                    "keeping in step with the primary mirror failed; tried again",
                    primary=self.url,
                    error=f"{type(exc).__name__}: {exc}",
                    in_s=self.mirror.config.sync_s,
                )
            await asyncio.sleep(self.mirror.config.sync_s)

    async def sync(self) -> None:
        """One round: what the primary holds ready, copied here; what it no longer holds, removed."""
        async with httpx.AsyncClient(timeout=30.0) as http:
            r = await http.get(f"{self.url}/repos")
        if r.status_code != 200:
            raise Internal(f"the primary mirror answered {r.status_code} for {self.url}/repos")
        theirs = {key_of(repo.repo, repo.commit): repo for repo in msgspec.json.decode(r.content, type=RepoList).repos}
        fetches = self.mirror.fetches
        for key, repo in fetches.repos.copy().items():
            if repo.origin == self.url and key not in theirs:
                await fetches.remove(key)
                self._failures.pop(key, None)
                _log.info("repo removed: the primary mirror no longer holds it", repo=key, primary=self.url)
        for key, repo in theirs.items():
            await self._copy(key, repo)

    async def _copy(self, key: str, theirs: MirroredRepo) -> None:
        held = self.mirror.fetches.repos.get(key)
        if held is not None and held.state != "failed":
            self._failures.pop(key, None)
            kept = {f.path for f in theirs.files}
            for gone in [f.path for f in held.files if f.path not in kept]:  # purged on the primary
                # deleted, then forgotten: a file the manifest no longer lists is never left on disk
                await asyncio.to_thread(delete_under, self.mirror.root, f"{key}/{gone}")
                await self.mirror.fetches.forget_file(f"{key}/{gone}")
            return
        if held is not None:  # failed: tried again after a wait that doubles each time
            count, after = self._failures.get(key, (0, 0.0))
            if time.monotonic() < after:
                return
            self._failures[key] = (
                count + 1,
                time.monotonic() + min(self.mirror.config.sync_s * 2**count, _BACKOFF_MAX_S),
            )
        problem = _unfit(theirs)
        if problem:
            _log.warning("repo on the primary mirror not copied", repo=key, primary=self.url, why=problem)
            return
        try:
            free = (await asyncio.to_thread(shutil.disk_usage, self.mirror.root)).free
            check_room(str(self.mirror.root), theirs.size, free, self.mirror.config.keep_free_bytes)
        except Refused as exc:
            _log.warning("repo on the primary mirror not copied", repo=key, primary=self.url, why=str(exc))
            return
        await self.mirror.fetches.queue(_copy_of(theirs, self.url))
        _log.info("repo queued: copied from the primary mirror", repo=key, primary=self.url, bytes=theirs.size)


def _unfit(repo: MirroredRepo) -> str:
    """Why a repo the primary listed cannot be copied (a name that climbs out, a file without a
    sha256 to verify its copy against), or empty."""
    parts = repo.repo.split("/")
    if len(parts) != 2 or safe_path(repo.repo):
        return f"its name '{repo.repo}' is not '<owner>/<name>'"
    for f in repo.files:
        why = safe_path(f.path)
        if why:
            return f"its file '{f.path}' cannot be served: {why}"
        if not _SHA256.match(f.sha256):
            return f"its file '{f.path}' has no sha256 to check a copy against"
    return ""


def _copy_of(theirs: MirroredRepo, primary: str) -> MirroredRepo:
    """A fetch of the primary's repo from the primary: every file pending, checked against the
    sha256 the primary verified."""
    return MirroredRepo(
        repo=theirs.repo,
        commit=theirs.commit,
        revision=theirs.revision,
        origin=primary,
        state="queued",
        files=[MirroredFile(path=f.path, size=f.size, sha256=f.sha256) for f in theirs.files],
        skipped=theirs.skipped,
        include=theirs.include,
        size=sum(f.size for f in theirs.files),
        added_by="primary",
    )
