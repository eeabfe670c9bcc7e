"""`llmgw ctl guard ...`: guardrail policies (the router's guard endpoints): checks on what goes
in to a model and comes out, attached to a tenant, a project, a key or a model."""

from __future__ import annotations

import argparse

import msgspec
from nats.aio.client import Client

from llmgw.bus import call
from llmgw.ctl.changes import BY
from llmgw.ctl.tables import table
from llmgw.ctl.tree import Noun, Verb, done, show, tenant_filter
from llmgw.proto import guard
from llmgw.proto.guard import ENTITIES, Check, Policy, PolicyQuery, PolicyRef

__all__ = ["GUARD", "check_of", "check_text"]


def check_of(spec: str) -> Check:
    """`pii:ACTION[:ENTITY,...]`, `pattern:ACTION:LABEL:RE2` or `service[-open]:ACTION:URL`;
    ValueError saying the forms."""
    kind, _, rest = spec.partition(":")
    action, _, rest = rest.partition(":")
    try:
        if kind == "pii":
            entities = [e for e in rest.split(",") if e] or list(ENTITIES)
            return msgspec.convert({"kind": kind, "action": action or "redact", "entities": entities}, Check)
        if kind == "pattern":
            label, _, pattern = rest.partition(":")
            return msgspec.convert({"kind": kind, "action": action, "label": label, "pattern": pattern}, Check)
        if kind in ("judge", "judge-open"):
            model, _, fmt = rest.partition(":")
            fields = {"kind": "judge", "action": action, "judge": model, "judge_format": fmt or "qwen3guard"}
            return msgspec.convert({**fields, "on_error": "pass" if kind == "judge-open" else "block"}, Check)
        if kind in ("service", "service-open"):
            on_error = "pass" if kind == "service-open" else "block"
            return msgspec.convert({"kind": "service", "action": action, "url": rest, "on_error": on_error}, Check)
    except msgspec.ValidationError as exc:
        raise ValueError(f"check '{spec}': {exc}; {_FORMS}") from None
    raise ValueError(f"check '{spec}' is not one of the forms: {_FORMS}")


_FORMS = (
    "pii:ACTION[:ENTITY,...], pattern:ACTION:LABEL:RE2, judge:ACTION:MODEL[:qwen3guard|llamaguard] or "
    "service:ACTION:URL (judge-open, service-open: pass where it fails) (ACTION: block, redact or record; "
    f"ENTITY: {', '.join(ENTITIES)})"
)


def check_text(check: Check) -> str:
    """A check as `guard list` shows it (the form `--input` takes)."""
    if check.kind == "pii":
        return f"pii:{check.action}:{','.join(check.entities)}"
    if check.kind == "judge":
        return f"judge{'-open' if check.on_error == 'pass' else ''}:{check.action}:{check.judge}:{check.judge_format}"
    if check.kind == "service":
        return f"service{'-open' if check.on_error == 'pass' else ''}:{check.action}:{check.url}"
    return f"pattern:{check.action}:{check.label}:{check.pattern}"


async def _put(nc: Client, args: argparse.Namespace) -> int:
    fields = {
        "name": args.name,
        "tenant": args.tenant,
        "applies_to": args.applies_to,
        "target": args.target or "",
        "input": [msgspec.to_builtins(check_of(s)) for s in args.input],
        "output": [msgspec.to_builtins(check_of(s)) for s in args.output],
        "tools": args.tools,
        "by": BY,
    }
    try:
        policy = msgspec.convert(fields, Policy)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
    kept = await call(nc, guard.GUARD_PUT, policy)
    where = kept.applies_to if kept.applies_to == "tenant" else f"{kept.applies_to} {kept.target}"
    return done(
        args, kept, f"policy {kept.name} of {kept.tenant}: on {where}, {len(kept.input)} in, {len(kept.output)} out"
    )


def _put_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the policy")
    parser.add_argument("--tenant", default="default", help="its tenant (default: default)")
    parser.add_argument("--applies-to", default="tenant", choices=["tenant", "project", "key", "model"])
    parser.add_argument("--target", help="the project, key id or model it is attached to")
    parser.add_argument("--input", action="append", default=[], metavar="CHECK", help="a check of requests (repeat)")
    parser.add_argument("--output", action="append", default=[], metavar="CHECK", help="a check of answers (repeat)")
    parser.add_argument("--tools", action="store_true", help="check MCP tool calls' arguments and results too")


async def _list(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, guard.GUARD_LIST, PolicyQuery(tenant=args.tenant or ""))
    rows = [
        (
            p.tenant,
            p.name,
            p.applies_to if p.applies_to == "tenant" else f"{p.applies_to} {p.target}",
            "; ".join(check_text(c) for c in p.input) or "-",
            "; ".join(check_text(c) for c in p.output) or "-",
        )
        for p in listed.policies
    ]
    return show(args, listed, table(["TENANT", "POLICY", "ON", "INPUT", "OUTPUT"], rows))


async def _remove(nc: Client, args: argparse.Namespace) -> int:
    gone = await call(nc, guard.GUARD_REMOVE, PolicyRef(name=args.name, tenant=args.tenant, by=BY))
    return done(args, gone, f"policy {args.name} of {args.tenant} removed")


def _ref_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the policy")
    parser.add_argument("--tenant", default="default", help="its tenant (default: default)")


_LIST = Verb(
    "list", "guardrail policies: where each is attached, its checks", "llmgw ctl guard list", "", _list, tenant_filter
)
GUARD = Noun(
    "guard",
    "guardrails: personal data and secrets redacted (and put back), patterns blocked; per tenant, key or model",
    (
        Verb(
            "put",
            "make a policy or change it (the narrowest applies: key, project, tenant, model)",
            "llmgw ctl guard put pii --input pii:redact --input 'pattern:block:CODENAME:(?i)project falcon'",
            "requests are checked at once on every router; a blocked one gets 400 guardrail_blocked",
            _put,
            _put_arguments,
        ),
        _LIST,
        Verb("remove", "remove a policy", "llmgw ctl guard remove pii", "", _remove, _ref_arguments),
    ),
    default=_LIST,
)
"""`llmgw ctl guard put|list|remove`."""
