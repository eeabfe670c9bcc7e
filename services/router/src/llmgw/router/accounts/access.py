"""Who may see and do what, without I/O: one rule every face asks (the console's pages now; the
admin API and the NATS endpoints as they take people's credentials).

A principal is a signed-in user (its role in each tenant) or an admin key (an admin of the
whole fleet). An admin role anywhere makes a fleet admin; an operator runs the mirror, the fleet
and the models its tenants may use (a tenant that names none may use every model) and sees its
tenants' keys and usage; a member sees its own keys and usage and asks the models its tenant may
use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from llmgw.proto import KeyRecord
from llmgw.proto.people import DEFAULT_TENANT, Role, Tenant, User

__all__ = ["MEMBER_PAGES", "OPERATOR_PAGES", "Principal", "key_principal", "user_principal"]

MEMBER_PAGES = ("playground", "keys", "usage", "requests")
"""The console pages a member opens."""
OPERATOR_PAGES = (
    "dashboard",
    "models",
    "serve",
    "playground",
    "mirror",
    "fleet",
    "keys",
    "usage",
    "requests",
    "audit",
    "guard",
)
"""The console pages an operator opens; an admin opens every page."""


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
