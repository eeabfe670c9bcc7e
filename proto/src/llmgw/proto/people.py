"""People and tenants: users with a role in each tenant they belong to, tenants that keep their
keys, projects, usage and models apart, and the audit trail of who changed what. The router
keeps them (its `users` and `tenants` buckets, the `llmgw_audit` stream) and answers these
endpoints; `ctl`, the admin API and the console ask the same ones."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from llmgw.proto._endpoint import AdminRoute, Endpoint, Event
from llmgw.proto._types import Empty, Name, NonNegative

__all__ = [
    "AUDIT",
    "AUDIT_LOG",
    "DEFAULT_TENANT",
    "ENDPOINTS",
    "ROLES",
    "TENANT_LIST",
    "TENANT_PUT",
    "USER_CREATE",
    "USER_LIST",
    "USER_REMOVE",
    "USER_ROLE",
    "AuditEntry",
    "AuditLog",
    "AuditQuery",
    "GroupRole",
    "LdapSettings",
    "Role",
    "Tenant",
    "TenantList",
    "User",
    "UserCreate",
    "UserCreated",
    "UserList",
    "UserRef",
    "UserRole",
]

Role = Literal["admin", "operator", "member"]
"""admin: the whole fleet; operator: the models, mirror and fleet of its tenants; member: its own
keys and usage, and the models its tenant may use."""
ROLES: tuple[Role, ...] = ("admin", "operator", "member")
DEFAULT_TENANT = "default"
"""Where keys and projects made before tenants were land, and where a tenant not named is."""


class Tenant(Struct, kw_only=True):
    """A team's own space: its keys, projects and usage are its alone."""

    name: Name
    models: list[Name] = field(default_factory=list)
    """The models (or aliases) its members and keys may use; empty: every model."""
    created: float = 0.0
    by: str = ""


class User(Struct, kw_only=True):
    """A person who signs in (the users bucket, under the name; never the password)."""

    name: Name
    roles: dict[Name, Role] = field(default_factory=dict)
    """Tenant -> the role in it. An admin role anywhere makes a fleet admin."""
    password: str = ""
    """An argon2 hash of a local user's password; "": signs in only through the directory."""
    source: Literal["local", "ldap", "oidc"] = "local"
    disabled: bool = False
    created: float = 0.0
    by: str = ""


class GroupRole(Struct, kw_only=True):
    """A directory group's members get this role in this tenant."""

    group: str
    """The group's DN (compared without regard to case)."""
    tenant: Name
    role: Role


class LdapSettings(Struct, kw_only=True):
    """Signing in with an LDAP directory or Active Directory: the user found with a search made as
    `bind_dn`, its password checked by binding as it, its groups mapped to roles per tenant."""

    url: str
    """ldap://host:389 (StartTLS with `starttls`) or ldaps://host:636."""
    starttls: bool = False
    ca_file: str = ""
    """The CA that signed the directory's certificate (ldaps or StartTLS); "": the system's."""
    bind_dn: str = ""
    """Who searches ("": anonymously)."""
    bind_password_file: str = ""
    """A file (0600) holding that account's password: never in a message, a log or the config."""
    user_base: str
    user_filter: str = "(uid={name})"
    """`{name}`: the name signed in with, escaped. Active Directory:
    `(&(sAMAccountName={name})(!(userAccountControl:1.2.840.113556.1.4.803:=2)))` (disabled
    accounts left out); a filter is where a directory's disabled accounts are left out."""
    group_base: str = ""
    """Where groups are searched ("": `user_base`)."""
    group_filter: str = "(member={dn})"
    """`{dn}`: the user's DN, escaped. Active Directory: `(member:1.2.840.113556.1.4.1941:={dn})`."""
    groups: list[GroupRole] = field(default_factory=list)
    timeout_s: Annotated[float, Meta(gt=0, le=60)] = 5.0


class UserCreate(Struct, kw_only=True):
    """Make a local user (a password made and shown once where none is given)."""

    name: Name
    tenant: Name = DEFAULT_TENANT
    role: Role = "member"
    password: Annotated[str, Meta(max_length=1024)] = ""
    """At least 12 characters; "": one is made (shown once)."""
    by: str = ""


class UserCreated(Struct, kw_only=True):
    """A new user, and the password made for it ("" where one was given)."""

    user: User
    password: str = ""


class UserRef(Struct, kw_only=True):
    """One user by name."""

    name: Name
    by: str = ""


class UserRole(Struct, kw_only=True):
    """A user's role in a tenant set (None: taken out of that tenant)."""

    name: Name
    tenant: Name
    role: Role | None
    by: str = ""


class UserList(Struct, kw_only=True):
    """Users by name (never a password hash: those are left empty)."""

    users: list[User]


class TenantList(Struct, kw_only=True):
    """Every tenant."""

    tenants: list[Tenant]


class AuditEntry(Struct, kw_only=True):
    """One change, as the audit stream keeps it: who, when, to what, and what it was and became."""

    time: float
    who: str
    """The user, key or service that changed it (as the change named it)."""
    area: Literal["catalog", "mirror", "keys", "projects", "users", "tenants"]
    action: str
    subject: str
    """What was changed: a model's, key's, user's name..."""
    tenant: str = ""
    before: str = ""
    """What it was, as JSON ("": it did not exist); never a secret."""
    after: str = ""
    """What it became, as JSON ("": it is gone)."""


class AuditQuery(Struct, kw_only=True):
    """The latest changes, newest first."""

    limit: Annotated[int, Meta(ge=1, le=500)] = 100
    area: str = ""
    subject: str = ""
    tenant: str = ""
    before: NonNegative = 0
    """Older than this stream sequence (a page's `next`); 0: the latest."""


class AuditLog(Struct, kw_only=True):
    """A page of the audit trail, newest first."""

    entries: list[AuditEntry]
    next: NonNegative = 0


AUDIT = Event(
    "audit",
    AuditEntry,
    "A change to the catalog, the mirror, keys, projects, users or tenants (the audit stream keeps these).",
    ("area",),
    "any service",
)
USER_CREATE = Endpoint(
    "router", "user.create", UserCreate, UserCreated, "Make a local user.", admin=AdminRoute("POST", "/users", 201)
)
USER_LIST = Endpoint("router", "user.list", Empty, UserList, "Every user.", admin=AdminRoute("GET", "/users"))
USER_REMOVE = Endpoint(
    "router",
    "user.remove",
    UserRef,
    UserList,
    "Remove a user: its sessions and keys end at once.",
    admin=AdminRoute("DELETE", "/users/{name}"),
)
USER_ROLE = Endpoint(
    "router",
    "user.role",
    UserRole,
    User,
    "Set a user's role in a tenant (takes effect on its next request).",
    admin=AdminRoute("POST", "/users/{name}/role"),
)
TENANT_PUT = Endpoint(
    "router", "tenant.put", Tenant, Tenant, "Make a tenant or change it.", admin=AdminRoute("PUT", "/tenants/{name}")
)
TENANT_LIST = Endpoint("router", "tenant.list", Empty, TenantList, "Every tenant.", admin=AdminRoute("GET", "/tenants"))
AUDIT_LOG = Endpoint(
    "router",
    "audit.log",
    AuditQuery,
    AuditLog,
    "The latest changes, newest first: who changed what, when, from what to what.",
    timeout_s=30.0,
    admin=AdminRoute("GET", "/audit"),
)
ENDPOINTS = (USER_CREATE, USER_LIST, USER_REMOVE, USER_ROLE, TENANT_PUT, TENANT_LIST, AUDIT_LOG)
"""The people endpoints (the router answers them)."""
