"""`llmgw ctl mcp ...`: the company's MCP servers behind the gateway's one MCP endpoint (the
router's `mcp.*` endpoints): register a tenant's servers, say which tools its projects and keys
may use, and read the calls made."""

from __future__ import annotations

import argparse
import shlex
import time

from nats.aio.client import Client

from llmgw.bus import call
from llmgw.ctl.changes import BY
from llmgw.ctl.tables import table
from llmgw.ctl.tree import Noun, Verb, done, show, tenant_filter
from llmgw.proto import tools
from llmgw.proto.tools import CallQuery, McpServer, ServerRef, ToolQuery, ToolRule, ToolRuleRef

__all__ = ["MCP"]


def _tenant(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", default="default", help="its tenant (default: default)")


def _named(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the server (its tools are listed as NAME__TOOL)")
    _tenant(parser)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=" if what == "env" else ":")
        if not sep or not name.strip():
            raise SystemExit(f"--{what} {item!r}: give it as {'NAME=VALUE' if what == 'env' else 'Name: value'}")
        out[name.strip()] = value.strip()
    return out


async def _put(nc: Client, args: argparse.Namespace) -> int:
    if bool(args.url) == bool(args.program):
        raise SystemExit("give the server's --url (streamable HTTP) or the --command the router runs (stdio)")
    server = McpServer(
        name=args.name, tenant=args.tenant, transport="http" if args.url else "stdio", url=args.url or "",
        command=shlex.split(args.program or ""), env=_pairs(args.env, "env"), headers=_pairs(args.header, "header"),
        record_arguments=args.record_arguments, timeout_s=args.timeout, description=args.description, by=BY,
    )  # fmt: skip
    kept = await call(nc, tools.MCP_PUT, server)
    return done(args, kept, f"MCP server {kept.name} of {kept.tenant}: its tools are listed once it answers")


def _put_arguments(parser: argparse.ArgumentParser) -> None:
    _named(parser)
    parser.add_argument("--url", help="its streamable HTTP endpoint (https://tools.example/mcp)")
    parser.add_argument(
        "--command", dest="program", help="the program the router runs and talks to over stdio (quoted)"
    )
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="for a stdio program")
    parser.add_argument("--header", action="append", default=[], metavar="'Name: value'", help="sent to it, sealed")
    parser.add_argument("--record-arguments", action="store_true", help="keep each call's arguments in its record")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a call may take (default 30)")
    parser.add_argument("--description", default="")


async def _list(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, tools.MCP_LIST, ToolQuery(tenant=args.tenant))
    rows = []
    for s in listed.servers:
        state = listed.states.get(f"{s.tenant}.{s.name}")
        where = s.url if s.transport == "http" else shlex.join(s.command)
        said = (state.state, str(state.tools), state.reason or "-") if state else ("-", "-", "-")
        rows.append((s.tenant, s.name, s.transport, where, *said))
    return show(args, listed, table(["TENANT", "SERVER", "WAY", "WHERE", "STATE", "TOOLS", "WHY"], rows))


async def _remove(nc: Client, args: argparse.Namespace) -> int:
    gone = await call(nc, tools.MCP_REMOVE, ServerRef(name=args.name, tenant=args.tenant, by=BY))
    return done(args, gone, f"MCP server {args.name} of {args.tenant} removed: its tools are gone from every list")


def _where(parser: argparse.ArgumentParser) -> None:
    _tenant(parser)
    parser.add_argument("--project", default="", help="the rule is this project's")
    parser.add_argument("--key", default="", metavar="ID", help="the rule is this key's (its id)")


def _attached(args: argparse.Namespace) -> tuple[str, str]:
    if args.project and args.key:
        raise SystemExit("a rule is a project's or a key's: give --project or --key, not both")
    return ("project", args.project) if args.project else ("key", args.key) if args.key else ("tenant", "")


async def _allow(nc: Client, args: argparse.Namespace) -> int:
    applies_to, target = _attached(args)
    allow = args.allow or (["*"] if args.deny else [])  # --deny alone: everything else stays allowed
    rule = ToolRule(tenant=args.tenant, applies_to=applies_to, target=target, allow=allow, deny=args.deny, by=BY)  # type: ignore[arg-type]
    kept = await call(nc, tools.RULE_PUT, rule)
    said = ", ".join(kept.allow) or "no tool"
    return done(args, kept, f"{applies_to} {target or kept.tenant} may use {said}{_but(kept.deny)}")


def _but(deny: list[str]) -> str:
    return f", but not {', '.join(deny)}" if deny else ""


def _allow_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "allow", nargs="*", metavar="PATTERN", help="tools allowed ('files__*'; none, and no --deny: no tool)"
    )
    parser.add_argument("--deny", action="append", default=[], metavar="PATTERN", help="tools refused")
    _where(parser)


async def _rules(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, tools.RULE_LIST, ToolQuery(tenant=args.tenant))
    rows = [
        (r.tenant, r.applies_to, r.target or "-", ", ".join(r.allow) or "(none)", ", ".join(r.deny) or "-")
        for r in listed.rules
    ]
    return show(args, listed, table(["TENANT", "ON", "TARGET", "ALLOW", "DENY"], rows))


async def _unrule(nc: Client, args: argparse.Namespace) -> int:
    applies_to, target = _attached(args)
    ref = ToolRuleRef(tenant=args.tenant, applies_to=applies_to, target=target, by=BY)  # type: ignore[arg-type]
    gone = await call(nc, tools.RULE_REMOVE, ref)
    return done(args, gone, f"the {applies_to}'s rule removed: every tool of its tenant passes that level again")


async def _calls(nc: Client, args: argparse.Namespace) -> int:
    page = await call(nc, tools.MCP_CALLS, CallQuery(tenant=args.tenant, server=args.server, limit=args.limit))
    rows = [
        (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.time)),
            c.tenant,
            c.who,
            f"{c.server}__{c.tool}",
            f"{c.ms:.0f}",
            c.outcome,
            c.reason or "-",
        )  # fmt: skip
        for c in page.calls
    ]
    return show(args, page, table(["TIME", "TENANT", "WHO", "TOOL", "MS", "OUTCOME", "WHY"], rows))


def _calls_arguments(parser: argparse.ArgumentParser) -> None:
    tenant_filter(parser)
    parser.add_argument("--server", default="", help="only this server's")
    parser.add_argument("--limit", type=int, default=50, help="how many, newest first (default 50)")


_LIST = Verb("list", "MCP servers and how each is", "llmgw ctl mcp list", "", _list, tenant_filter)
MCP = Noun(
    "mcp",
    "the company's MCP tools through the gateway's /mcp endpoint, by tenant, project and key",
    (
        Verb(
            "put",
            "register an MCP server (streamable HTTP by --url, or stdio by --command) or change it",
            "llmgw ctl mcp put search --url https://search.corp/mcp --header 'Authorization: Bearer ...'",
            "llmgw ctl mcp list",
            _put,
            _put_arguments,
        ),
        _LIST,
        Verb("remove", "remove a server", "llmgw ctl mcp remove search", "", _remove, _named),
        Verb(
            "allow",
            "set which tools a tenant, --project or --key may use (patterns; none: no tool)",
            "llmgw ctl mcp allow 'search__*' --deny 'search__delete*' --project research",
            "llmgw ctl mcp rules",
            _allow,
            _allow_arguments,
        ),
        Verb("rules", "the tool rules", "llmgw ctl mcp rules", "", _rules, tenant_filter),
        Verb("unrule", "remove a rule", "llmgw ctl mcp unrule --key 0123456789abcdef", "", _unrule, _where),
        Verb("calls", "the tool calls made, newest first", "llmgw ctl mcp calls --server search", "", _calls,
             _calls_arguments),
    ),
    default=_LIST,
)  # fmt: skip
