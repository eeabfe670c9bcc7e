"""The people page (admins): users with their roles per tenant, made (a password shown once, on
the page that answers), given a role, removed; tenants and the models each may use. And the
audit page (admins, and operators for what they run): who changed what, newest first. Both ask
the router's people endpoints, as `llmgw ctl user|tenant|audit` do."""

from __future__ import annotations

import msgspec
from litestar import get, post
from litestar.response import Response

from llmgw.proto import Empty, people
from llmgw.proto.people import AuditQuery, Tenant, UserCreate, UserRef, UserRole
from llmgw.router.console.web import PREFIX, Refused, View

__all__ = ["ROUTES"]


async def _page(view: View, status: int = 200, error: str = "", **shown: object) -> Response:
    users = (await view.ask(people.USER_LIST, Empty())).users
    tenants = (await view.ask(people.TENANT_LIST, Empty())).tenants
    values = {"created": None, "form": {}, **shown}
    return view.render(
        "people.html",
        status=status,
        active="people",
        error=error,
        users=users,
        tenants=tenants,
        roles=people.ROLES,
        **values,
    )


def _message(view: View, kind: type, fields: dict) -> msgspec.Struct:
    """The form as `kind`, checked as the router checks it; Refused (400) saying what was wrong."""
    try:
        return msgspec.convert(fields, kind)
    except msgspec.ValidationError as exc:
        raise Refused(400, view.t("people.err.field", why=str(exc))) from None


@get("/people")
async def people_page(view: View) -> Response:
    """Users and tenants, and the forms that change them."""
    return await _page(view)


@post("/people/users")
async def create_user(view: View) -> Response:
    """Make a local user; its password, made here, is shown once on the page that answers."""
    form = view.form
    try:
        fields = {"name": form.get("name", "").strip(), "tenant": form.get("tenant", "default"), "by": view.by}
        ask = _message(view, UserCreate, fields | {"role": form.get("role", "member")})
        made = await view.ask(people.USER_CREATE, ask)
    except Refused as exc:
        return await _page(view, exc.status, exc.message, form=form)
    return await _page(view, 201, created=made)


@post("/people/role")
async def set_role(view: View) -> Response:
    """A user's role in a tenant set, or taken away ("none")."""
    role = view.form.get("role", "")
    fields = {"name": view.form.get("name", ""), "tenant": view.form.get("tenant", ""), "by": view.by}
    try:
        ask = _message(view, UserRole, fields | {"role": None if role == "none" else role})
        user = await view.ask(people.USER_ROLE, ask)
    except Refused as exc:
        return await _page(view, exc.status, exc.message, form=view.form)
    return view.done(f"{PREFIX}/people", view.t("people.role_set", name=user.name, tenant=ask.tenant, role=role))


@post("/people/remove")
async def remove_user(view: View) -> Response:
    """Remove a user: its sessions and keys end at once."""
    try:
        ask = _message(view, UserRef, {"name": view.form.get("name", ""), "by": view.by})
        await view.ask(people.USER_REMOVE, ask)
    except Refused as exc:
        return await _page(view, exc.status, exc.message)
    return view.done(f"{PREFIX}/people", view.t("people.removed", name=ask.name))


@post("/people/tenants")
async def put_tenant(view: View) -> Response:
    """Make a tenant or set the models it may use."""
    models = [m for m in view.form.get("models", "").replace(",", " ").split() if m]
    name = view.form.get("tenant_name", "").strip()
    try:
        kept = {t.name: t for t in (await view.ask(people.TENANT_LIST, Empty())).tenants}.get(name)
        limits = msgspec.to_builtins(kept.limits) if kept else {}  # its limits (ctl's) stay as they are
        tenant = _message(view, Tenant, {"name": name, "models": models, "limits": limits, "by": view.by})
        await view.ask(people.TENANT_PUT, tenant)
    except Refused as exc:
        return await _page(view, exc.status, exc.message, form=view.form)
    return view.done(f"{PREFIX}/people", view.t("people.tenant_saved", name=tenant.name))


@get("/audit")
async def audit_page(view: View, area: str = "", subject: str = "", tenant: str = "", before: int = 0) -> Response:
    """The latest changes, newest first (of one area, subject or tenant where asked); an
    operator's: what it runs (the catalog, the mirror) and its tenants'."""
    who = view.principal
    assert who is not None
    fields = {"area": area, "subject": subject, "tenant": tenant, "before": before, "limit": 100}
    log = await view.ask(people.AUDIT_LOG, _message(view, AuditQuery, fields))
    known = view.console.accounts.people
    log.entries = [e for e in log.entries if who.sees_entry(e, known.tenants.items if known else {})]
    tenants = sorted(known.tenants.items) if who.admin and known is not None else sorted(who.roles)
    form = {"area": area, "subject": subject, "tenant": tenant}
    return view.render("audit.html", active="audit", log=log, form=form, areas=_AREAS, tenants=tenants)


_AREAS = people.AUDIT_AREAS

ROUTES = (people_page, create_user, set_role, remove_user, put_tenant, audit_page)
