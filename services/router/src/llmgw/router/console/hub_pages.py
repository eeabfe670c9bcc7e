"""The Hugging Face page: models on the Hub (or the mirror's `HF_ENDPOINT`) with their GGUF files,
each file's header read by range requests and nothing downloaded, and for each file the way it
would run best on the fleet now (~tok/s, slow and very slow marked) and how many ways there are;
then "fetch" (the mirror fetches it, pinned and verified) or "fetch and serve" (the fetch, then
the serve form for it, which shows every way once the mirror verified the file).

The search is the catalog's `catalog.hub.search` (as `llmgw ctl mirror search` and
/api/v1/hub/search ask it); a fetch is the mirror's `mirror.repo.add`.
"""

from __future__ import annotations

from urllib.parse import urlencode

import msgspec
from litestar import Request, get, post
from litestar.response import Response

from llmgw.proto import RepoAdd, catalog, mirror
from llmgw.proto.hub import HubSearch, HubWays, fetch_glob
from llmgw.router.console.web import PREFIX, Refused, View

__all__ = ["ROUTES"]


def _ask(view: View, request: Request) -> HubSearch | None:
    """The search in the query string, checked as the catalog checks it; None with no words."""
    text = request.query_params.get("text", "").strip()
    view.form = {"text": text}
    if not text:
        return None
    try:
        return msgspec.convert({"text": text}, HubSearch)
    except msgspec.ValidationError:
        raise Refused(400, view.t("hub.err.text")) from None


@get("/hub")
async def hub_page(view: View, request: Request) -> Response:
    """The search form and, for `?text=`, what the Hub has and how each file would run here."""
    ask = _ask(view, request)
    ways: HubWays | None = None
    error, status = "", 200
    if ask is not None:
        try:
            ways = await view.ask(catalog.HUB_SEARCH, ask)
        except Refused as exc:
            error, status = exc.message, exc.status
    return view.render("hub.html", status=status, ways=ways, error=error, text=view.form["text"])


@post("/hub/fetch")
async def hub_fetch(view: View) -> Response:
    """Fetch one file the search listed (pinned to the commit it was read at); with `serve`, on to
    the serve form for it."""
    repo, commit, path = (view.form.get(f, "").strip() for f in ("repo", "commit", "path"))
    try:
        ask = msgspec.convert({"repo": repo, "revision": commit, "include": [fetch_glob(path)], "by": view.by}, RepoAdd)
    except msgspec.ValidationError:
        raise Refused(400, view.t("hub.err.file", repo=repo, path=path)) from None
    queued = await view.ask(mirror.REPO_ADD, ask)
    said = view.t("hub.done.fetching", repo=repo, path=path, size=view.bytes(queued.size))
    if view.form.get("serve"):
        source = f"{queued.repo}@{queued.commit}/{path}"
        return view.done(f"{PREFIX}/serve?{urlencode({'source': source})}", f"{said} {view.t('hub.done.serve_next')}")
    return view.done(f"{PREFIX}/mirror", said)


ROUTES = (hub_page, hub_fetch)
