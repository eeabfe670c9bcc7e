"""The mirror's fetches: each repo at a commit, its files fetched a bounded number at a time into
a staging folder, each verified against the hash published for it, and only then put where it is
served. A manifest per repo on the mirror's disk says how far each got, so a restarted mirror
takes up where it stopped (the origin resumes a partial file, it does not start it again).

Layout under the mirror's root:
  `<owner>/<name>@<commit>/<path>`   verified files, served (imports: `<owner>/<name>/<path>`)
  `.repos/<owner>/<name>@<commit>.json`  the manifest (a MirroredRepo)
  `.incoming/<owner>/<name>@<commit>/`   files being fetched; never served
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import msgspec

from llmgw.bus import get_logger
from llmgw.gguf import GGUFError, read_header
from llmgw.mirror.checks import pickle_inside, safetensors_error, safetensors_header_size
from llmgw.mirror.digests import hashes, remember_digest
from llmgw.mirror.hub import Stopped
from llmgw.mirror.plan import Rate
from llmgw.proto import MirroredFile, MirroredRepo

__all__ = ["Fetches", "Origin", "VerifyError", "key_of"]

_log = get_logger("mirror")


class VerifyError(Exception):
    """A fetched file that is not what was published; it has been removed."""


class Origin(Protocol):
    """Where a repo's bytes come from (the Hub, a primary mirror, the mirror's own disk)."""

    def download(
        self,
        repo: MirroredRepo,
        file: MirroredFile,
        staging: Path,
        progress: Callable[[int], None],
        stop: threading.Event,
    ) -> Path:
        """Fetch `file` into `staging` (resuming what is there), telling `progress` its bytes so
        far; raise Stopped once `stop` is set. Blocks (run in a thread)."""
        ...


def key_of(repo: str, commit: str) -> str:
    """A repo at a commit as the mirror names it, and the folder its files are served from."""
    return f"{repo}@{commit}" if commit else repo


class Fetches:
    """Every repo the mirror holds or is fetching, by key ('<owner>/<name>@<commit>')."""

    def __init__(
        self,
        root: Path,
        publish: Callable[[MirroredRepo], Awaitable[None]],
        parallel_files: int = 4,
        tick_s: float = 0.5,
    ) -> None:
        self.root = root
        self.repos: dict[str, MirroredRepo] = {}
        self.origins: dict[str, Origin] = {}
        """Origins by the head of `MirroredRepo.origin` they serve ('file:', a URL)."""
        self._publish, self._tick_s = publish, tick_s
        self._slots = asyncio.Semaphore(parallel_files)
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._stops: dict[str, threading.Event] = {}
        """Each fetch in flight's stop: set by remove (that repo) and by stop (every one)."""
        self._running: dict[str, asyncio.Task] = {}
        self._stopping = False
        self.fetched: dict[str, int] = {}
        """Repo fetches ended since this mirror started, by how: ready, failed."""
        self.fetched_bytes = 0
        """Bytes of files fetched and verified since this mirror started."""
        self._worker: asyncio.Task | None = None

    def load(self) -> None:
        """Read the manifests; a fetch a stop cut short is queued again (it resumes)."""
        for path in sorted((self.root / ".repos").rglob("*.json")):
            try:
                repo = msgspec.json.decode(path.read_bytes(), type=MirroredRepo)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                _log.warning("manifest unreadable; its repo is not listed", path=str(path), error=str(exc))
                continue
            key = key_of(repo.repo, repo.commit)
            self.repos[key] = repo
            if repo.state not in ("ready", "failed"):
                for f in repo.files:
                    f.state = "pending" if f.state != "ready" else "ready"
                repo.state = "queued"
                self._queue.put_nowait(key)

    def start(self) -> None:
        """Start fetching what is queued."""
        self._worker = asyncio.create_task(self._work(), name="mirror-fetches")

    async def stop(self) -> None:
        """Stop every download where it is (partial files are kept to resume)."""
        self._stopping = True
        for stop in self._stops.values():
            stop.set()
        for task in (*self._running.values(), self._worker):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._stopping = False

    def pending_bytes(self) -> int:
        """Bytes the fetches not done yet still have to write."""
        return sum(max(r.size - r.done, 0) for r in self.repos.values() if r.state not in ("ready", "failed"))

    async def queue(self, repo: MirroredRepo) -> MirroredRepo:
        """Record a fetch and queue it. One held at that commit gains the files it lacks (another
        `--include`) and is fetched again if it has any; a failed one is tried again, keeping
        the files it had verified."""
        key = key_of(repo.repo, repo.commit)
        held = self.repos.get(key)
        if held and held.state != "failed":
            known = {f.path for f in held.files}
            more = [f for f in repo.files if f.path not in known]
            if not more:
                return held
            held.files = sorted([*held.files, *more], key=lambda f: f.path)
            held.include = sorted({*held.include, *repo.include})
            held.size += sum(f.size for f in more)
            if held.state != "ready":  # queued or in flight: the fetch takes them up when it ends
                await self._changed(held)
                return held
            repo = held
        elif held:
            kept = {f.path: f for f in held.files if f.state == "ready" and (self.root / key / f.path).is_file()}
            repo.files = [kept.get(f.path, f) for f in repo.files]
        repo.state, repo.updated_at, repo.error = "queued", time.time(), ""
        repo.added_at = repo.added_at or time.time()
        self.repos[key] = repo
        await self._changed(repo)
        self._queue.put_nowait(key)
        return repo

    def file(self, source: str) -> MirroredFile | None:
        """The verified file a source names, if the mirror fetched or imported it."""
        for key, repo in self.repos.items():
            if source.startswith(key + "/"):
                path = source[len(key) + 1 :]
                return next((f for f in repo.files if f.path == path and f.state == "ready"), None)
        return None

    async def forget_file(self, source: str) -> None:
        """A served file was deleted (a purged model's): its repo no longer lists it, and a repo
        left with no file is forgotten."""
        for key, repo in list(self.repos.items()):
            if source.startswith(key + "/"):
                repo.files = [f for f in repo.files if f.path != source[len(key) + 1 :]]
                repo.size = sum(f.size for f in repo.files)
                if repo.files:
                    await self._changed(repo)
                else:
                    await self.remove(key)

    async def remove(self, key: str) -> MirroredRepo:
        """Forget a repo and delete its files (a fetch of it in flight is stopped first)."""
        repo = self.repos.pop(key)
        if key in self._stops:
            self._stops[key].set()
        if key in self._running:  # its downloads end at their next piece; nothing is written after
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(self._running[key])
        await asyncio.to_thread(self._delete, key)
        return repo

    def _delete(self, key: str) -> None:
        for folder in (self.root / key, self.root / ".incoming" / key):
            shutil.rmtree(folder, ignore_errors=True)
        (self.root / ".repos" / f"{key}.json").unlink(missing_ok=True)

    async def _work(self) -> None:
        """Fetch the queued repos one after another (a key whose repo was removed, or is no
        longer queued, is passed over)."""
        while True:
            key = await self._queue.get()
            repo = self.repos.get(key)
            if repo is None or repo.state != "queued":
                continue
            self._stops[key] = threading.Event()
            self._running[key] = asyncio.create_task(self._fetch(key, repo))
            try:
                await asyncio.shield(self._running[key])
            except Stopped:
                if self._stopping:
                    return
            except Exception as exc:  # one repo's failure is its own; the next one is fetched
                _log.exception("fetch failed", repo=key)
                await self._set(repo, state="failed", error=f"{type(exc).__name__}: {exc}")
            finally:
                self._running.pop(key, None)
                self._stops.pop(key, None)

    async def _fetch(self, key: str, repo: MirroredRepo) -> None:
        origin = next((o for head, o in self.origins.items() if _from(repo.origin, head)), None)
        if origin is None:
            await self._set(
                repo, state="failed", error=f"no origin for {repo.origin} (is the mirror configured for it?)"
            )
            return
        await self._set(repo, state="fetching", error="")
        ticker = asyncio.create_task(self._tick(repo))
        try:
            todo = [f for f in repo.files if f.state != "ready"]
            results = await asyncio.gather(*(self._one(key, repo, f, origin) for f in todo), return_exceptions=True)
        finally:
            ticker.cancel()
        if any(isinstance(r, Stopped) for r in results) or self.repos.get(key) is not repo:
            raise Stopped()
        errors = [r for r in results if isinstance(r, BaseException)]
        ended = "failed" if errors else "ready"
        self.fetched[ended] = self.fetched.get(ended, 0) + 1
        if errors:
            await self._set(repo, state="failed", error="; ".join(str(e) for e in errors[:3]))
        elif any(f.state != "ready" for f in repo.files):  # files added while it ran
            await self._set(repo, state="queued")
            self._queue.put_nowait(key)
        else:
            await self._set(repo, state="ready", done=repo.size, rate=0.0, eta_s=0.0)
            _log.info("repo ready", repo=key, files=len(repo.files), bytes=repo.size)

    async def _one(self, key: str, repo: MirroredRepo, f: MirroredFile, origin: Origin) -> None:
        """Fetch one file, verify it, put it where it is served."""
        async with self._slots:
            stop = self._stops[key]
            if stop.is_set():
                raise Stopped()
            staging = self.root / ".incoming" / key
            staging.mkdir(parents=True, exist_ok=True)
            f.state, f.error = "fetching", ""

            def progress(n: int) -> None:
                f.done = n

            try:
                got = staging / f.path  # whole already: a stop came while it was being verified
                if not (got.is_file() and got.stat().st_size == f.size):
                    got = await asyncio.to_thread(origin.download, repo, f, staging, progress, stop)
                if stop.is_set():
                    raise Stopped()
                f.state = "verifying"
                await self._changed(repo)
                await asyncio.to_thread(self._verify_and_place, key, repo, f, got)
            except Exception as exc:
                if not isinstance(exc, Stopped):
                    f.state, f.error = "failed", str(exc)
                raise
            f.state, f.done = "ready", f.size
            self.fetched_bytes += f.size
            await self._changed(repo)

    def _verify_and_place(self, key: str, repo: MirroredRepo, f: MirroredFile, got: Path) -> None:
        """Check `got` against what was published for `f`, then move it where it is served; a file
        that fails is removed (a later try fetches it again) and VerifyError says why."""
        staging = (self.root / ".incoming" / key).resolve()
        where = f"{key}/{f.path}"
        if got.is_symlink() or staging not in got.resolve().parents:
            got.unlink(missing_ok=True)
            raise VerifyError(f"{where}: the origin gave a link or a path outside the repo; refused")
        size = got.stat().st_size
        problem = f"is {size} bytes, not the {f.size} published" if size != f.size else ""
        if not problem:
            sha256, blob = hashes(got, blob=not f.sha256)
            if f.sha256 and sha256 != f.sha256:
                problem = f"has sha256 {sha256}, not the {f.sha256} published for it"
            elif not f.sha256 and f.blob_id and blob != f.blob_id:
                problem = f"has git blob sha1 {blob}, not the {f.blob_id} published for it"
            elif not f.sha256 and not f.blob_id:
                problem = "has no published hash to check it against"
            problem = problem or _content_problem(got, size)
        if problem:
            got.unlink(missing_ok=True)  # a later try fetches it from the start
            raise VerifyError(f"{where} {problem}; the file was removed")
        final = self.root / key / f.path
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(got, final)
        f.sha256 = sha256
        remember_digest(final, sha256)

    async def _tick(self, repo: MirroredRepo) -> None:
        """Say how far the fetch is, with its rate and time left, every tick."""
        rate = Rate()
        while True:
            await asyncio.sleep(self._tick_s)
            done = sum(f.done for f in repo.files)
            rate.add(time.monotonic(), done)
            repo.done, repo.rate = done, rate.per_s()
            repo.eta_s = rate.eta_s(max(repo.size - done, 0))
            await self._publish(repo)

    async def _set(self, repo: MirroredRepo, **changes) -> None:
        for name, value in changes.items():
            setattr(repo, name, value)
        await self._changed(repo)

    async def _changed(self, repo: MirroredRepo) -> None:
        """Keep the manifest (written whole, then renamed) and say what changed; nothing for a
        repo removed meanwhile."""
        if self.repos.get(key_of(repo.repo, repo.commit)) is not repo:
            return
        repo.updated_at = time.time()
        busy = {f.state for f in repo.files}
        if repo.state in ("fetching", "verifying"):  # the last downloads done, their hashes being checked
            repo.state = "verifying" if "verifying" in busy and not busy & {"pending", "fetching"} else "fetching"
        repo.done = sum(f.done if f.state != "ready" else f.size for f in repo.files)
        path = self.root / ".repos" / f"{key_of(repo.repo, repo.commit)}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        tmp.write_bytes(msgspec.json.encode(repo))
        tmp.replace(path)
        await self._publish(repo)


def _from(origin: str, head: str) -> bool:
    """Whether `origin` is `head` or lies under it ('file:' takes any path; a URL only itself)."""
    return origin == head or origin.startswith(head if head.endswith(("/", ":")) else head + "/")


def _content_problem(path: Path, size: int) -> str:
    """What is wrong with a file's content for what its name says it is, or empty."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
        pickled = pickle_inside(head)
        if pickled:
            return f"is {pickled}: loading one runs code, so the mirror never serves it"
        if path.name.endswith(".safetensors"):
            length = safetensors_header_size(head[:8])
            fh.seek(8)
            header = fh.read(length) if 0 < length < size else b""
            error = safetensors_error(head[:8], header, size)
            if error:
                return error
    if path.name.endswith(".gguf"):
        try:
            read_header(path)
        except GGUFError as exc:
            return f"is not a GGUF file llmgw reads ({str(exc).replace(str(path), path.name)})"
    return ""
