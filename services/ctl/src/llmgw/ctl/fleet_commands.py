"""`llmgw ctl replica list`, `llmgw ctl weights collect` and `llmgw ctl model plan`: the fleet's
replicas, its cached weights, and the ways a model would run on its nodes."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from nats.aio.client import Client

from llmgw.bus import BusError, call, call_all
from llmgw.ctl.tables import replica_rows, replicas_table, table
from llmgw.ctl.tree import Noun, Verb, show
from llmgw.proto import Empty, FileInfo, FileRef, WeightsCollect, agent, catalog, mirror, scheduler

__all__ = ["NODES", "PLAN", "REPLICA", "WEIGHTS", "gguf_files"]


async def _replicas(nc: Client, args: argparse.Namespace) -> int:
    replicas = await call(nc, scheduler.REPLICA_LIST, Empty())
    return show(args, replica_rows(replicas), replicas_table(replicas))


async def _collect(nc: Client, args: argparse.Namespace) -> int:
    """Every node deletes the cached weights no model in the catalog uses."""
    listed = await call(nc, catalog.MODEL_LIST, Empty())
    keep = sorted({source for e in listed.models for source in e.model.files()})
    answers = await call_all(nc, agent.WEIGHTS_COLLECT, WeightsCollect(keep=keep), window_s=3.0)
    if not answers:
        print("No agent answered: no node to collect on.", file=sys.stderr)
        return 1
    lines = []
    for a in answers:
        if isinstance(a, BusError):
            print(f"an agent failed: {a.message}", file=sys.stderr)
        else:
            lines.append(f"{a.where}: deleted {', '.join(a.deleted)}" if a.deleted else f"{a.where}: nothing unused")
    return show(args, [a for a in answers if not isinstance(a, BusError)], "\n".join(lines))


async def _files_to_plan(nc: Client, target: str) -> list[str]:
    """Where the GGUF files of `target` are read from: itself (a file or URL), the mirror's URL of
    one source, or every GGUF file of a repository the mirror holds (the first part of a split one)."""
    if target.startswith(("http://", "https://")) or Path(target).exists():
        return [target]
    if target.count("/") != 1:
        return [(await call(nc, mirror.FILE_STAT, FileRef(source=target))).url]
    held = await call(nc, mirror.FILE_LIST, Empty())
    wheres = [f.url for f in gguf_files(held.files, target)]
    if not wheres:
        raise ValueError(
            f"the mirror holds no GGUF file under '{target}' (`llmgw ctl mirror list` shows what it holds)"
        )
    return wheres


def gguf_files(files: list[FileInfo], repo: str) -> list[FileInfo]:
    """The GGUF models among `files` of `repo` ('OWNER/REPO', at every commit held, or
    'OWNER/REPO@COMMIT'): each file, or a split model's first part."""
    return [
        f
        for f in files
        if f.source.startswith((repo + "/", repo + "@") if "@" not in repo else (repo + "/",))
        and f.source.endswith(".gguf")
        and ("-of-" not in f.source or "-00001-of-" in f.source)
    ]


async def _plan(nc: Client, args: argparse.Namespace) -> int:
    """The ways to run a model on the fleet's nodes, with their measured memory bandwidth."""
    from llmgw.ctl.plan import make_plan, plan_text
    from llmgw.gguf import GGUFError
    from llmgw.modelplan import node_facts

    wheres = await _files_to_plan(nc, args.target)
    listed = await call(nc, scheduler.NODE_LIST, Empty())
    if not listed.nodes:
        raise ValueError("no node has registered with the scheduler: start an agent (`llmgw service agent`)")
    try:
        plan = await asyncio.to_thread(
            make_plan, wheres, [node_facts(n) for n in listed.nodes], args.context, args.threads
        )
    except GGUFError as exc:
        raise ValueError(str(exc)) from None
    return show(args, plan, plan_text(plan))


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar="FILE|URL|OWNER/REPO[/FILE]", help="a GGUF file, a URL, or what the mirror holds"
    )
    parser.add_argument("--context", type=int, help="the context length (default: the model's, at most 8192)")
    parser.add_argument("--threads", type=int, help="CPU threads a replica gets (default: half a node's)")


PLAN = Verb(
    "plan",
    "the ways to run a model on the fleet's nodes: memory, speed, the best",
    "llmgw ctl model plan Qwen/Qwen2.5-0.5B-Instruct-GGUF",
    "put the way you choose in a model file and `llmgw ctl model add` it",
    _plan,
    _plan_arguments,
)
"""`llmgw ctl model plan TARGET`."""


async def _nodes(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, scheduler.NODE_LIST, Empty())
    rows = []
    for n in listed.nodes:
        health = listed.health.get(n.node)
        cards = ", ".join(f"{g.name} {g.memory_total_mb:,} MiB" for g in n.gpus) or "-"
        memory = f"{n.memory_available_mb:,}/{n.memory_total_mb:,}"
        rows.append((n.node, health.state if health else "-", n.hostname, n.cpus, memory, cards))
    return show(args, listed, table(["NODE", "STATE", "HOST", "CPUS", "MIB FREE/TOTAL", "CARDS"], rows))


NODES = Verb(
    "nodes",
    "the nodes the scheduler knows: state, host, cores, memory, cards",
    "llmgw ctl nodes",
    "a machine that joined (`llmgw node join`) is here once its agent registered",
    _nodes,
)
"""`llmgw ctl nodes`."""

_REPLICA_LIST = Verb(
    "list",
    "every replica: node, model, profile, state, URL, and why it failed",
    "llmgw ctl replica list --json",
    "a replica goes pending, fetching, starting, ready (or failed, with the engine's last lines)",
    _replicas,
)
REPLICA = Noun("replica", "the replicas the scheduler placed", (_REPLICA_LIST,), default=_REPLICA_LIST)
"""`llmgw ctl replica [list]`."""

_COLLECT = Verb(
    "collect",
    "every node deletes the cached weights no model in the catalog uses",
    "llmgw ctl weights collect",
    "a node fetches them again from the mirror if a model needs them later",
    _collect,
)


def _weights_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--collect", dest="run", action="store_const", const=_collect, help="the same as `collect`")


WEIGHTS = Noun("weights", "the weights cached on the nodes", (_COLLECT,), flags=_weights_flags)
"""`llmgw ctl weights collect` (or `--collect`)."""
