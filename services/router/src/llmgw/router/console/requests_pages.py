"""The request log page: the latest requests, newest first, as `router.request.log` answers them
(`ctl requests` and `/api/v1/requests` ask the same): when, key, model, replica, status, tokens,
time to the first token, duration; filtered by model, key and errors with a GET form, paged back
with "older". Prompts and answers are never kept."""

from __future__ import annotations

import msgspec
from litestar import get
from litestar.response import Response

from llmgw.proto import Empty, RequestLogAsk, router
from llmgw.router.console.web import View

__all__ = ["ROUTES"]


@get("/requests")
async def requests_page(view: View, model: str = "", key: str = "", errors: str = "", before: int = 0) -> Response:
    """A page of the request log as the form asks; a filter it cannot take says which and why."""
    form = {"model": model, "key": key, "errors": errors == "1", "before": before}
    try:
        ask = msgspec.convert(form | {"limit": 100}, RequestLogAsk)
    except msgspec.ValidationError:
        message = view.t("requests.err.filter", named=key, before=before)
        return view.render("requests.html", status=400, active="requests", form=form, log=None, names={}, error=message)
    who = view.principal
    assert who is not None
    keys = (await view.console.accounts.list_keys(Empty())).keys
    seen = who.seen_keys(keys)
    log = await view.ask(router.REQUEST_LOG, who.seen_log(ask, keys))
    names = {kid: k.name for kid, k in seen.items()} | {who.key_id: who.name}
    return view.render("requests.html", active="requests", form=form, log=log, names=names, error="")


ROUTES = (requests_page,)
