"""Signing in with an LDAP directory (OpenLDAP, Active Directory), with ldap3: the user found by
a search made as the service account (the name escaped: no filter can be injected through it),
its password checked by binding as it, its groups searched and mapped to a role per tenant.
Blocking: callers run it in a thread. ldap3 is imported when a directory is first asked: a
router none is set for does not spend its 0.2 s of CPU at start."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from llmgw.proto.people import ROLES, GroupRole, LdapSettings, Role

if TYPE_CHECKING:
    from ldap3 import Connection, Server

__all__ = ["DirectoryError", "Found", "best_roles", "find_user", "try_settings"]

_RANK = {role: i for i, role in enumerate(reversed(ROLES))}


class DirectoryError(Exception):
    """The directory could not be asked (unreachable, the service account refused, TLS): said plainly."""


class Found(NamedTuple):
    """A user the directory knows, whose password bound: its DN, groups and the roles they map to."""

    dn: str
    groups: list[str]
    roles: dict[str, Role]


def _server(s: LdapSettings) -> Server:
    from ldap3 import NONE, Server, Tls

    tls = Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=s.ca_file or None)
    return Server(s.url, connect_timeout=s.timeout_s, get_info=NONE, tls=tls)


def _connect(s: LdapSettings, user: str, password: str) -> Connection:
    """A connection bound as `user` (StartTLS first where set); DirectoryError where it cannot be made."""
    from ldap3 import Connection
    from ldap3.core.exceptions import LDAPException

    try:
        conn = Connection(
            _server(s), user=user or None, password=password or None, receive_timeout=max(1, round(s.timeout_s))
        )  # whole seconds: ldap3 packs it
        conn.open()
        if s.starttls and not conn.start_tls():
            raise DirectoryError(f"{s.url} refused StartTLS: {conn.result.get('description', '')}")
        if not conn.bind():
            raise DirectoryError(f"binding as {user or 'anonymous'} was refused ({conn.result.get('description', '')})")
    except LDAPException as exc:
        raise DirectoryError(f"{s.url}: {exc}") from None
    return conn


def _service(s: LdapSettings) -> Connection:
    """Bound as the service account: its password given (unsealed), else read from its file."""
    password = s.bind_password or (Path(s.bind_password_file).read_text().strip() if s.bind_password_file else "")
    return _connect(s, s.bind_dn, password)


def _search(conn: Connection, base: str, query: str, size_limit: int = 0) -> list[str]:
    """The DNs under `base` that `query` matches (a subtree search)."""
    from ldap3 import SUBTREE

    conn.search(base, query, SUBTREE, attributes=[], size_limit=size_limit)
    return [e.entry_dn for e in conn.entries]


def _escaped(value: str) -> str:
    """`value` as a filter may hold it: no filter can be injected through it."""
    from ldap3.utils.conv import escape_filter_chars

    return escape_filter_chars(value)


def _groups(s: LdapSettings, conn: Connection, dn: str) -> list[str]:
    return _search(conn, s.group_base or s.user_base, s.group_filter.format(dn=_escaped(dn)))


def best_roles(mapping: list[GroupRole], groups: list[str]) -> dict[str, Role]:
    """The highest role each tenant gets from the groups held that `mapping` maps (compared
    without regard to case): a directory's groups, or a provider's groups claim."""
    held = {g.lower() for g in groups}
    roles: dict[str, Role] = {}
    for mapped in mapping:
        if mapped.group.lower() in held and _RANK[mapped.role] > _RANK.get(roles.get(mapped.tenant, ""), -1):
            roles[mapped.tenant] = mapped.role
    return roles


def find_user(s: LdapSettings, name: str, password: str) -> Found | None:
    """The directory's user `name` where `password` binds as it (None: no such user, more than one,
    or a wrong password: the caller says the same for each); DirectoryError where the directory
    cannot be asked."""
    if not password:  # an empty password is an anonymous bind, which "succeeds"
        return None
    with _service(s) as conn:
        users = _search(conn, s.user_base, s.user_filter.format(name=_escaped(name)))
        if len(users) != 1:
            return None
        dn = users[0]
        try:
            _connect(s, dn, password).unbind()
        except DirectoryError:
            return None
        groups = _groups(s, conn, dn)
    return Found(dn=dn, groups=groups, roles=best_roles(s.groups, groups))


def try_settings(s: LdapSettings, name: str = "") -> str:
    """What settings do, in one sentence (an admin tries them before they are kept): the service
    account's bind, and with `name` that user's DN and groups. DirectoryError where it fails."""
    who = s.bind_dn or "anonymous"
    with _service(s) as conn:
        if not name:
            entries = _search(conn, s.group_base or s.user_base, "(objectClass=*)", size_limit=1000)
            return f"bind as {who} worked; {len(entries)} entries under {s.group_base or s.user_base}"
        users = _search(conn, s.user_base, s.user_filter.format(name=_escaped(name)))
        if len(users) != 1:
            return f"bind as {who} worked; {len(users)} users match '{name}' (one is needed)"
        dn = users[0]
        groups = _groups(s, conn, dn)
    roles = (
        ", ".join(f"{r} of {t}" for t, r in sorted(best_roles(s.groups, groups).items()))
        or "no role (no group is mapped)"
    )
    return f"bind as {who} worked; {name} is {dn}, in {len(groups)} groups: {roles}"
