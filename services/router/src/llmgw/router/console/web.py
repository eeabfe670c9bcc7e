"""What every console page shares: the `Console` (templates, messages, sessions, the bus), the
`View` of one request (its language, its signed-in admin, its CSRF token, the note left by the
last action) and the hook that lets no request past without a live admin session and, for a
form, the session's CSRF token.

A page asks the same NATS endpoints the admin API does (`View.ask`): the rules live in the
services, a page only shows what they answer and what they refuse.
"""

from __future__ import annotations

import secrets
import time
from typing import Any
from urllib.parse import quote, urlsplit

import msgspec
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from litestar import Request
from litestar.datastructures import Cookie
from litestar.enums import MediaType
from litestar.response import Redirect, Response
from nats.aio.client import Client

from llmgw.bus import get_logger
from llmgw.proto import Endpoint, KeyRecord
from llmgw.router.accounts.access import Principal, key_principal, user_principal
from llmgw.router.accounts.accounts import Accounts
from llmgw.router.admin.operations import ask
from llmgw.router.console.i18n import LANGUAGES, Messages, choose_language
from llmgw.router.console.session import BadSession, ExpiredSession, Session, Sessions, same
from llmgw.router.errors import ApiError
from llmgw.router.request.gateway import Gateway

__all__ = ["NAVIGATION", "PREFIX", "Console", "Refused", "View", "check_request", "next_page"]

PREFIX = "/console"
SESSION_COOKIE, LANG_COOKIE, NOTE_COOKIE, PRE_COOKIE = "llmgw_console", "llmgw_lang", "llmgw_note", "llmgw_pre"
OPEN_PATHS = (f"{PREFIX}/signin", f"{PREFIX}/lang", f"{PREFIX}/static/")
"""Reached without a session: the sign-in page, the language switch, the styles and script."""

NAVIGATION = (
    "dashboard",
    "models",
    "serve",
    "playground",
    "mirror",
    "hub",
    "fleet",
    "keys",
    "usage",
    "requests",
    "audit",
    "people",
    "identity",
    "guard",
    "knowledge",
    "tools",
)
"""The pages the navigation lists, in order (each principal sees those it opens)."""
_EVERYONE = ("", "signout", "lang", "signin", "static")
"""Pages every signed-in principal opens."""
_NOTE_MOST = 1200
"""Characters of a note kept (a cookie past ~4 KB is dropped by the browser, the note with it)."""
_log = get_logger("router")

OPTIONAL_S = 3.0
"""How long a page waits for a part it can be drawn without (a plan, the models using a repo)."""


def next_page(target: str | None) -> str:
    """Where to go after signing in or switching language: a console page, never another site."""
    if target and target.startswith(f"{PREFIX}/") and not target.startswith("//") and "\\" not in target:
        return target
    return f"{PREFIX}/models"


class Refused(Exception):
    """A service refused what a page asked (or did not answer): the status the page is drawn
    with, and the service's own words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Console:
    """The console's parts, made once per router."""

    def __init__(self, accounts: Accounts, nc: Client, gateway: Gateway, secret: bytes, session_s: int) -> None:
        self.accounts, self.nc, self.gateway = accounts, nc, gateway
        self.sessions = Sessions(secret, session_s)
        self.messages = Messages.load()
        self.templates = Environment(
            loader=PackageLoader("llmgw.router.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )

    def principal(self, subject: str, now: float) -> Principal | None:
        """Who a session names, as it is now: a user not removed or disabled ('u-' and its name),
        or an admin key alive; None: neither (the session ends)."""
        if subject.startswith("u-"):
            people = self.accounts.people
            user = people.user(subject[2:]) if people is not None else None
            return user_principal(user) if user is not None else None
        key = self.admin(subject, now)
        return key_principal(subject, key) if key is not None else None

    def provider_label(self) -> str:
        """What the sign-in page's provider button names ("": no provider is set up)."""
        people = self.accounts.people
        s = people.signin.oidc if people is not None and people.signin is not None else None
        return "" if s is None else s.label or urlsplit(s.issuer).netloc

    def key_of(self, who: Principal) -> KeyRecord:
        """What `who` acts as: the admin key's record, or a user's own key (`Principal.as_key`)."""
        if who.is_user:
            return who.as_key()
        for digest, record in self.accounts.keys.items.items():
            if digest[:16] == who.subject:
                return record
        return who.as_key()

    def admin(self, key_id: str, now: float) -> KeyRecord | None:
        """The admin key with this id, while it exists, is an admin's and has not expired."""
        for digest, record in self.accounts.keys.items.items():
            if digest[:16] == key_id:
                alive = record.expires is None or record.expires >= now
                return record if record.admin and alive else None
        return None


class View:
    """One request as a page sees it."""

    def __init__(self, console: Console, request: Request, session: Session | None, who: Principal | None) -> None:
        self.console, self.request = console, request
        self.session, self.principal = session, who
        self.key: KeyRecord | None = None if who is None else console.key_of(who)
        """What it acts as: the admin key signed in, or a user's own (`Principal.as_key`)."""
        self.lang = choose_language(request.cookies.get(LANG_COOKIE), request.headers.get("accept-language"))
        raw_note = request.cookies.get(NOTE_COOKIE)
        self.note = console.sessions.read_note(raw_note) if raw_note else None
        self._had_note = raw_note is not None
        self.form: dict[str, str] = {}
        """The posted form (its CSRF token already checked), one value per field."""
        self.forms: dict[str, list[str]] = {}
        """Every value of each posted field (checkboxes and repeated names)."""

    @property
    def by(self) -> str:
        """Who is acting, as the services record it: the signed-in user's or key's name."""
        return self.principal.name if self.principal else ""

    def runs(self, model: str) -> bool:
        """Whether the signed-in principal sees and changes `model` (`Principal.runs_model`)."""
        people = self.console.accounts.people
        tenants = people.tenants.items if people is not None else {}
        return self.principal is not None and self.principal.runs_model(model, tenants)

    @property
    def pages(self) -> list[str]:
        """The navigation's pages this principal opens."""
        return [p for p in NAVIGATION if self.principal is not None and self.principal.opens(p)]

    # words and numbers

    def t(self, key: str, **values: Any) -> str:
        """The message `key` in this request's language."""
        return self.console.messages.text(self.lang, key, **values)

    def num(self, value: float, digits: int = 0) -> str:
        """A number as this language writes it (tr: 1.234,5; en: 1,234.5)."""
        text = f"{value:,.{digits}f}"
        return text.translate(str.maketrans(",.", ".,")) if self.lang == "tr" else text

    def mib(self, mb: float) -> str:
        """A size in MiB as MiB or GiB."""
        return f"{self.num(mb / 1024, 1)} GiB" if mb >= 1024 else f"{self.num(mb)} MiB"

    def bytes(self, n: float) -> str:
        """A size in bytes, in the largest unit that keeps it above 1."""
        for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if n >= size:
                return f"{self.num(n / size, 1)} {unit}"
        return f"{self.num(n)} B"

    def when(self, unix: float | None) -> str:
        """A Unix time as UTC, to the minute."""
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(unix)) if unix else "—"

    def when_s(self, unix: float) -> str:
        """A Unix time as UTC, to the second (the zone said in the column's head)."""
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix))

    # the services

    async def ask(self, endpoint: Endpoint, message: msgspec.Struct, optional: bool = False) -> Any:
        """What `endpoint` answers; Refused with its words (and the status they mean, as the admin
        API answers it) if it refuses. `optional`: a part the page is drawn without, waited for
        `OPTIONAL_S` at most."""
        try:
            return await ask(self.console.nc, endpoint, message, self.by, OPTIONAL_S if optional else None)
        except ApiError as exc:
            raise Refused(exc.status, exc.message) from None

    # answers

    def render(self, template: str, status: int = 200, **context: Any) -> Response:
        """The page `template` drawn with `context`, in this request's language."""
        context.setdefault("refresh", self.refresh_url())
        html = self.console.templates.get_template(template).render(
            v=self, t=self.t, prefix=PREFIX, languages=LANGUAGES, **context
        )
        cookies = [Cookie(key=NOTE_COOKIE, value="", path=PREFIX, max_age=0)] if self._had_note else []
        headers = {
            "cache-control": "no-store",
            "x-frame-options": "DENY",
            "referrer-policy": "same-origin",
            "x-content-type-options": "nosniff",
            "content-security-policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
        }
        return Response(html, status_code=status, media_type=MediaType.HTML, cookies=cookies, headers=headers)

    def signin_page(self, status: int = 200, error: str = "", next_: str = "") -> Response:
        """The sign-in page (coming back to `next_` after), with its form's token bound to this
        browser's pre-session cookie (set here when it has none)."""
        nonce = self.request.cookies.get(PRE_COOKIE) or secrets.token_hex(16)
        response = self.render(
            "signin.html",
            status=status,
            error=error,
            next=next_page(next_),
            signin_csrf=self.console.sessions.anonymous_csrf(nonce),
            provider=self.console.provider_label(),
        )
        response.set_cookie(PRE_COOKIE, nonce, path=PREFIX, httponly=True, samesite="strict", secure=self.secure)
        return response

    @property
    def secure(self) -> bool:
        """Whether the browser reached the console over HTTPS (its cookies are then Secure)."""
        return self.request.url.scheme == "https" or self.request.headers.get("x-forwarded-proto") == "https"

    def refresh_url(self) -> str:
        """Where the page's live parts are asked for again: the page itself after a GET; after a
        form was refused and the page drawn again, the page the form was on (the Referer, when it
        is a console page of this site); else nowhere."""
        url = self.request.url
        if self.request.method == "GET":
            return url.path + (f"?{url.query}" if url.query else "")
        came = urlsplit(self.request.headers.get("referer", ""))
        if came.netloc == url.netloc and came.path.startswith(f"{PREFIX}/"):
            return came.path + (f"?{came.query}" if came.query else "")
        return ""

    def done(self, path: str, text: str, kind: str = "ok") -> Redirect:
        """To `path` (under the console) with `text` shown at its top: what an action did."""
        return Redirect(path, status_code=303, cookies=[self.note_cookie(text, kind)])

    def note_cookie(self, text: str, kind: str = "ok") -> Cookie:
        """The cookie that carries `text` to the next page drawn (shown at its top)."""
        note = self.console.sessions.note(kind, text if len(text) <= _NOTE_MOST else text[: _NOTE_MOST - 1] + "…")
        return Cookie(key=NOTE_COOKIE, value=note, path=PREFIX, httponly=True, samesite="strict", max_age=60)

    def number(self, field: str, low: int, high: int, default: int | None = None, label: str = "") -> int:
        """The posted whole number `field`, from `low` to `high`; Refused (400) saying which field
        (`label`, else the message `field.<field>`) and what it takes. An empty field is `default`
        where there is one."""
        raw = self.form.get(field, "").strip()
        if not raw and default is not None:
            return default
        if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
            named = label or self.t(f"field.{field}")
            raise Refused(400, self.t("form.err.number", field=named, low=low, high=high, got=raw))
        return int(raw)


async def check_request(console: Console, request: Request) -> Response | None:
    """The hook before every console route: a View on `request.state.view`, or the answer that
    stops it (to the sign-in page without a live admin session; 403 for a form whose CSRF token
    is not the session's). Nothing is changed by a request stopped here."""
    now = time.time()
    path = request.url.path
    session = who = None
    raw = request.cookies.get(SESSION_COOKIE)
    why = ""
    if raw:
        try:
            session = console.sessions.open(raw, now)
            who = console.principal(session.key_id, now)
            why = "" if who else "revoked"
        except ExpiredSession:
            why = "expired"
        except BadSession:
            why = "bad"
    else:
        why = "none"
    if who is None:
        session = None
    view = request.state.view = View(console, request, session, who)
    if path.startswith(OPEN_PATHS):
        return None
    if session is None or who is None:
        if request.method == "GET":
            return Redirect(f"{PREFIX}/signin?next={quote(path)}&why={why}", status_code=303)
        return view.signin_page(401, view.t(f"signin.why.{why}"), view.refresh_url())
    page = path.removeprefix(f"{PREFIX}/").split("/", 1)[0]
    if page not in _EVERYONE and not who.opens(page):
        role = view.t(f"role.{who.role}")
        return view.render("error.html", status=403, message=view.t("error.role", name=who.name, role=role))
    if page == "models" and path.count("/") >= 3 and not view.runs(path.split("/")[3]):
        return view.render("error.html", status=403, message=view.t("error.model_not_yours", name=who.name))
    if request.method == "POST":
        form = await request.form()
        view.forms = {name: [str(x) for x in form.getall(name)] for name in form}
        view.form = {name: values[-1] for name, values in view.forms.items()}
        if not same(view.form.get("csrf", ""), session.csrf):
            _log.warning("console form refused: CSRF token", path=path, who=who.name)
            return view.render("error.html", status=403, message=view.t("error.csrf"))
    return None
