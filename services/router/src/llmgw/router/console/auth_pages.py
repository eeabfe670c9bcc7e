"""Signing in and out of the console, and the language switch.

Sign-in takes an admin key once and gives a session cookie (HttpOnly, SameSite=Strict, ending
after `console_session_s`); the key itself is never stored in the browser. The sign-in form is
protected against being posted from another site by a token bound to a pre-session cookie.
"""

from __future__ import annotations

import time

from litestar import Request, get, post
from litestar.datastructures import Cookie
from litestar.response import Redirect, Response

from llmgw.bus import get_logger
from llmgw.router.console.i18n import LANGUAGES
from llmgw.router.console.session import same
from llmgw.router.console.web import LANG_COOKIE, PRE_COOKIE, PREFIX, SESSION_COOKIE, View, next_page
from llmgw.router.errors import ApiError

__all__ = ["ROUTES"]

_log = get_logger("router")
_KEY_ERRORS = {"missing_api_key": "missing", "invalid_api_key": "invalid", "expired_api_key": "expired_key"}


@get("/signin")
async def signin_form(view: View, next: str = "", why: str = "") -> Response:
    """The sign-in page; `why` says why the last page sent here (session expired, revoked)."""
    error = view.t(f"signin.why.{why}") if why in ("none", "expired", "revoked", "bad") else ""
    return view.signin_page(error=error, next_=next)


@post("/signin")
async def signin(request: Request, view: View) -> Response:
    """Sign in with an admin key: a session cookie, then the page asked for."""
    form = await request.form()
    nonce = request.cookies.get(PRE_COOKIE, "")
    token = str(form.get("csrf", ""))
    back = str(form.get("next", ""))
    if not nonce or not same(token, view.console.sessions.anonymous_csrf(nonce)):
        return view.signin_page(403, view.t("signin.err.csrf"), back)
    key = str(form.get("key", "")).strip()
    try:
        key_id, record = view.console.accounts.authorize(f"Bearer {key}", admin=True)
    except ApiError as exc:
        reason = _KEY_ERRORS.get(exc.code, "not_admin")
        _log.warning("console sign-in refused", why=exc.code)
        return view.signin_page(401 if reason != "not_admin" else 403, view.t(f"signin.err.{reason}"), back)
    _log.info("console sign-in", key=record.name, key_id=key_id)
    cookie, _session = view.console.sessions.issue(key_id, time.time())
    response = view.done(next_page(back), view.t("signin.done", name=record.name))
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=view.secure,
        max_age=view.console.sessions.lifetime_s,
    )
    response.delete_cookie(PRE_COOKIE, path=PREFIX)
    return response


@post("/signout")
async def signout(view: View) -> Response:
    """End this browser's session (the form's CSRF token was checked before). The cookie is
    dropped; one copied before stays good until it ends (docs/console.md)."""
    _log.info("console sign-out", key=view.by)
    response = view.done(f"{PREFIX}/signin", view.t("signin.signed_out"))
    response.delete_cookie(SESSION_COOKIE, path=PREFIX)
    return response


@get("/lang")
async def switch_language(to: str, next: str = "") -> Redirect:
    """Speak `to` from now on in this browser, then back to the page."""
    lang = to if to in LANGUAGES else LANGUAGES[0]
    cookie = Cookie(key=LANG_COOKIE, value=lang, path=PREFIX, samesite="strict", max_age=365 * 86400)
    return Redirect(next_page(next), status_code=303, cookies=[cookie])


@get("/")
async def home() -> Redirect:
    """The console opens on the models."""
    return Redirect(f"{PREFIX}/models", status_code=303)


@get("/{rest:path}")
async def no_such_page(view: View, rest: str) -> Response:
    """A console address that is no page: said as such, with the way back."""
    return view.render("error.html", status=404, message=view.t("error.no_page", path=f"{PREFIX}{rest}"))


ROUTES = (signin_form, signin, signout, switch_language, home, no_such_page)
