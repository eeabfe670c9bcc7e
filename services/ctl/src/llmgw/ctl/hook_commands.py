"""`llmgw ctl hook ...`: the webhooks a tenant is told of the fleet's events with (the router's
hook endpoints): made with a secret shown once, tested ("how did it answer"), listed, removed,
and the notices that never got through."""

from __future__ import annotations

import argparse
import sys
import time

import msgspec
from nats.aio.client import Client

from llmgw.bus import call
from llmgw.ctl.changes import BY
from llmgw.ctl.tables import table
from llmgw.ctl.tree import Noun, Verb, done, show
from llmgw.proto import hooks
from llmgw.proto.hooks import EVENT_KINDS, Hook, HookQuery, HookRef

__all__ = ["HOOK"]


async def _put(nc: Client, args: argparse.Namespace) -> int:
    secret = sys.stdin.readline().rstrip("\n") if args.secret_stdin else ""
    events = [e for e in (args.events or ",".join(EVENT_KINDS)).split(",") if e]
    fields = {"name": args.name, "tenant": args.tenant, "url": args.url, "events": events, "secret": secret, "by": BY}
    try:
        hook = msgspec.convert(fields, Hook)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{exc}; events are {', '.join(EVENT_KINDS)}") from None
    shown = await call(nc, hooks.HOOK_PUT, hook)
    done(args, shown, f"hook {hook.name} of {hook.tenant}: {', '.join(hook.events)} to {hook.url}")
    if shown.secret:
        print("its signing secret, shown this once (X-Llmgw-Signature is HMAC-SHA256 under it):", file=sys.stderr)
        print(shown.secret)
    return 0


def _put_arguments(parser: argparse.ArgumentParser) -> None:
    _ref_arguments(parser)
    parser.add_argument("url", metavar="URL", help="where notices are posted (http:// or https://)")
    parser.add_argument("--events", metavar="A,B", help=f"which (default: all of {', '.join(EVENT_KINDS)})")
    parser.add_argument("--secret-stdin", action="store_true", help="read its signing secret from stdin (else made)")


def _ref_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the hook")
    parser.add_argument("--tenant", default="default", help="its tenant (default: default)")


async def _list(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, hooks.HOOK_LIST, HookQuery(tenant=args.tenant or ""))
    rows = [(h.tenant, h.name, h.url, ", ".join(h.events)) for h in listed.hooks]
    return show(args, listed, table(["TENANT", "HOOK", "URL", "EVENTS"], rows))


def _tenant_filter(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", default="", help="only this tenant's")


async def _remove(nc: Client, args: argparse.Namespace) -> int:
    gone = await call(nc, hooks.HOOK_REMOVE, HookRef(name=args.name, tenant=args.tenant, by=BY))
    return done(args, gone, f"hook {args.name} of {args.tenant} removed")


async def _test(nc: Client, args: argparse.Namespace) -> int:
    tried = await call(nc, hooks.HOOK_TEST, HookRef(name=args.name, tenant=args.tenant, by=BY), timeout=40.0)
    answer = f"it answered {tried.status} in {tried.ms} ms" if tried.status else f"no answer ({tried.ms} ms)"
    show(args, tried, f"{answer}: {tried.said or '(nothing)'}")
    return 0 if 200 <= tried.status < 300 else 1


async def _dead(nc: Client, args: argparse.Namespace) -> int:
    letters = await call(nc, hooks.HOOK_DEAD, HookQuery(tenant=args.tenant or ""), timeout=30.0)
    rows = [
        (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(d.time)), d.tenant, d.hook, d.notice.kind, d.tries, d.last)
        for d in letters.letters
    ]
    return show(args, letters, table(["TIME (UTC)", "TENANT", "HOOK", "EVENT", "TRIES", "LAST ANSWER"], rows))


_LIST = Verb("list", "the webhooks: tenant, URL, events", "llmgw ctl hook list", "", _list, _tenant_filter)
HOOK = Noun(
    "hook",
    "webhooks: a tenant told of replicas failing, models backing off or parked, nodes lost, fetches failing",
    (
        Verb(
            "put",
            "make a webhook or change it (its signing secret made and shown once)",
            "llmgw ctl hook put ops https://hooks.example.com/llmgw --events replica.failed,node.lost",
            "`llmgw ctl hook test ops` posts it a test notice and says how it answered",
            _put,
            _put_arguments,
        ),
        _LIST,
        Verb("test", "post a test notice: how the hook answered", "llmgw ctl hook test ops", "", _test, _ref_arguments),
        Verb("remove", "remove a webhook", "llmgw ctl hook remove ops", "", _remove, _ref_arguments),
        Verb("dead", "notices that never got through (kept 7 days)", "llmgw ctl hook dead", "", _dead, _tenant_filter),
    ),
    default=_LIST,
)
"""`llmgw ctl hook put|list|test|remove|dead`."""
