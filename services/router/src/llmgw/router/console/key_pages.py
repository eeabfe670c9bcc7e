"""The keys and projects page: every key (never the key itself) with its project, rights, models,
limits and how much of each limit is used now; making a key (shown once, on the page that answers
the form, never in a redirect or a cookie); revoking one; a project's limits.

The page calls the router's own `Accounts`, the handlers of the admin API's endpoints; a form is
read into the same messages (`KeyCreate`, `KeyRef`, `Project`), each name checked by the proto's
Name type first. What is made, revoked or limited is logged with who did it (never a key).
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from litestar import get, post
from litestar.response import Response

from llmgw.bus import NotFound, get_logger
from llmgw.proto import Empty, KeyCreate, KeyCreated, KeyRef, Limits, Project
from llmgw.router.accounts.limits import standing
from llmgw.router.accounts.quota import Scope
from llmgw.router.console.web import PREFIX, Refused, View

__all__ = ["LIMITS", "ROUTES"]

_log = get_logger("router")

LIMITS = tuple(Limits.__struct_fields__)
"""The limits a key or a project may have, in the forms' order."""
_MOST = 10**12
"""The largest limit a form takes."""
_MOST_DAYS = 3650
"""The longest a key may last, days."""


async def _standing(view: View, scope: Scope, now: float) -> list[tuple[str, int, int]]:
    """Each limit of `scope` with what is used against it now (none read where it has no limit)."""
    sid, _, limits = scope
    return standing(limits, await view.console.accounts.quota.read(sid, now)) if limits != Limits() else []


async def _page(view: View, status: int = 200, error: str = "", **context: object) -> Response:
    """The page, with `error` at the top and `context` (a form's values kept, a key just made)."""
    accounts, now, who = view.console.accounts, time.time(), view.principal
    assert who is not None
    keys = who.seen_keys((await accounts.list_keys(Empty())).keys)
    projects = sorted(accounts.projects.items.values(), key=lambda p: p.name) if who.admin else []
    key_scopes = [accounts.scopes(kid, record)[0] for kid, record in keys.items()]
    project_scopes = [accounts.project_scope(p.name) for p in projects]
    read = await asyncio.gather(*(_standing(view, scope, now) for scope in [*key_scopes, *project_scopes]))
    return view.render(
        "keys.html",
        status=status,
        active="keys",
        error=error,
        keys=keys,
        projects=projects,
        key_state=dict(zip(keys, read[: len(keys)], strict=True)),
        project_state={p.name: s for p, s in zip(projects, read[len(keys) :], strict=True)},
        limits=LIMITS,
        now=now,
        **{"created": None, "create_form": {}, "project_form": {}, **context},
    )


def _name(view: View, field: str, raw: str | None = None) -> str:
    """The posted name `field` (or `raw`), if it is a name as the messages take it (a project's
    name is checked, the type of every name here); Refused (400) saying what one is."""
    raw = (view.form.get(field, "") if raw is None else raw).strip()
    try:
        return msgspec.convert({"name": raw}, Project).name
    except msgspec.ValidationError:
        raise Refused(400, view.t("keys.err.name", field=view.t(f"field.{field}"), got=raw)) from None


def _limits(view: View) -> Limits:
    """The posted limits: each a whole number from 1, an empty field no limit."""
    return Limits(
        **{
            name: view.number(f"limit.{name}", 1, _MOST)
            for name in LIMITS
            if view.form.get(f"limit.{name}", "").strip()
        }
    )


def _key_create(view: View) -> KeyCreate:
    """The create form as a KeyCreate; Refused (400) naming the first field that is wrong."""
    name = _name(view, "key_name")
    project = _name(view, "key_project") if view.form.get("key_project", "").strip() else "default"
    models = [_name(view, "key_models", m) for m in view.form.get("key_models", "").replace(",", " ").split()]
    days = view.number("key_expires_days", 1, _MOST_DAYS) if view.form.get("key_expires_days", "").strip() else 0
    who = view.principal
    assert who is not None
    asked = KeyCreate(
        name=name,
        admin="key_admin" in view.form,
        project=project,
        expires_in_s=days * 86400 or None,
        models=models,
        limits=_limits(view),
        by=view.by,
    )
    if who.admin:
        return asked
    # anyone else's key from this form is its own, in its tenant, with no admin rights
    mine = msgspec.structs.replace(asked, admin=False, tenant=who.tenant, owner=who.name, project=who.tenant)
    return who.key_to_make(mine)


@get("/keys")
async def keys_page(view: View, project: str = "") -> Response:
    """Every key and project, with the forms to make, revoke and limit them; `project`: the limits
    form filled in with that project's limits as they are."""
    known = view.console.accounts.projects.items.get(project)
    if known is None:
        return await _page(view)
    limits = msgspec.structs.asdict(known.limits)
    filled = {f"limit.{name}": str(value) for name, value in limits.items() if value is not None}
    return await _page(view, project_form={"project_name": known.name, **filled})


@post("/keys")
async def create_key(view: View) -> Response:
    """Make a key and show it, once, on the page that answers (nothing is made if a field is wrong)."""
    try:
        req = _key_create(view)
    except Refused as exc:
        return await _page(view, exc.status, exc.message, create_form=view.form)
    created: KeyCreated = await view.console.accounts.create_key(req)
    _log.info("key created", name=req.name, project=req.project, admin=req.admin, by=view.by, where="console")
    return await _page(view, 201, created=created)


@post("/keys/revoke")
async def revoke_key(view: View) -> Response:
    """Revoke a key by its id, on every router; an id no key has changes nothing and says so."""
    raw = view.form.get("id", "")
    accounts, who = view.console.accounts, view.principal
    try:
        ref = msgspec.convert({"id": raw, "by": view.by}, KeyRef)
        seen = [k for kid, k in (await accounts.list_keys(Empty())).keys.items() if kid == ref.id]
        if not seen or who is None or not who.sees_key(seen[0]):
            raise NotFound(ref.id)  # one it does not see is one it cannot name
        record = (await accounts.revoke_key(ref)).keys[ref.id]
    except (msgspec.ValidationError, NotFound):
        return await _page(view, 404, view.t("keys.err.unknown", id=raw))
    _log.info("key revoked", name=record.name, key_id=ref.id, by=view.by, where="console")
    return view.done(f"{PREFIX}/keys", view.t("keys.revoked", name=record.name, id=ref.id))


@post("/projects")
async def put_project(view: View) -> Response:
    """Make a project or set its limits (all of them: an empty field is no limit)."""
    try:
        name = _name(view, "project_name")
        limits = _limits(view)
    except Refused as exc:
        return await _page(view, exc.status, exc.message, project_form=view.form)
    known = view.console.accounts.projects.items.get(name)
    project = Project(name=name, limits=limits, created=known.created if known else 0.0, by=view.by)
    await view.console.accounts.put_project(project)
    _log.info("project limits set", project=name, by=view.by, where="console")
    return view.done(f"{PREFIX}/keys", view.t("keys.project_saved", name=name))


ROUTES = (keys_page, create_key, revoke_key, put_project)
