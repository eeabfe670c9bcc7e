"""`llmgw ctl key ...`, `project ...` and `usage`: the router's keys, projects and what they used."""

from __future__ import annotations

import argparse
import sys
import time

import msgspec
from nats.aio.client import Client

from llmgw.bus import call
from llmgw.ctl.changes import BY
from llmgw.ctl.tables import keys_table, limits_text, requests_table, usage_table
from llmgw.ctl.tree import Noun, Verb, done, emit, show
from llmgw.proto import Empty, KeyCreate, KeyRef, Limits, Project, RequestLogAsk, UsageQuery, router, usage_order

__all__ = ["KEY", "PROJECT", "REQUESTS", "USAGE", "limit_arguments", "limits_of"]

_LIMITS = (
    ("rpm", "requests_per_minute", "requests a minute"),
    ("tpm", "tokens_per_minute", "tokens a minute"),
    ("concurrent", "concurrent", "requests at once"),
    ("tokens-day", "tokens_per_day", "tokens a UTC day"),
    ("tokens-month", "tokens_per_month", "tokens a UTC month"),
)


def limits_of(args: argparse.Namespace) -> Limits:
    """The limits the `limit_arguments` flags give (a flag not given: no limit)."""
    return Limits(**{field: getattr(args, flag.replace("-", "_")) for flag, field, _ in _LIMITS})


def limit_arguments(parser: argparse.ArgumentParser) -> None:
    """`--rpm`... one flag per limit (a key's, a project's, a tenant's)."""
    for flag, _, what in _LIMITS:
        parser.add_argument(f"--{flag}", type=int, metavar="N", help=f"at most this many {what}")


async def _create(nc: Client, args: argparse.Namespace) -> int:
    ask = msgspec.convert(
        {
            "name": args.name,
            "admin": args.admin,
            "project": args.project,
            "tenant": args.tenant,
            "owner": args.owner,
            "expires_in_s": args.expires_days * 86400 if args.expires_days else None,
            "models": [m for m in (args.models or "").split(",") if m],
            "limits": msgspec.to_builtins(limits_of(args)),
            "by": BY,
        },
        KeyCreate,
    )
    created = await call(nc, router.KEY_CREATE, ask)
    if args.json:
        emit(created)
        return 0
    print(f"key {created.id} ({created.name}); it is shown this once:", file=sys.stderr)
    print(created.key)
    return 0


def _create_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="what the key is for")
    parser.add_argument("--project", default="default", help="its project, whose limits it shares (default: default)")
    parser.add_argument("--tenant", default="default", help="its tenant (default: default)")
    parser.add_argument("--owner", default="", metavar="USER", help="the user it belongs to (default: none)")
    parser.add_argument("--models", metavar="A,B", help="the models it may use, comma-separated (default: all)")
    parser.add_argument("--admin", action="store_true", help="it may use the admin API")
    parser.add_argument("--expires-days", type=float, metavar="D", help="days until it stops working (default: never)")
    limit_arguments(parser)


async def _list(nc: Client, args: argparse.Namespace) -> int:
    keys = await call(nc, router.KEY_LIST, Empty())
    return show(args, keys, keys_table(keys))


async def _revoke(nc: Client, args: argparse.Namespace) -> int:
    keys = await call(nc, router.KEY_REVOKE, msgspec.convert({"id": args.id, "by": BY}, KeyRef))
    return done(args, keys, f"key {args.id} revoked: it stops working at once on every router")


def _revoke_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="the key's id (16 hex digits, as `llmgw ctl key list` shows)")


async def _project(nc: Client, args: argparse.Namespace) -> int:
    project = await call(nc, router.PROJECT_PUT, Project(name=args.name, limits=limits_of(args), by=BY))
    return done(args, project, f"project {project.name}: {limits_text(project.limits)}")


def _project_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the project")
    limit_arguments(parser)


async def _usage(nc: Client, args: argparse.Namespace) -> int:
    query = UsageQuery(since=time.time() - args.since_hours * 3600, group_by=args.by)
    report = await call(nc, router.USAGE_SUM, query)  # every page of rows, joined
    report.rows = usage_order(report.rows)  # pages come by bucket and group: biggest first again
    return show(args, report, usage_table(report, args.by))


def _usage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since-hours", type=float, default=24.0, metavar="H", help="the last H hours (default 24)")
    groups = ["model", "project", "key", "replica", "tenant"]
    parser.add_argument("--by", default="model", choices=groups, help="one row per")


async def _requests(nc: Client, args: argparse.Namespace) -> int:
    ask = _checked_ask(args)
    log = await call(nc, router.REQUEST_LOG, ask)
    return show(args, log, requests_table(log))


def _checked_ask(args: argparse.Namespace) -> RequestLogAsk:
    fields = {"limit": args.limit, "model": args.model, "key": args.key, "errors": args.errors, "before": args.before}
    return msgspec.convert(fields, RequestLogAsk)


def _requests_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=50, metavar="N", help="how many (default 50, at most 500)")
    parser.add_argument("--model", default="", help="only this model's")
    parser.add_argument("--key", default="", metavar="ID", help="only this key's (its id, as `key list` shows it)")
    parser.add_argument("--errors", action="store_true", help="only those that did not end with a 200")
    parser.add_argument("--before", type=int, default=0, metavar="SEQ", help="older ones (the 'older:' line says)")


_KEY_LIST = Verb(
    "list",
    "every key: id, name, project, models, limits, expiry (never the key itself)",
    "llmgw ctl key list",
    "`llmgw ctl key revoke ID` ends one",
    _list,
)
KEY = Noun(
    "key",
    "the API keys clients use",
    (
        Verb(
            "create",
            "make a key (printed once, stored as its hash)",
            "llmgw ctl key create ci --project builds --models qwen2.5-0.5b --rpm 60 --tokens-day 200000",
            "give it to its user: `Authorization: Bearer KEY`; a request over a limit gets a 429 naming it",
            _create,
            _create_arguments,
        ),
        _KEY_LIST,
        Verb(
            "revoke",
            "end a key",
            "llmgw ctl key revoke 0123456789abcdef",
            "it stops working at once on every router",
            _revoke,
            _revoke_arguments,
        ),
    ),
    default=_KEY_LIST,
)
"""`llmgw ctl key create|list|revoke`."""

PROJECT = Noun(
    "project",
    "projects: limits that all of their keys share",
    (
        Verb(
            "put",
            "create a project or set its limits",
            "llmgw ctl project put builds --tokens-month 5000000",
            "every key of the project counts against them together, on every router",
            _project,
            _project_arguments,
            ("add",),
        ),
    ),
)
"""`llmgw ctl project put|add NAME`."""

USAGE = Verb(
    "usage",
    "requests, errors and tokens (prompt, cached, completion) over the last hours",
    "llmgw ctl usage --by project --since-hours 24",
    "`--by key` or `--by replica` for another cut",
    _usage,
    _usage_arguments,
)
"""`llmgw ctl usage`."""

REQUESTS = Verb(
    "requests",
    "the latest requests, newest first: when, key, model, replica, status, tokens, TTFT, duration",
    "llmgw ctl requests --model qwen --errors",
    "prompts and answers are never kept; `llmgw ctl usage` sums them",
    _requests,
    _requests_arguments,
)
"""`llmgw ctl requests`."""
