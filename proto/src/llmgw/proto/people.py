"""People and tenants: users with a role in each tenant they belong to, tenants that keep their
keys, projects, usage and models apart, and the audit trail of who changed what. The router
keeps them (its `users` and `tenants` buckets, the `llmgw_audit` stream) and answers these
endpoints; `ctl`, the admin API and the console ask the same ones."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from msgspec import Meta, Struct, field

from llmgw.proto._endpoint import AdminRoute, Endpoint, Event
from llmgw.proto._types import Empty, Name, NonNegative
from llmgw.proto.router import Limits

__all__ = [
    "AUDIT",
    "AUDIT_AREAS",
    "AUDIT_LOG",
    "DEFAULT_TENANT",
    "ENDPOINTS",
    "ROLES",
    "SIGNIN_PUT",
    "SIGNIN_SHOW",
    "SIGNIN_TRY",
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
    "OidcSettings",
    "Role",
    "SignInSettings",
    "SignInTried",
    "SignInTry",
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
AuditArea = Literal[
    "catalog",
    "mirror",
    "keys",
    "projects",
    "users",
    "tenants",
    "signin",
    "hooks",
    "guard",
    "knowledge",
    "tools",
    "providers",
]
AUDIT_AREAS: tuple[AuditArea, ...] = get_args(AuditArea)
"""What the audit trail records changes of."""
DEFAULT_TENANT = "default"
"""Where keys and projects made before tenants were land, and where a tenant not named is."""


class Tenant(Struct, kw_only=True):
    """A team's own space: its keys, projects and usage are its alone."""

    name: Name
    models: list[Name] = field(default_factory=list)
    """The models (or aliases) its members and keys may use; empty: every model."""
    limits: Limits = field(default_factory=Limits)
    """What all its keys together may use (beside each key's and project's own limits)."""
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
    subject: str = ""
    """A provider's user: its issuer and subject (`iss sub`), which no other may sign in as."""
    disabled: bool = False
    created: float = 0.0
    by: str = ""


class GroupRole(Struct, kw_only=True):
    """A directory group's members get this role in this tenant."""

    group: str
    """The group's DN, or a provider's group name (compared without regard to case)."""
    tenant: Name
    role: Role

    @classmethod
    def parse(cls, text: str) -> GroupRole:
        """`GROUP=TENANT:ROLE` (the role: member where left out); a DN holds '=' itself, so the
        last one splits. ValueError saying the form where it is not one."""
        group, _, target = text.strip().rpartition("=")
        tenant, _, role = target.strip().partition(":")
        if not group.strip() or not tenant.strip() or (role or "member").strip() not in ROLES:
            raise ValueError(f"'{text.strip()}' is not GROUP=TENANT:ROLE (a role is admin, operator or member)")
        return cls(group=group.strip(), tenant=tenant.strip(), role=(role or "member").strip())  # type: ignore[arg-type]


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
    """A file (0600) holding that account's password (the config file's way)."""
    bind_password: Annotated[str, Meta(max_length=1024)] = ""
    """That password given from the console or `ctl` (kept sealed under the fleet's secret, never
    shown back: "" in what is shown, and in a change "" keeps the one kept)."""
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


class OidcSettings(Struct, kw_only=True):
    """Signing in with an OpenID Connect provider (authorization code with PKCE, state and nonce;
    the ID token checked against the provider's keys), its claims mapped to roles per tenant."""

    issuer: str
    """The provider's issuer URL: its settings are read from `<issuer>/.well-known/openid-configuration`."""
    client_id: str
    client_secret: Annotated[str, Meta(max_length=1024)] = ""
    """Kept sealed under the fleet's secret, never shown back ("" in what is shown; in a change
    "" keeps the one kept)."""
    client_secret_file: str = ""
    """A file (0600) holding it (the config file's way)."""
    label: str = ""
    """What the sign-in button says after "Sign in with" ("": the issuer's host)."""
    scopes: list[str] = field(default_factory=lambda: ["openid", "profile", "email"])
    name_claim: str = "preferred_username"
    """The claim a user is named by (then `email`'s part before the @, then `sub`)."""
    groups_claim: str = "groups"
    """The claim listing the user's groups (or roles) that `groups` maps."""
    groups: list[GroupRole] = field(default_factory=list)
    timeout_s: Annotated[float, Meta(gt=0, le=60)] = 10.0


class SignInSettings(Struct, kw_only=True):
    """How people sign in besides local users: a directory, a provider, or both (None: not used).
    Kept by the router (the settings bucket); shown without their secrets."""

    ldap: LdapSettings | None = None
    oidc: OidcSettings | None = None
    secrets_kept: list[str] = field(default_factory=list)
    """Shown: which secrets are kept ("ldap.bind_password", "oidc.client_secret"); never their values."""
    by: str = ""


class SignInTry(Struct, kw_only=True):
    """Settings tried before they are kept: the directory bound and searched (with `name`, that
    user found and its groups mapped), the provider's discovery document and keys read."""

    settings: SignInSettings
    name: str = ""
    by: str = ""


class SignInTried(Struct, kw_only=True):
    """What trying each part said, one sentence each ("bind as X worked; 3 groups...")."""

    said: list[str]


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
    area: AuditArea
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
    admin=AdminRoute("GET", "/audit", least="operator"),
)
SIGNIN_SHOW = Endpoint(
    "router",
    "signin.show",
    Empty,
    SignInSettings,
    "How people sign in (directory, provider), without the secrets.",
    admin=AdminRoute("GET", "/signin"),
)
SIGNIN_TRY = Endpoint(
    "router",
    "signin.try",
    SignInTry,
    SignInTried,
    "Try sign-in settings without keeping them: what each part said.",
    timeout_s=30.0,
    admin=AdminRoute("POST", "/signin/try"),
)
SIGNIN_PUT = Endpoint(
    "router",
    "signin.put",
    SignInSettings,
    SignInTried,
    "Keep sign-in settings, tried first (refused, saying why, where a part fails).",
    timeout_s=30.0,
    admin=AdminRoute("PUT", "/signin"),
)
ENDPOINTS = (
    USER_CREATE,
    USER_LIST,
    USER_REMOVE,
    USER_ROLE,
    TENANT_PUT,
    TENANT_LIST,
    AUDIT_LOG,
    SIGNIN_SHOW,
    SIGNIN_TRY,
    SIGNIN_PUT,
)
"""The people endpoints (the router answers them)."""
