"""`llmgw ctl user ...`, `tenant ...` and `audit`: the people who sign in, the tenants that keep
their keys and usage apart, and who changed what (the router's people endpoints)."""

from __future__ import annotations

import argparse
import sys
import time

import msgspec
from nats.aio.client import Client

from llmgw.bus import call
from llmgw.ctl.access_commands import limit_arguments, limits_of
from llmgw.ctl.changes import BY
from llmgw.ctl.tables import limits_text, table
from llmgw.ctl.tree import Noun, Verb, done, emit, show
from llmgw.proto import Empty, people
from llmgw.proto.people import ROLES, AuditLog, AuditQuery, Tenant, UserCreate, UserRef, UserRole

__all__ = ["AUDIT", "TENANT", "USER", "audit_table"]


async def _create(nc: Client, args: argparse.Namespace) -> int:
    password = sys.stdin.readline().rstrip("\n") if args.password_stdin else ""
    ask = msgspec.convert(
        {"name": args.name, "tenant": args.tenant, "role": args.role, "password": password, "by": BY}, UserCreate
    )
    created = await call(nc, people.USER_CREATE, ask)
    if args.json:
        emit(created)
        return 0
    print(f"user {created.user.name}: {args.role} of {args.tenant}", file=sys.stderr)
    if created.password:
        print("its password, shown this once:", file=sys.stderr)
        print(created.password)
    return 0


def _create_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the user's name (how it signs in)")
    parser.add_argument("--tenant", default="default", help="its tenant (default: default)")
    parser.add_argument("--role", default="member", choices=ROLES, help="its role there (default: member)")
    parser.add_argument(
        "--password-stdin", action="store_true", help="read its password from stdin (else one is made and shown once)"
    )


async def _list(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, people.USER_LIST, Empty())
    rows = [
        (u.name, ", ".join(f"{r} of {t}" for t, r in sorted(u.roles.items())) or "-", u.source, u.disabled or "")
        for u in listed.users
    ]
    return show(args, listed, table(["USER", "ROLES", "SOURCE", "DISABLED"], rows))


async def _remove(nc: Client, args: argparse.Namespace) -> int:
    gone = await call(nc, people.USER_REMOVE, UserRef(name=args.name, by=BY))
    return done(args, gone, f"user {args.name} removed: its sessions and keys end at once")


async def _role(nc: Client, args: argparse.Namespace) -> int:
    role = None if args.role == "none" else args.role
    ask = msgspec.convert({"name": args.name, "tenant": args.tenant, "role": role, "by": BY}, UserRole)
    user = await call(nc, people.USER_ROLE, ask)
    said = f"user {user.name}: {args.role} of {args.tenant}" if role else f"user {user.name}: out of {args.tenant}"
    return done(args, user, f"{said}; it counts from its next request")


def _name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the user")


def _role_arguments(parser: argparse.ArgumentParser) -> None:
    _name(parser)
    parser.add_argument("tenant", metavar="TENANT", help="the tenant")
    parser.add_argument("role", metavar="ROLE", choices=[*ROLES, "none"], help="admin, operator, member, or none")


async def _tenant_put(nc: Client, args: argparse.Namespace) -> int:
    models = [m for m in (args.models or "").split(",") if m]
    fields = {"name": args.name, "models": models, "limits": msgspec.to_builtins(limits_of(args)), "by": BY}
    tenant = await call(nc, people.TENANT_PUT, msgspec.convert(fields, Tenant))
    said = f"{', '.join(tenant.models) or 'every model'}; its keys together: {limits_text(tenant.limits)}"
    return done(args, tenant, f"tenant {tenant.name}: {said}")


def _tenant_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the tenant")
    parser.add_argument("--models", metavar="A,B", help="the models its members and keys may use (default: all)")
    limit_arguments(parser)


async def _tenants(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, people.TENANT_LIST, Empty())
    rows = [(t.name, ", ".join(t.models) or "every model", limits_text(t.limits)) for t in listed.tenants]
    return show(args, listed, table(["TENANT", "MODELS", "LIMITS"], rows))


def audit_table(log: AuditLog) -> str:
    """`llmgw ctl audit`: the latest changes, newest first, and how to see older ones."""
    rows = [
        (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.time)), e.who, e.area, e.action, e.subject, e.tenant or "-")
        for e in log.entries
    ]
    older = f"\nolder: --before {log.next}" if log.next else ""
    return table(["TIME (UTC)", "WHO", "AREA", "ACTION", "WHAT", "TENANT"], rows) + older


async def _audit(nc: Client, args: argparse.Namespace) -> int:
    fields = {"limit": args.limit, "area": args.area, "subject": args.subject, "before": args.before}
    fields["tenant"] = args.tenant
    log = await call(nc, people.AUDIT_LOG, msgspec.convert(fields, AuditQuery))
    return show(args, log, audit_table(log))


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=50, metavar="N", help="how many (default 50, at most 500)")
    parser.add_argument("--area", default="", help="only this area's: " + ", ".join(people.AUDIT_AREAS))
    parser.add_argument("--subject", default="", metavar="NAME", help="only changes to this (a model, a user...)")
    parser.add_argument("--tenant", default="", metavar="NAME", help="only this tenant's changes")
    parser.add_argument("--before", type=int, default=0, metavar="SEQ", help="older ones (the 'older:' line says)")


_USER_LIST = Verb("list", "every user: roles per tenant, source", "llmgw ctl user list", "", _list)
USER = Noun(
    "user",
    "the people who sign in to the console, with a role in each tenant",
    (
        Verb(
            "create",
            "make a local user (its password made and shown once, or read from stdin)",
            "llmgw ctl user create ada --tenant research --role operator",
            "it signs in to the console with its name and password",
            _create,
            _create_arguments,
        ),
        _USER_LIST,
        Verb(
            "remove", "remove a user", "llmgw ctl user remove ada", "its sessions and keys end at once", _remove, _name
        ),
        Verb(
            "role",
            "set a user's role in a tenant (none: take it out)",
            "llmgw ctl user role ada research member",
            "it counts from the user's next request",
            _role,
            _role_arguments,
        ),
    ),
    default=_USER_LIST,
)
"""`llmgw ctl user create|list|remove|role`."""

_TENANT_LIST = Verb("list", "every tenant and the models it may use", "llmgw ctl tenant list", "", _tenants)
TENANT = Noun(
    "tenant",
    "tenants: keys, projects and usage kept apart, and the models each may use",
    (
        Verb(
            "put",
            "make a tenant or set the models it may use and the limits its keys share",
            "llmgw ctl tenant put research --models qwen,smollm2 --tokens-day 2000000",
            "its keys may use only those models, within its limits, at once on every router",
            _tenant_put,
            _tenant_arguments,
        ),
        _TENANT_LIST,
    ),
    default=_TENANT_LIST,
)
"""`llmgw ctl tenant put|list`."""

AUDIT = Verb(
    "audit",
    "who changed what, newest first: models, keys, users, tenants",
    "llmgw ctl audit --area catalog --subject qwen",
    "each change says what it was and became (`--json`)",
    _audit,
    _audit_arguments,
)
"""`llmgw ctl audit`."""
