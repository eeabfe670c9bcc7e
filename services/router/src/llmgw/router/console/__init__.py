"""The web console under /console: server-rendered pages (Jinja templates, a small script that is
not needed for any form) over the same services the admin API calls. Sign in with an admin key.

- `web`: the Console, one request's View, the session and CSRF hook
- `session`: signed session cookies, CSRF tokens and notes (pure)
- `i18n`: the messages in English and Turkish
- `*_pages`: the pages, each module's routes in its `ROUTES` (gathered here by name)
"""

from __future__ import annotations

import pkgutil
from importlib import import_module, resources

from litestar import Request, Router
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.response import Response
from litestar.static_files import create_static_files_router
from nats.aio.client import Client

from llmgw.bus import get_logger
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.console.web import PREFIX, Console, Refused, View, check_request
from llmgw.router.request.gateway import Gateway

__all__ = ["console_routes"]

_log = get_logger("router")


def console_routes(accounts: Accounts, nc: Client, gateway: Gateway, secret: bytes, session_s: int) -> Router:
    """The console's routes: its pages over `nc` and `accounts`, the playground's requests through
    `gateway`; sessions signed with `secret` (a random one where empty) that end after
    `session_s` seconds."""
    console = Console(accounts, nc, gateway, secret, session_s)

    async def before(request: Request) -> Response | None:
        return await check_request(console, request)

    def on_refused(request: Request, exc: Refused) -> Response:
        view: View = request.state.view
        return view.render("error.html", status=exc.status, message=exc.message)

    def on_bug(request: Request, exc: Exception) -> Response:
        _log.exception("console page failed", path=request.url.path)
        view: View | None = getattr(request.state, "view", None)
        if view is None or isinstance(exc, HTTPException):
            raise exc
        return view.render("error.html", status=500, message=view.t("error.bug", kind=type(exc).__name__))

    static = create_static_files_router(
        "/static", directories=[str(resources.files(__package__).joinpath("static"))], include_in_schema=False
    )
    return Router(
        PREFIX,
        route_handlers=[*_pages(), static],
        before_request=before,
        dependencies={"view": Provide(_view, sync_to_thread=False)},
        exception_handlers={Refused: on_refused, Exception: on_bug},
        include_in_schema=False,
    )


def _pages() -> list:
    """The routes of every `*_pages` module of the console."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.endswith("_pages"))
    return [route for name in names for route in import_module(f"{__name__}.{name}").ROUTES]


def _view(request: Request) -> View:
    return request.state.view
