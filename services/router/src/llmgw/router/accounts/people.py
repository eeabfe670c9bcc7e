"""Users and tenants, kept in the router's `users` and `tenants` buckets (every router watches
them): local users' passwords hashed with argon2, never stored or shown otherwise; a user
removed takes its keys with it; a role changed counts from the next request (sessions read the
user again each time). Signing in is slowed after wrong passwords: `LOCK_AFTER` in a row lock
the name for a while that doubles with each more, said as such. Every change is audited."""

from __future__ import annotations

import asyncio
import math
import secrets
import time

import msgspec
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from llmgw.bus import BadRequest, Conflict, Context, KvTable, NotFound, get_logger
from llmgw.proto import BUCKETS, Empty, KeyRecord
from llmgw.proto import people as people_api
from llmgw.proto.errors import BusError
from llmgw.proto.people import (
    DEFAULT_TENANT,
    AuditEntry,
    AuditLog,
    AuditQuery,
    LdapSettings,
    OidcSettings,
    Tenant,
    TenantList,
    User,
    UserCreate,
    UserCreated,
    UserList,
    UserRef,
    UserRole,
)
from llmgw.router.accounts.audit import Audit
from llmgw.router.accounts.ldap import DirectoryError, find_user
from llmgw.router.accounts.oidc import who
from llmgw.router.accounts.signin import SignIn

__all__ = ["LEAST_PASSWORD", "LOCK_AFTER", "LOCK_S", "Locked", "People", "SignInRefused"]

LOCK_AFTER = 5
"""Wrong passwords in a row before a name is locked for a while."""
LOCK_S = 30.0
"""The first lock; each wrong password after doubles it, up to `LOCK_MOST_S`."""
LOCK_MOST_S = 900.0
LEAST_PASSWORD = 12
"""Characters a password given for a local user has at least."""


class SignInRefused(BusError):
    """A name and password that do not sign in (said the same way whichever was wrong)."""

    code = "401"


class DirectoryDown(BusError):
    """The directory users sign in with did not answer."""

    code = "503"


class Locked(BusError):
    """Too many wrong passwords in a row for a name: it waits `wait_s`."""

    code = "429"

    def __init__(self, message: str, wait_s: float) -> None:
        super().__init__(message)
        self.wait_s = wait_s


class People:
    """Users and tenants; signing in."""

    def __init__(
        self,
        users: KvTable[User],
        tenants: KvTable[Tenant],
        keys: KvTable[KeyRecord],
        audit: Audit,
        signin: SignIn | None = None,
    ) -> None:
        self.users, self.tenants, self.keys, self.audit = users, tenants, keys, audit
        self.signin = signin
        """The directory and provider people not made here sign in with (None: local users only)."""
        self.hasher = PasswordHasher()
        self.log = get_logger("router")
        self.failures: dict[str, tuple[int, float]] = {}
        """Name -> wrong passwords in a row, and until when it is locked (on this router)."""
        self._dummy = self.hasher.hash(secrets.token_hex(16))
        """Checked against for a name that does not exist, so both take as long."""

    @classmethod
    async def open(
        cls, js: JetStreamContext, keys: KvTable[KeyRecord], audit: Audit, signin: SignIn | None = None
    ) -> People:
        """Watch the users and tenants buckets."""
        users = await KvTable.open(js, BUCKETS["users"], User)
        tenants = await KvTable.open(js, BUCKETS["tenants"], Tenant)
        return cls(users, tenants, keys, audit, signin)

    @property
    def ldap(self) -> LdapSettings | None:
        """The directory users not made here sign in with (None: none)."""
        return self.signin.ldap if self.signin is not None else None

    async def serve(self, ctx: Context) -> None:
        """Answer the people endpoints (`llmgw ctl user|tenant|audit`, the admin API)."""
        await ctx.serve(people_api.USER_CREATE, self.create_user)
        await ctx.serve(people_api.USER_LIST, self.list_users)
        await ctx.serve(people_api.USER_REMOVE, self.remove_user)
        await ctx.serve(people_api.USER_ROLE, self.set_role)
        await ctx.serve(people_api.TENANT_PUT, self.put_tenant)
        await ctx.serve(people_api.TENANT_LIST, self.list_tenants)
        await ctx.serve(people_api.AUDIT_LOG, self.audit_log)
        if self.signin is not None:
            await self.signin.serve(ctx)

    def stop(self) -> None:
        """Stop watching."""
        self.users.stop()
        self.tenants.stop()
        if self.signin is not None:
            self.signin.stop()

    # -- tenants -----------------------------------------------------------------------------------
    def tenant(self, name: str) -> Tenant:
        """A tenant as it is now (the default one exists unless made otherwise)."""
        return self.tenants.items.get(name) or Tenant(name=name)

    def known_tenant(self, name: str) -> None:
        """BadRequest naming how to make it, for a tenant there is not."""
        if name != DEFAULT_TENANT and name not in self.tenants.items:
            raise BadRequest(f"there is no tenant '{name}': `llmgw ctl tenant put {name}` makes it")

    async def put_tenant(self, tenant: Tenant) -> Tenant:
        """Make a tenant or change the models it may use."""
        was = self.tenants.items.get(tenant.name)
        tenant = msgspec.structs.replace(tenant, created=was.created if was else time.time())
        await self.tenants.kv.put(tenant.name, msgspec.json.encode(tenant))
        self.tenants.items[tenant.name] = tenant
        await self._audit(
            AuditEntry(time=0, who=tenant.by, area="tenants", action="put", subject=tenant.name, tenant=tenant.name),
            was,
            tenant,
        )
        return tenant

    async def list_tenants(self, _: Empty | None = None) -> TenantList:
        """Every tenant, the default one among them."""
        names = sorted({DEFAULT_TENANT, *self.tenants.items})
        return TenantList(tenants=[self.tenant(n) for n in names])

    # -- users -------------------------------------------------------------------------------------
    def user(self, name: str) -> User | None:
        """The user as it is now (None: there is none, or it is disabled)."""
        user = self.users.items.get(name)
        return user if user is not None and not user.disabled else None

    async def create_user(self, req: UserCreate) -> UserCreated:
        """A local user with a role in one tenant; its password made (and shown once) where none is given."""
        if req.name in self.users.items:
            raise Conflict(f"there is already a user '{req.name}': `llmgw ctl user role` changes its roles")
        self.known_tenant(req.tenant)
        if req.password and len(req.password) < LEAST_PASSWORD:
            raise BadRequest(f"a password has at least {LEAST_PASSWORD} characters; give a longer one, or none")
        made = "" if req.password else secrets.token_urlsafe(15)
        hashed = await asyncio.to_thread(self.hasher.hash, req.password or made)
        user = User(name=req.name, roles={req.tenant: req.role}, password=hashed, created=time.time(), by=req.by)
        try:
            await self.users.kv.create(user.name, msgspec.json.encode(user))
        except KeyWrongLastSequenceError:
            raise Conflict(f"there is already a user '{req.name}'") from None
        self.users.items[user.name] = user
        await self._audit(
            AuditEntry(time=0, who=req.by, area="users", action="create", subject=user.name, tenant=req.tenant),
            None,
            user,
        )
        return UserCreated(user=_shown(user), password=made)

    async def list_users(self, _: Empty | None = None) -> UserList:
        """Every user by name (no password hash)."""
        return UserList(users=[_shown(u) for _, u in sorted(self.users.items.items())])

    async def remove_user(self, ref: UserRef) -> UserList:
        """Remove a user: its sessions end at once (they read it each request) and so do its keys."""
        user = self.users.items.get(ref.name)
        if user is None:
            raise NotFound(f"there is no user '{ref.name}'; `llmgw ctl user list` shows them")
        await self.users.kv.delete(ref.name)
        self.users.items.pop(ref.name, None)
        for digest in [d for d, k in self.keys.items.items() if k.owner == ref.name]:
            await self.keys.kv.delete(digest)
            self.keys.items.pop(digest, None)
        await self._audit(
            AuditEntry(time=0, who=ref.by, area="users", action="remove", subject=ref.name, tenant=""), user, None
        )
        return UserList(users=[_shown(user)])

    async def set_role(self, req: UserRole) -> User:
        """A user's role in one tenant set, or taken away (None)."""
        user = self.users.items.get(req.name)
        if user is None:
            raise NotFound(f"there is no user '{req.name}'; `llmgw ctl user list` shows them")
        self.known_tenant(req.tenant)
        roles = {t: r for t, r in user.roles.items() if t != req.tenant}
        if req.role is not None:
            roles[req.tenant] = req.role
        changed = msgspec.structs.replace(user, roles=roles)
        await self.users.kv.put(user.name, msgspec.json.encode(changed))
        self.users.items[user.name] = changed
        await self._audit(
            AuditEntry(time=0, who=req.by, area="users", action="role", subject=user.name, tenant=req.tenant),
            user,
            changed,
        )
        return _shown(changed)

    async def sign_in(self, name: str, password: str, now: float) -> User:
        """The local user `name` is, where `password` is its own; SignInRefused (one message for a
        wrong name or password), Locked after `LOCK_AFTER` wrong ones in a row."""
        count, until = self.failures.get(name, (0, 0.0))
        if until > now:
            wait = math.ceil(until - now)
            raise Locked(
                f"too many wrong passwords for '{name}' in a row: signing in as it waits {wait} s more", until - now
            )
        user, ldap = self.user(name), self.ldap
        if (user is None or user.source == "ldap") and ldap is not None:
            user = await self._from_directory(ldap, name, password)
            ok = user is not None
        else:
            stored = user.password if user is not None and user.source == "local" else ""
            try:
                await asyncio.to_thread(self.hasher.verify, stored or self._dummy, password)
                ok = bool(stored)
            except (VerificationError, InvalidHashError):
                ok = False
        if not ok or user is None:
            count += 1
            wait = min(LOCK_S * 2 ** (count - LOCK_AFTER), LOCK_MOST_S) if count >= LOCK_AFTER else 0.0
            self.failures[name] = (count, now + wait)
            raise SignInRefused("that name and password do not sign in")
        self.failures.pop(name, None)
        return user

    async def _from_directory(self, ldap: LdapSettings, name: str, password: str) -> User | None:
        """The directory's user `name` where its password binds, its roles those its groups map
        to (recorded, and audited where they changed); None: no such user or a wrong password."""
        try:
            found = await asyncio.to_thread(find_user, ldap, name, password)
        except DirectoryError as exc:
            self.log.warning("the directory did not answer a sign-in", user=name, error=str(exc))
            raise DirectoryDown(
                "the company directory did not answer; try again, or ask an admin (the router's log says why)"
            ) from None
        if found is None:
            return None
        if not found.roles:
            raise SignInRefused(f"{name} is in the directory but in no group mapped to a tenant here: ask an admin")
        return await self._keep_signed_in(User(name=name, roles=found.roles, source="ldap"), f"directory ({ldap.url})")

    async def sign_in_provider(self, s: OidcSettings, claims: dict) -> User:
        """The user a provider's checked ID token names, its roles those its groups claim maps to;
        SignInRefused where it maps to none, or where its name is another's (a local user's, or
        one bound to another subject)."""
        name, roles = who(s, claims)
        subject = f"{claims['iss']} {claims['sub']}"
        was = self.users.items.get(name)
        if not name or (was is not None and (was.source != "oidc" or was.subject != subject)):
            self.log.warning("provider sign-in refused: the name is another user's", user=name)
            raise SignInRefused(f"the provider's user is named '{name}', which is another user's here: ask an admin")
        if not roles:
            raise SignInRefused(
                f"{name} signed in with the provider but is in no group mapped to a tenant: ask an admin"
            )
        if was is not None and was.disabled:
            raise SignInRefused(f"{name} is disabled here: ask an admin")
        return await self._keep_signed_in(User(name=name, roles=roles, source="oidc", subject=subject), s.issuer)

    async def _keep_signed_in(self, user: User, where: str) -> User:
        """A directory's or provider's user as it signs in: recorded where its roles changed (and
        audited), its first sign-in's time kept."""
        was = self.users.items.get(user.name)
        user = msgspec.structs.replace(user, created=was.created if was else time.time())
        if was is None or (was.roles, was.source, was.subject) != (user.roles, user.source, user.subject):
            await self.users.kv.put(user.name, msgspec.json.encode(user))
            self.users.items[user.name] = user
            change = AuditEntry(time=0, who=where, area="users", action="sign-in", subject=user.name)
            await self._audit(change, was, user)
        return user

    async def audit_log(self, query: AuditQuery) -> AuditLog:
        """The latest changes, newest first."""
        return await self.audit.read(query)

    async def _audit(self, change: AuditEntry, before: msgspec.Struct | None, after: msgspec.Struct | None) -> None:
        await self.audit.record(change, before, after)


def _shown(user: User) -> User:
    """A user as it is shown: never its password hash."""
    return msgspec.structs.replace(user, password="")
