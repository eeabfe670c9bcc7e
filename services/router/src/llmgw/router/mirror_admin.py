"""The admin API's mirror routes under /api/v1/mirror: repos fetched from Hugging Face onto the
mirror, listed, shown, removed and updated (admin keys only, as every /api/v1 route).

Each route is a thin translation to the mirror's endpoint; its errors keep their meaning (400,
404, 409) and come back in the OpenAI error body.
"""

from __future__ import annotations

import msgspec
from litestar import Request, delete, get, post
from nats.aio.client import Client

from llmgw.bus import BusError, call, get_logger
from llmgw.proto import Empty, Endpoint, MirroredRepo, RepoAdd, RepoList, RepoRef, mirror
from llmgw.router.errors import ApiError, InvalidRequest

__all__ = [
    "MIRROR_ROUTES",
    "BadRepo",
    "MirrorConflict",
    "MirrorFailed",
    "MirrorInvalid",
    "MirrorNotFound",
    "add_repo",
    "list_repos",
    "remove_repo",
    "show_repo",
    "update_repo",
]

_log = get_logger("router")

_RESOLVE_S = 60.0
"""An add (or update) resolves the revision on the Hub and lists its files before it answers."""


class BadRepo(InvalidRequest):
    """The path names no repo (OWNER/NAME), or the commit is not 40 hex digits."""

    code = "bad_repo"


class MirrorInvalid(ApiError):
    """The mirror refused the request as malformed or impossible."""

    status, type, code = 400, "invalid_request_error", "mirror_400"


class MirrorNotFound(ApiError):
    """The mirror (or the Hub behind it) has no such repo, revision or commit."""

    status, type, code = 404, "not_found_error", "mirror_404"


class MirrorConflict(ApiError):
    """A model in the catalog uses the repo."""

    status, type, code = 409, "conflict_error", "mirror_409"


class MirrorFailed(ApiError):
    """The mirror failed, or did not answer."""

    code = "mirror_500"


_ERRORS = {"400": MirrorInvalid, "404": MirrorNotFound, "409": MirrorConflict}


async def _ask(nc: Client, request: Request, endpoint: Endpoint, message: msgspec.Struct, timeout: float = 10.0):
    """The mirror's reply, or its error as the admin API answers it."""
    _log.info("admin call", subject=endpoint.subject(), key=request.state.key.name)
    try:
        return await call(nc, endpoint, message, timeout=timeout)
    except BusError as exc:
        raise _ERRORS.get(exc.code, MirrorFailed)(exc.message) from None


def _ref(owner: str, name: str, commit: str = "") -> RepoRef:
    try:
        return msgspec.convert({"repo": f"{owner}/{name}", "commit": commit}, RepoRef)
    except msgspec.ValidationError as exc:
        raise BadRepo(f"'{owner}/{name}' (commit '{commit}') names no mirrored repo: {exc}") from None


@post("/mirror", status_code=202)
async def add_repo(request: Request, nc: Client, data: RepoAdd) -> MirroredRepo:
    """Fetch a repo from Hugging Face at the commit its revision names now (queued: the answer's
    `state` says how far it is; GET /api/v1/mirror/{owner}/{name} follows it). Who asks is the
    key's name."""
    add = msgspec.structs.replace(data, by=request.state.key.name)
    return await _ask(nc, request, mirror.REPO_ADD, add, timeout=_RESOLVE_S)


@get("/mirror")
async def list_repos(request: Request, nc: Client) -> RepoList:
    """Every repo on the mirror, fetched or being fetched, at each commit."""
    return await _ask(nc, request, mirror.REPO_LIST, Empty())


@get("/mirror/{owner:str}/{name:str}")
async def show_repo(request: Request, nc: Client, owner: str, name: str) -> RepoList:
    """A repo at every commit the mirror holds: each file's size, hash and state, what was left out."""
    return await _ask(nc, request, mirror.REPO_SHOW, _ref(owner, name))


@delete("/mirror/{owner:str}/{name:str}", status_code=200)
async def remove_repo(request: Request, nc: Client, owner: str, name: str, commit: str = "") -> RepoList:
    """Delete a repo's files from the mirror (`?commit=`: that commit alone); 409 while a model uses
    them. The answer lists what was removed."""
    return await _ask(nc, request, mirror.REPO_REMOVE, _ref(owner, name, commit))


@post("/mirror/{owner:str}/{name:str}/update", status_code=202)
async def update_repo(request: Request, nc: Client, owner: str, name: str) -> MirroredRepo:
    """Fetch the commit the repo's branch names now beside the one held (the newest held, when the
    branch has not moved)."""
    return await _ask(nc, request, mirror.REPO_UPDATE, _ref(owner, name), timeout=_RESOLVE_S)


MIRROR_ROUTES = (add_repo, list_repos, show_repo, remove_repo, update_repo)
"""The mirror's routes, for the admin Router."""
