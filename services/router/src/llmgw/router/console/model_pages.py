"""The models page: every model in the catalog with how it is doing (the scheduler's status)."""

from __future__ import annotations

from litestar import get
from litestar.response import Response

from llmgw.proto import Empty, catalog, scheduler
from llmgw.router.console.web import Refused, View

__all__ = ["ROUTES"]


async def statuses(view: View) -> dict[str, object] | None:
    """Each model's status by name, or None while the scheduler does not answer (the page says so)."""
    try:
        listed = await view.ask(scheduler.MODEL_STATUS, Empty(), timeout=3.0)
    except Refused:
        return None
    return {s.model: s for s in listed.models}


@get("/models")
async def models_page(view: View) -> Response:
    """Every model: its source, its state, replicas ready of wanted."""
    entries = (await view.ask(catalog.MODEL_LIST, Empty())).models
    return view.render("models.html", entries=entries, status=await statuses(view))


ROUTES = (models_page,)
