"""Signing in to the console with the OpenID Connect provider an admin set up: the browser sent
to the provider with a fresh state, nonce and PKCE challenge (kept in a signed cookie bound to
this browser for ten minutes), and back with a code traded for an ID token that is checked
(`accounts/oidc.py`) before the user's session starts. A state not this browser's, a code used
twice, a token for another client or past its time: refused, saying so, nobody signed in."""

from __future__ import annotations

import json
import time

from litestar import get
from litestar.params import Parameter
from litestar.response import Redirect, Response

from llmgw.bus import get_logger
from llmgw.router.accounts.oidc import Begun, OidcError, begin, check_id_token
from llmgw.router.accounts.people import SignInRefused
from llmgw.router.console.auth_pages import start_session
from llmgw.router.console.session import same
from llmgw.router.console.web import PREFIX, View

__all__ = ["ROUTES"]

_log = get_logger("router")
_COOKIE = "llmgw_oidc"
_PATH = f"{PREFIX}/signin/provider"
_PENDING_S = 600
"""How long a sign-in sent to the provider may take to come back."""


def _back(view: View) -> str:
    """Where the provider sends the browser back: this router's address as the browser reached it
    (register it with the provider as the client's redirect URI)."""
    scheme = "https" if view.secure else view.request.url.scheme
    return f"{scheme}://{view.request.url.netloc}{_PATH}/back"


def _refused(view: View, status: int, key: str, **values: str) -> Response:
    response = view.signin_page(status, view.t(key, **values))
    response.delete_cookie(_COOKIE, path=_PATH)
    return response


@get("/signin/provider")
async def to_provider(view: View, next: str = "") -> Response:
    """Send the browser to the provider to sign in, to come back to `next`."""
    people = view.console.accounts.people
    settings = people.signin.oidc if people is not None and people.signin is not None else None
    if settings is None:
        return view.signin_page(404, view.t("signin.err.no_provider"))
    try:
        provider = await people.signin.provider()
    except OidcError as exc:
        _log.warning("the sign-in provider did not answer", error=str(exc))
        return view.signin_page(503, view.t("signin.err.provider_down"))
    begun = begin(settings, provider, _back(view))
    pending = json.dumps([begun.state, begun.nonce, begun.verifier, next, int(time.time()) + _PENDING_S])
    response = Redirect(begun.url, status_code=303)
    response.set_cookie(
        _COOKIE,
        view.console.sessions.note("oidc", pending, purpose="oidc"),
        path=_PATH,
        httponly=True,
        samesite="lax",  # the provider's redirect back is a cross-site navigation: Strict would not come
        secure=view.secure,
        max_age=_PENDING_S,
    )
    return response


@get("/signin/provider/back")
async def from_provider(
    view: View, code: str = "", error: str = "", given: str = Parameter(query="state", default="")
) -> Response:
    """The provider's answer: the code traded and the ID token checked, then the session; each
    thing that does not hold refused, the pending sign-in ended either way."""
    people = view.console.accounts.people
    settings = people.signin.oidc if people is not None and people.signin is not None else None
    kept = view.console.sessions.read_note(view.request.cookies.get(_COOKIE, ""), purpose="oidc")
    if settings is None or kept is None:
        return _refused(view, 400, "signin.err.provider_lost")
    state_kept, nonce, verifier, back, until = json.loads(kept[1])
    if error:
        return _refused(view, 401, "signin.err.provider_said", error=error[:80])
    if not given or not same(given, state_kept) or until < time.time():
        _log.warning("provider sign-in refused: its state is not the one this browser was sent with")
        return _refused(view, 400, "signin.err.provider_state")
    try:
        provider = await people.signin.provider()
        token = await provider.redeem(settings, code, Begun("", state_kept, nonce, verifier), _back(view))
        try:
            claims = check_id_token(token, provider, settings.client_id, nonce)
        except OidcError:  # signed by a key the provider added since: read its keys again, once
            claims = check_id_token(token, await people.signin.provider(fresh=True), settings.client_id, nonce)
        user = await people.sign_in_provider(settings, claims)
    except OidcError as exc:
        _log.warning("provider sign-in refused", why=str(exc))
        return _refused(view, 401, "signin.err.provider_token", why=str(exc))
    except SignInRefused as exc:
        return _refused(view, 403, "signin.err.provider_user", why=str(exc))
    _log.info("console sign-in", user=user.name, via="provider")
    response = start_session(view, f"u-{user.name}", user.name, back, page=True)
    response.delete_cookie(_COOKIE, path=_PATH)
    return response


ROUTES = (to_provider, from_provider)
