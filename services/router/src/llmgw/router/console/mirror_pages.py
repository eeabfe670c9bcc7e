"""The mirror page: the repos held at each commit, their files with size and state (a fetch's
progress followed live), what was left out and why, the models serving each file; adding a repo
from the Hub, updating one to its branch's newest commit, removing one (or one commit).

Every action is the mirror's own endpoint (as `llmgw ctl mirror` and /api/v1/mirror call it): its
refusals (no such repo, gated, pickled weights, a model still using the files) are shown on the
page in its words, the form's values kept.
"""

from __future__ import annotations

import re

import msgspec
from litestar import get, post
from litestar.response import Response

from llmgw.proto import Empty, MirroredRepo, RepoAdd, RepoRef, catalog, mirror
from llmgw.router.console.web import PREFIX, Refused, View

__all__ = ["ROUTES", "source_of"]

_CHECKED = ("repo", "revision", "include")
"""The add form's fields, named as RepoAdd's: a refused check names the one that is not right."""


def source_of(repo: MirroredRepo, path: str) -> str:
    """The source a model names a file of `repo` by: OWNER/REPO@COMMIT/PATH (no commit for an import)."""
    return f"{repo.repo}@{repo.commit}/{path}" if repo.commit else f"{repo.repo}/{path}"


async def _users(view: View) -> dict[str, list[str]] | None:
    """The models serving each source, by source; None while the catalog does not answer."""
    try:
        listed = await view.ask(catalog.MODEL_LIST, Empty(), optional=True)
    except Refused:
        return None
    users: dict[str, list[str]] = {}
    for entry in listed.models:
        for source in entry.model.files():
            users.setdefault(source, []).append(entry.model.name)
    return users


async def _page(view: View, status: int = 200, error: str = "", failed: str = "", form: dict | None = None) -> Response:
    """The mirror page; `error` is why the action `failed` ('add', 'update', 'remove') was refused."""
    repos = (await view.ask(mirror.REPO_LIST, Empty())).repos
    values = {"repo": "", "revision": "main", "include": "", **(form or {})}
    return view.render(
        "mirror.html",
        status=status,
        repos=repos,
        users=await _users(view),
        source_of=source_of,
        error=error,
        failed=failed,
        form=values,
    )


@get("/mirror")
async def mirror_page(view: View) -> Response:
    """Every repo held or being fetched, at each commit, with its files."""
    return await _page(view)


def _add_message(view: View) -> RepoAdd:
    """The add form as the mirror's RepoAdd, checked as the mirror checks it; Refused (400) naming
    the field that is not right and what to write."""
    form = view.form
    include = [g for g in re.split(r"[\s,]+", form.get("include", "")) if g]
    fields = {
        "repo": form.get("repo", "").strip(),
        "revision": form.get("revision", "").strip() or "main",
        "include": include,
        "by": view.by,
    }
    try:
        return msgspec.convert(fields, RepoAdd)
    except msgspec.ValidationError as exc:
        field = next((f for f in _CHECKED if f"$.{f}" in str(exc)), "repo")
        raise Refused(400, view.t(f"mirror.err.{field}", value=form.get(field, ""))) from None


@post("/mirror")
async def add_repo(view: View) -> Response:
    """Fetch a repo from the Hub at the commit its revision names now: the page follows it."""
    try:
        queued = await view.ask(mirror.REPO_ADD, _add_message(view))
    except Refused as exc:
        return await _page(view, exc.status, exc.message, "add", view.form)
    return view.done(f"{PREFIX}/mirror", _queued_words(view, queued))


def _queued_words(view: View, repo: MirroredRepo) -> str:
    """What an add or update started: the commit, its files and size, what the page shows next."""
    words = dict(repo=repo.repo, commit=repo.commit[:12], files=len(repo.files), size=view.bytes(repo.size))
    return view.t("mirror.done.ready" if repo.state == "ready" else "mirror.done.queued", **words)


def _ref(view: View) -> RepoRef:
    """The repo (and commit) a row's button names, checked as the mirror checks it."""
    repo, commit = view.form.get("repo", ""), view.form.get("commit", "")
    try:
        return msgspec.convert({"repo": repo, "commit": commit, "by": view.by}, RepoRef)
    except msgspec.ValidationError:
        raise Refused(400, view.t("mirror.err.ref", repo=repo, commit=commit)) from None


@post("/mirror/update")
async def update_repo(view: View) -> Response:
    """Fetch the commit the repo's branch names now beside the one held."""
    try:
        fetched = await view.ask(mirror.REPO_UPDATE, _ref(view))
    except Refused as exc:
        return await _page(view, exc.status, exc.message, "update")
    return view.done(f"{PREFIX}/mirror", _queued_words(view, fetched))


@post("/mirror/remove")
async def remove_repo(view: View) -> Response:
    """Delete a repo's files (every commit, or the one named) unless a model uses them."""
    try:
        removed = await view.ask(mirror.REPO_REMOVE, _ref(view))
    except Refused as exc:
        return await _page(view, exc.status, exc.message, "remove")
    said = "; ".join(
        view.t("mirror.removed_one", repo=r.repo, commit=r.commit[:12] or "—", files=len(r.files), size=size)
        for r, size in ((r, view.bytes(r.size)) for r in removed.repos)
    )
    return view.done(f"{PREFIX}/mirror", view.t("mirror.done.removed", what=said))


ROUTES = (mirror_page, add_repo, update_repo, remove_repo)
