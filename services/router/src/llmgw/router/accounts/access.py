"""Who may see and do what, without I/O: one rule every face asks — the console's pages, and the
admin API (and `ctl --api`) for a key an admin holds or a user owns. NATS's endpoints answer only
the fleet's own identities (services, agents, the operator's credentials: admins); people reach
them through these faces.

A principal is a signed-in user (its role in each tenant) or an admin key (an admin of the
whole fleet). An admin role anywhere makes a fleet admin; an operator runs the mirror, the fleet
and the models its tenants may use (a tenant that names none may use every model) and sees its
tenants' keys and usage; a member sees its own keys and usage and asks the models its tenant may
use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import msgspec

from llmgw.proto import KeyCreate, KeyRecord, RequestLogAsk, UsageRow
from llmgw.proto.people import DEFAULT_TENANT, AuditEntry, Role, Tenant, User
from llmgw.router.errors import Forbidden, refused

__all__ = ["MEMBER_PAGES", "OPERATOR_PAGES", "USAGE_GROUPS", "Principal", "key_principal", "user_principal"]

MEMBER_PAGES = ("playground", "keys", "usage", "requests", "knowledge")
"""The console pages a member opens."""
OPERATOR_PAGES = (
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
    "guard",
    "knowledge",
    "tools",
)
"""The console pages an operator opens; an admin opens every page."""
USAGE_GROUPS = ("model", "project", "key", "replica", "tenant")
"""What usage is summed by."""
_RANK: dict[str, int] = {"member": 0, "operator": 1, "admin": 2}
_NO_KEY = "-"
"""A key id no key has: a request log narrowed to none of its keys."""
_DEFAULT_PROJECT = "default"


class Principal(NamedTuple):
    """Who is asking: its name, its role in each tenant, and the subject its session names."""

    name: str
    roles: dict[str, Role]
    subject: str
    """A console session's subject: an admin key's id, or 'u-' and the user's name."""

    @property
    def is_user(self) -> bool:
        """A signed-in user (not an admin key)."""
        return self.subject.startswith("u-")

    @property
    def key_id(self) -> str:
        """What its own requests (the playground's) count under in limits and usage: an admin
        key's id, or 'user-' and a user's name (no key id is one)."""
        return f"user-{self.name}" if self.is_user else self.subject

    @property
    def admin(self) -> bool:
        """An admin of the whole fleet."""
        return "admin" in self.roles.values()

    @property
    def role(self) -> Role:
        """Its highest role anywhere."""
        return "admin" if self.admin else "operator" if "operator" in self.roles.values() else "member"

    @property
    def tenant(self) -> str:
        """The tenant it acts in (where it has a role; its first by name)."""
        return min(self.roles, default=DEFAULT_TENANT)

    def opens(self, page: str) -> bool:
        """Whether it opens the console page `page` (its path's first part)."""
        if self.admin:
            return True
        return page in (OPERATOR_PAGES if self.role == "operator" else MEMBER_PAGES)

    def sees_key(self, key: KeyRecord) -> bool:
        """Whether it sees (and may revoke) `key`: an admin every key, an operator its tenants'
        keys, a member its own."""
        if self.admin:
            return True
        if self.roles.get(key.tenant) == "operator":
            return True
        return bool(key.owner) and key.owner == self.name

    def runs_model(self, model: str, tenants: Mapping[str, Tenant]) -> bool:
        """Whether it sees and changes model `model`: an admin every model, an operator those one
        of the tenants it operates may use."""
        if self.admin:
            return True
        for name, role in self.roles.items():
            allowed = tenants[name].models if name in tenants else []
            if role == "operator" and (not allowed or model in allowed):
                return True
        return False

    def calls(self, least: str) -> bool:
        """Whether it may call an operation for role `least` and above (an admin route's)."""
        return _RANK[self.role] >= _RANK[least]

    def usage_groups(self) -> tuple[str, ...]:
        """What it may sum usage by: an admin anything, an operator keys or its tenants, a member
        its own keys."""
        return USAGE_GROUPS if self.admin else ("key", "tenant") if self.role == "operator" else ("key",)

    def seen_keys(self, keys: Mapping[str, KeyRecord]) -> dict[str, KeyRecord]:
        """The keys of `keys` (id -> record) it sees."""
        return {kid: key for kid, key in keys.items() if self.sees_key(key)}

    def seen_usage(self, group_by: str, rows: list[UsageRow], keys: Mapping[str, KeyRecord]) -> list[UsageRow]:
        """The rows of a usage sum by `group_by` it sees: by key its keys' (and its own requests',
        `key_id`), by tenant its tenants'; nothing else unless an admin."""
        if self.admin:
            return rows
        if group_by == "key":
            mine = {*self.seen_keys(keys), self.key_id}
            return [r for r in rows if r.group in mine]
        return [r for r in rows if r.group in self.operates] if group_by == "tenant" else []

    def seen_log(self, ask: RequestLogAsk, keys: Mapping[str, KeyRecord]) -> RequestLogAsk:
        """The request log it may read of what `ask` asks: an admin's as asked, anyone else's
        narrowed to its keys' requests (and its own, `key_id`)."""
        if self.admin:
            return ask
        mine = [*self.seen_keys(keys), self.key_id]
        asked = [k for k in ask.keys if k in mine] if ask.keys else mine
        return msgspec.structs.replace(ask, keys=asked or [_NO_KEY])  # none of its own: no request at all

    def check_tenant(self, tenant: str, least: Role, missing: str, takes: str) -> None:
        """The one rule for what lives in a tenant (its bases, caches, servers, rules): an admin
        acts in every tenant; anyone else only where it has a role, and changes only with `least`.
        Another tenant's thing reads as not there (404 in the words of what is `missing`); a role
        below `least` is a 403 saying what the change `takes`."""
        if self.admin:
            return
        role = self.roles.get(tenant)
        if role is None:
            raise refused("router", "404", missing)
        if _RANK[role] < _RANK[least]:
            raise Forbidden(f"{takes} takes tenant {tenant}'s {least} role.")

    @property
    def operates(self) -> set[str]:
        """The tenants it is an operator of."""
        return {name for name, role in self.roles.items() if role == "operator"}

    def sees_entry(self, entry: AuditEntry, tenants: Mapping[str, Tenant]) -> bool:
        """Whether it reads an audit entry: an admin every one, an operator the mirror's (it runs
        it), the catalog's of the models it runs, and the tenants' it operates."""
        if self.admin:
            return True
        if entry.area == "mirror":
            return bool(self.operates)
        if entry.area == "catalog":
            return self.runs_model(entry.subject, tenants)
        return entry.tenant in self.operates

    def key_to_make(self, ask: KeyCreate) -> KeyCreate:
        """The key it may make of `ask`: an admin any; anyone else a key (not an admin's) of a
        tenant it has a role in, in that tenant's project (named after it), owned by itself (an
        operator may also make its tenants' service accounts: no owner). 403 saying why not."""
        if self.admin:
            return ask
        if ask.admin:
            raise Forbidden("Only an admin makes admin keys.")
        role = self.roles.get(ask.tenant)
        if role is None:
            raise Forbidden(f"You have no role in tenant '{ask.tenant}'; make keys in {', '.join(sorted(self.roles))}.")
        if ask.project not in (_DEFAULT_PROJECT, ask.tenant):
            raise Forbidden(
                f"Your keys in tenant '{ask.tenant}' belong to its project '{ask.tenant}'; leave 'project' out."
            )
        if ask.owner not in ("", self.name):
            raise Forbidden("You make keys of your own (or, an operator, your tenant's: no owner); leave 'owner' out.")
        owner = ask.owner if role == "operator" else self.name
        return msgspec.structs.replace(ask, owner=owner, project=ask.tenant)

    def as_key(self) -> KeyRecord:
        """What its requests from the console (the playground) count under: its own limits and
        usage, in its tenant."""
        return KeyRecord(name=self.name, created=0.0, admin=self.admin, tenant=self.tenant, owner=self.name)


def key_principal(key_id: str, key: KeyRecord) -> Principal:
    """An admin key signed in to the console."""
    return Principal(
        name=key.name, roles={key.tenant: "admin"} if key.admin else {key.tenant: "member"}, subject=key_id
    )


def user_principal(user: User) -> Principal:
    """A user signed in to the console."""
    return Principal(name=user.name, roles=dict(user.roles), subject=f"u-{user.name}")
