"""Signing in and out of the console, and the language switch.

Sign-in takes an admin key once and gives a session cookie (HttpOnly, SameSite=Strict, ending
after `console_session_s`); the key itself is never stored in the browser. The sign-in form is
protected against being posted from another site by a token bound to a pre-session cookie.
"""

from __future__ import annotations

import hmac
import secrets
import time

from litestar import Request, get, post
from litestar.datastructures import Cookie
from litestar.response import Redirect, Response

from llmgw.router.console.i18n import LANGUAGES
from llmgw.router.console.web import LANG_COOKIE, PRE_COOKIE, PREFIX, SESSION_COOKIE, View
from llmgw.router.errors import ApiError

__all__ = ["ROUTES"]

_KEY_ERRORS = {"missing_api_key": "missing", "invalid_api_key": "invalid", "expired_api_key": "expired_key"}


def _next(target: str | None) -> str:
    """Where to go after signing in: a console page, never another site."""
    if target and target.startswith(f"{PREFIX}/") and not target.startswith("//") and "\\" not in target:
        return target
    return f"{PREFIX}/models"


def _secure(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"


def _signin_page(view: View, request: Request, status: int = 200, error: str = "", next_: str = "") -> Response:
    nonce = request.cookies.get(PRE_COOKIE) or secrets.token_hex(16)
    response = view.render(
        "signin.html",
        status=status,
        error=error,
        why="",
        next=_next(next_),
        signin_csrf=view.console.sessions.anonymous_csrf(nonce),
    )
    response.set_cookie(PRE_COOKIE, nonce, path=PREFIX, httponly=True, samesite="strict", secure=_secure(request))
    return response


@get("/signin")
async def signin_form(request: Request, view: View, next: str = "", why: str = "") -> Response:
    """The sign-in page; `why` says why the last page sent here (session expired, revoked)."""
    error = view.t(f"signin.why.{why}") if why in ("none", "expired", "revoked", "bad") else ""
    return _signin_page(view, request, error=error, next_=next)


@post("/signin")
async def signin(request: Request, view: View) -> Response:
    """Sign in with an admin key: a session cookie, then the page asked for."""
    form = await request.form()
    nonce = request.cookies.get(PRE_COOKIE, "")
    token = str(form.get("csrf", ""))
    if not nonce or not hmac.compare_digest(token, view.console.sessions.anonymous_csrf(nonce)):
        return _signin_page(view, request, 403, view.t("signin.err.csrf"), str(form.get("next", "")))
    key = str(form.get("key", "")).strip()
    try:
        key_id, record = view.console.accounts.authorize(f"Bearer {key}", admin=True)
    except ApiError as exc:
        reason = _KEY_ERRORS.get(exc.code, "not_admin")
        return _signin_page(view, request, 401 if reason != "not_admin" else 403, view.t(f"signin.err.{reason}"))
    cookie, _session = view.console.sessions.issue(key_id, time.time())
    response = view.done(_next(str(form.get("next", ""))), view.t("signin.done", name=record.name))
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        max_age=view.console.sessions.lifetime_s,
    )
    response.delete_cookie(PRE_COOKIE, path=PREFIX)
    return response


@post("/signout")
async def signout(view: View) -> Response:
    """End this browser's session (the form's CSRF token was checked before)."""
    response = view.done(f"{PREFIX}/signin", view.t("signin.signed_out"))
    response.delete_cookie(SESSION_COOKIE, path=PREFIX)
    return response


@get("/lang")
async def switch_language(to: str, next: str = "") -> Redirect:
    """Speak `to` from now on in this browser, then back to the page."""
    lang = to if to in LANGUAGES else LANGUAGES[0]
    cookie = Cookie(key=LANG_COOKIE, value=lang, path=PREFIX, samesite="strict", max_age=365 * 86400)
    return Redirect(_next(next), status_code=303, cookies=[cookie])


@get("/")
async def home() -> Redirect:
    """The console opens on the models."""
    return Redirect(f"{PREFIX}/models", status_code=303)


@get("/{rest:path}")
async def no_such_page(view: View, rest: str) -> Response:
    """A console address that is no page: said as such, with the way back."""
    return view.render("error.html", status=404, message=view.t("error.no_page", path=f"{PREFIX}{rest}"))


ROUTES = (signin_form, signin, signout, switch_language, home, no_such_page)
