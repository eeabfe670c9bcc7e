"""The mirror's repo endpoints: add (resolve, choose, check the room, queue), list, show, remove
(never one a model uses) and update (a branch's newer commit beside the old one)."""

from __future__ import annotations

import asyncio
import shutil

from llmgw.bus import BusError, call, record_change
from llmgw.mirror.config import MirrorParts
from llmgw.mirror.fetches import key_of
from llmgw.mirror.plan import Refused, check_room, choose
from llmgw.proto import Empty, MirroredRepo, Page, RepoAdd, RepoList, RepoRef, page_of
from llmgw.proto import catalog as catalog_api
from llmgw.proto import mirror as mirror_api
from llmgw.proto.errors import BadRequest, Conflict, Internal, NotFound
from llmgw.proto.people import AuditEntry

__all__ = ["RepoDesk"]


def _summary(repo: MirroredRepo | None) -> dict | None:
    """What the audit trail keeps of a repo: where it came from and which files, not their progress."""
    if repo is None:
        return None
    return {
        "repo": repo.repo,
        "commit": repo.commit,
        "revision": repo.revision,
        "origin": repo.origin,
        "files": [f.path for f in repo.files],
        "size": repo.size,
    }


def _listed(repo: MirroredRepo) -> tuple[str, float, str]:
    """How repos are listed: by name, newest commit first."""
    return repo.repo, -repo.added_at, repo.commit


class RepoDesk:
    """Answers the operator's requests about repos for one mirror."""

    def __init__(self, mirror: MirrorParts) -> None:
        self.mirror = mirror

    def handlers(self) -> dict:
        """Each repo endpoint and what answers it."""
        return {
            mirror_api.REPO_ADD: self.add,
            mirror_api.REPO_LIST: self.list,
            mirror_api.REPO_SHOW: self.show,
            mirror_api.REPO_REMOVE: self.remove,
            mirror_api.REPO_UPDATE: self.update,
        }

    async def add(self, req: RepoAdd) -> MirroredRepo:
        """Resolve the revision to its commit, choose the files, check the disk, queue the fetch."""
        hub, fetches = self.mirror.hub, self.mirror.fetches
        commit, published = await asyncio.to_thread(hub.resolve, req.repo, req.revision)
        held = fetches.repos.get(key_of(req.repo, commit))
        try:
            chosen, skipped = choose(req.repo, commit, published, req.include)
            have = {f.path for f in held.files if f.state == "ready"} if held else set()
            if held and held.state != "failed" and {f.path for f in chosen} <= {f.path for f in held.files}:
                return held
            root = self.mirror.root
            root.mkdir(parents=True, exist_ok=True)
            free = (await asyncio.to_thread(shutil.disk_usage, root)).free
            needed = sum(f.size for f in chosen if f.path not in have) + fetches.pending_bytes()
            check_room(str(root), needed, free, self.mirror.config.keep_free_bytes)
        except Refused as exc:
            raise BadRequest(str(exc)) from None
        await asyncio.to_thread(hub.check_access, req.repo, commit, chosen[0].path)
        repo = MirroredRepo(
            repo=req.repo,
            commit=commit,
            revision=req.revision,
            origin=hub.endpoint,
            state="queued",
            files=[f.entry() for f in chosen],
            skipped=skipped,
            include=list(req.include),
            size=sum(f.size for f in chosen),
            added_by=req.by,
        )
        self.mirror.ctx.log.info(
            "repo queued",
            repo=req.repo,
            revision=req.revision,
            commit=commit,
            files=len(chosen),
            by=req.by or "unknown",
        )
        queued = await fetches.queue(repo)
        change = AuditEntry(time=0, who=req.by, area="mirror", action="add", subject=key_of(req.repo, commit))
        await record_change(self.mirror.ctx.nc, change, held, _summary(queued))
        return queued

    async def list(self, ask: Page) -> RepoList:
        """Every repo held or being fetched, at each commit, newest first within a repo (a page)."""
        repos = sorted(self.mirror.fetches.repos.values(), key=_listed)
        page, after = page_of(repos, ask, _listed, "the repo list")
        return RepoList(repos=page, next=after)

    def _matching(self, ref: RepoRef) -> list[MirroredRepo]:
        found = [
            r
            for r in self.mirror.fetches.repos.values()
            if r.repo == ref.repo and (not ref.commit or r.commit == ref.commit)
        ]
        if not found:
            at = f" at {ref.commit}" if ref.commit else ""
            raise NotFound(f"the mirror holds no {ref.repo}{at}{self.held_hint(ref.repo)}")
        return sorted(found, key=lambda r: -r.added_at)

    async def show(self, ref: RepoRef) -> RepoList:
        """One repo at one commit, or at every commit held."""
        return RepoList(repos=self._matching(ref))

    async def remove(self, ref: RepoRef) -> RepoList:
        """Delete a repo's files (one commit, or every one) unless a model in the catalog uses them."""
        repos = self._matching(ref)
        try:
            models = await call(
                self.mirror.ctx.nc, catalog_api.MODEL_LIST, Empty(), timeout=self.mirror.config.catalog_check_s
            )
        except BusError as exc:
            raise Internal(f"the catalog did not say which models use {ref.repo} ({exc.message}); try again") from None
        heads = {key_of(r.repo, r.commit) + "/": r for r in repos}
        users = sorted(
            f"{e.model.name} ({source})"
            for e in models.models
            for source in e.model.files()
            if any(source.startswith(head) for head in heads)
        )
        if users:
            raise Conflict(
                f"{ref.repo} is used by {', '.join(users)}: point those models elsewhere or remove them first"
            )
        for r in repos:
            await self.mirror.fetches.remove(key_of(r.repo, r.commit))
            self.mirror.ctx.log.info("repo removed", repo=r.repo, commit=r.commit)
            change = AuditEntry(time=0, who=ref.by, area="mirror", action="remove", subject=key_of(r.repo, r.commit))
            await record_change(self.mirror.ctx.nc, change, _summary(r), None)
        return RepoList(repos=repos)

    async def update(self, ref: RepoRef) -> MirroredRepo:
        """Fetch the commit the repo's branch names now beside the one held (the catalog keeps
        pointing at the old one until an operator moves it); the newest held when unchanged."""
        newest = self._matching(RepoRef(repo=ref.repo))[0]
        if newest.origin != self.mirror.hub.endpoint:
            raise BadRequest(
                f"{ref.repo} did not come from {self.mirror.hub.endpoint}; it is updated where it came from"
            )
        if len(newest.revision) == 40 and newest.revision == newest.commit:
            raise BadRequest(f"{ref.repo} was added at a commit, which never moves; add a branch to follow it")
        return await self.add(
            RepoAdd(repo=ref.repo, revision=newest.revision, include=newest.include, by=ref.by or "update")
        )

    def held_hint(self, what: str) -> str:
        """'; it holds …' listing what the mirror holds of the repo named in `what` (or of all)."""
        repo = "/".join(what.split("/")[:2]).split("@")[0]
        keys = sorted(key_of(r.repo, r.commit) for r in self.mirror.fetches.repos.values() if r.state == "ready")
        mine = [k for k in keys if k.split("@")[0] == repo] or keys
        if not mine:
            return "; it holds no fetched repo yet (`llmgw ctl mirror add OWNER/REPO`)"
        files = [f"{k}/{f.path}" for k in mine[:5] for f in self.mirror.fetches.repos[k].files]
        return "; it holds " + ", ".join(files[:10]) + (" ..." if len(files) > 10 else "")
