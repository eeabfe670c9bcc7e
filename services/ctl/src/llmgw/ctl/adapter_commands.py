"""`llmgw ctl model adapters NAME [add SOURCE... | remove ADAPTER...]`: a model's LoRA adapters
listed, attached and detached (the catalog checks each against the weights, the scheduler
replaces replicas one at a time)."""

from __future__ import annotations

import argparse

import msgspec
from nats.aio.client import Client

from llmgw.bus import call
from llmgw.ctl.changes import BY
from llmgw.ctl.sentences import said
from llmgw.ctl.tree import Verb, done, show
from llmgw.proto import Adapter, ModelEntry, ModelRef, SetAdapters, catalog
from llmgw.proto.catalog import adapter_name

__all__ = ["ADAPTERS", "adapters_change", "adapters_text"]


def adapters_change(args: argparse.Namespace) -> SetAdapters:
    """The change `adapters NAME add|remove ...` asks for, checked as the catalog will."""
    if not args.items:
        raise ValueError(f"say which: `adapters {args.name} {args.op} {'SOURCE' if args.op == 'add' else 'ADAPTER'}`")
    if args.op == "add":
        if args.as_name and len(args.items) > 1:
            raise ValueError("--as names one adapter: add the others each with its own --as, or without")
        add = [
            Adapter(name=args.as_name or adapter_name(s), source=s, scale=args.scale if args.scale is not None else 1.0)
            for s in args.items
        ]
        change = SetAdapters(name=args.name, by=BY, add=add, in_place=args.in_place, revision=args.revision)
    else:
        change = SetAdapters(name=args.name, by=BY, remove=args.items, in_place=args.in_place, revision=args.revision)
    return msgspec.convert(msgspec.to_builtins(change), SetAdapters)


def adapters_text(entry: ModelEntry) -> str:
    """A model's adapters, one a line, as clients ask for them."""
    m = entry.model
    if not m.adapters:
        return (
            f"{m.name} has no adapters; `llmgw ctl model adapters {m.name} add OWNER/REPO@COMMIT/FILE.gguf` adds one."
        )
    rows = [f"{m.name}:{a.name}  scale {a.scale:g}  {a.source}" for a in m.adapters]
    return "\n".join(rows)


async def _adapters(nc: Client, args: argparse.Namespace) -> int:
    if args.op is None:
        entry = await call(nc, catalog.MODEL_GET, ModelRef(name=args.name))
        return show(args, entry.model.adapters, adapters_text(entry))
    change = adapters_change(args)
    entry = await call(nc, catalog.MODEL_CHANGE, change)
    return done(args, entry, said(change, entry))


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the model")
    parser.add_argument("op", nargs="?", choices=["add", "remove"], help="add or remove; neither: list them")
    parser.add_argument(
        "items",
        nargs="*",
        metavar="SOURCE|ADAPTER",
        help="add: adapters' files on the mirror (OWNER/REPO@COMMIT/FILE.gguf); remove: their names or files",
    )
    parser.add_argument("--as", dest="as_name", metavar="ADAPTER", help="the name clients ask for (MODEL:ADAPTER)")
    parser.add_argument("--scale", type=float, metavar="S", help="how strongly it applies (0 < S <= 4; default 1)")
    parser.add_argument(
        "--in-place", action="store_true", help="stop each replica before its replacement starts (no room beside it)"
    )
    parser.add_argument("--revision", type=int, metavar="N", help="only if the model is still at revision N")


ADAPTERS = Verb(
    "adapters",
    "list, add or remove a model's LoRA adapters (clients ask for MODEL:ADAPTER)",
    "llmgw ctl model adapters qwen add acme/qwen-sql-lora@<commit>/sql.gguf --as sql",
    "the catalog checks each against the weights; replicas load the new set one at a time (a new scale "
    "alone restarts nothing)",
    _adapters,
    _arguments,
)
"""`llmgw ctl model adapters ...`."""
