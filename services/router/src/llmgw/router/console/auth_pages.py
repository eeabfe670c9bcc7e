"""Signing in and out of the console, and the language switch.

Sign-in takes an admin key once and gives a session cookie (HttpOnly, SameSite=Strict, ending
after `console_session_s`); the key itself is never stored in the browser. The sign-in form is
protected against being posted from another site by a token bound to a pre-session cookie.
"""

from __future__ import annotations

import math
import time

from litestar import Request, get, post
from litestar.datastructures import Cookie
from litestar.response import Redirect, Response

from llmgw.bus import get_logger
from llmgw.router.accounts.people import DirectoryDown, Locked, SignInRefused
from llmgw.router.console.i18n import LANGUAGES
from llmgw.router.console.session import same
from llmgw.router.console.web import LANG_COOKIE, NAVIGATION, PRE_COOKIE, PREFIX, SESSION_COOKIE, View, next_page
from llmgw.router.errors import ApiError

__all__ = ["ROUTES", "start_session"]

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
    name = str(form.get("name", "")).strip()
    if name:
        signed = await _as_user(view, name, str(form.get("password", "")), back)
        if isinstance(signed, Response):
            return signed
        subject, who = signed
    else:
        key = str(form.get("key", "")).strip()
        try:
            subject, record = view.console.accounts.authorize(f"Bearer {key}", admin=True)
        except ApiError as exc:
            reason = _KEY_ERRORS.get(exc.code, "not_admin")
            _log.warning("console sign-in refused", why=exc.code)
            return view.signin_page(401 if reason != "not_admin" else 403, view.t(f"signin.err.{reason}"), back)
        who = record.name
        _log.info("console sign-in", key=who, key_id=subject)
    return start_session(view, subject, who, back)


def start_session(view: View, subject: str, who: str, back: str, page: bool = False) -> Response:
    """A new session for `subject` (a fresh cookie, whatever the browser held before: no session
    is fixed from outside), then the page asked for where the principal opens it, else its first.
    `page`: answered with a page that goes on by itself (after a provider's redirect, a redirect
    would not carry the Strict cookie to the next page)."""
    cookie, _session = view.console.sessions.issue(subject, time.time())
    principal = view.console.principal(subject, time.time())
    first = next((p for p in NAVIGATION if principal is not None and principal.opens(p)), "playground")
    asked = next_page(back).removeprefix(f"{PREFIX}/").split("/", 1)[0] if back else ""
    target = next_page(back) if asked and principal is not None and principal.opens(asked) else f"{PREFIX}/{first}"
    said = view.t("signin.done", name=who)
    if page:
        response = view.render("signed_in.html", target=target, said=said)
        response.cookies.append(view.note_cookie(said))
    else:
        response = view.done(target, said)
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


async def _as_user(view: View, name: str, password: str, back: str) -> tuple[str, str] | Response:
    """A user's sign-in: its session's subject and name, or the page that says why not (the same
    words for a wrong name or password; a lock said as such)."""
    people = view.console.accounts.people
    try:
        if people is None:
            raise SignInRefused("no users here")
        user = await people.sign_in(name, password, time.time())
    except Locked as exc:
        _log.warning("console sign-in refused", user=name, why="locked")
        return view.signin_page(429, view.t("signin.err.locked", name=name, seconds=str(math.ceil(exc.wait_s))), back)
    except SignInRefused:
        _log.warning("console sign-in refused", user=name, why="wrong name or password")
        return view.signin_page(401, view.t("signin.err.user"), back)
    except DirectoryDown:
        return view.signin_page(503, view.t("signin.err.directory"), back)
    _log.info("console sign-in", user=user.name)
    return f"u-{user.name}", user.name


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
async def home(view: View) -> Redirect:
    """The console opens on the first page the signed-in principal opens."""
    return Redirect(f"{PREFIX}/{(view.pages or ['models'])[0]}", status_code=303)


@get("/{rest:path}")
async def no_such_page(view: View, rest: str) -> Response:
    """A console address that is no page: said as such, with the way back."""
    return view.render("error.html", status=404, message=view.t("error.no_page", path=f"{PREFIX}{rest}"))


ROUTES = (signin_form, signin, signout, switch_language, home, no_such_page)
