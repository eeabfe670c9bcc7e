"""The sign-in settings page (admins): the directory (LDAP, Active Directory) and the OpenID
Connect provider people sign in with, each tried before it is kept ("bind as X worked; ada is
..., in 2 groups: operator of research"), its secret never shown back (left empty, the kept one
stays). It asks the router's `signin.*` endpoints, as `llmgw ctl signin` does."""

from __future__ import annotations

import msgspec
from litestar import get, post
from litestar.response import Response

from llmgw.proto import Empty, people
from llmgw.proto.people import GroupRole, LdapSettings, OidcSettings, SignInTry
from llmgw.router.console.web import PREFIX, Refused, View

__all__ = ["ROUTES"]

_LDAP_FIELDS = ("url", "ca_file", "bind_dn", "bind_password", "user_base", "user_filter", "group_base", "group_filter")
_OIDC_FIELDS = ("issuer", "client_id", "client_secret", "label", "name_claim", "groups_claim")


async def _page(view: View, status: int = 200, error: str = "", said: list[str] | None = None) -> Response:
    kept = await view.ask(people.SIGNIN_SHOW, Empty())
    return view.render(
        "identity.html", status=status, active="identity", error=error, said=said or [], kept=kept, form=view.form
    )


def _groups(view: View) -> list[GroupRole]:
    try:
        return [GroupRole.parse(line) for line in view.form.get("groups", "").splitlines() if line.strip()]
    except ValueError as exc:
        raise Refused(400, view.t("identity.err.groups", why=str(exc))) from None


def _part(view: View, kind: type, names: tuple[str, ...], **more: object) -> msgspec.Struct:
    fields = {n: view.form.get(n, "").strip() for n in names} | {"groups": _groups(view), **more}
    fields = {k: v for k, v in fields.items() if v != "" or k in ("bind_password", "client_secret")}
    try:
        return msgspec.convert(fields, kind)
    except msgspec.ValidationError as exc:
        raise Refused(400, view.t("identity.err.field", why=str(exc))) from None


async def _act(view: View, part: str, given: msgspec.Struct | None) -> Response:
    """Try, keep or turn off one part (the other kept as it is)."""
    kept = await view.ask(people.SIGNIN_SHOW, Empty())
    settings = msgspec.structs.replace(kept, secrets_kept=[], by=view.by, **{part: given})
    if view.form.get("do") == "try":
        tried = await view.ask(
            people.SIGNIN_TRY, SignInTry(settings=settings, name=view.form.get("try_name", ""), by=view.by)
        )
        return await _page(view, said=tried.said)
    kept_now = await view.ask(people.SIGNIN_PUT, settings)
    return view.done(f"{PREFIX}/identity", view.t("identity.kept", said="; ".join(kept_now.said)))


@get("/identity")
async def identity_page(view: View) -> Response:
    """The sign-in settings in force, and the forms that try and keep others."""
    return await _page(view)


@post("/identity/ldap")
async def ldap_settings(view: View) -> Response:
    """Try, keep or turn off the directory."""
    try:
        off = view.form.get("do") == "off"
        given = None if off else _part(view, LdapSettings, _LDAP_FIELDS, starttls="starttls" in view.form)
        return await _act(view, "ldap", given)
    except Refused as exc:
        return await _page(view, exc.status, exc.message)


@post("/identity/oidc")
async def oidc_settings(view: View) -> Response:
    """Try, keep or turn off the provider."""
    try:
        given = None if view.form.get("do") == "off" else _part(view, OidcSettings, _OIDC_FIELDS)
        return await _act(view, "oidc", given)
    except Refused as exc:
        return await _page(view, exc.status, exc.message)


ROUTES = (identity_page, ldap_settings, oidc_settings)
