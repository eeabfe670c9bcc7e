"""`llmgw ctl mirror search QUERY`: models on the Hub with their GGUF files, each file's header
read by range requests (no download), and the ways each would run on this fleet now; then the
commands that fetch one, or fetch and serve it."""

from __future__ import annotations

import argparse

from nats.aio.client import Client

from llmgw.bus import call
from llmgw.ctl.tree import Verb, show
from llmgw.proto import catalog
from llmgw.proto.catalog import ServePlan
from llmgw.proto.hub import HubFile, HubSearch, HubWays, fetch_glob

__all__ = ["SEARCH", "best_way", "found_text", "size_text"]


def size_text(n: int) -> str:
    """Bytes as a person reads them (MB, GB)."""
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def best_way(f: HubFile, plan: ServePlan | None, nodes: int) -> str:
    """The file's best way here now, as a person reads it."""
    if f.facts is None:
        return f.error
    if not nodes:
        return "no node registered: start an agent to see the ways"
    if plan is None or not plan.ways:
        return "no way here: " + ("; ".join(plan.warnings) if plan else "no node has the memory")
    from llmgw.modelplan import speed_note  # with gguf and numpy: not for every command's start

    w = plan.ways[0]
    where = f"{w.cards}x {w.card_class}" if w.cards else ("CPU" if w.nodes == 1 else f"CPUs of {w.nodes} nodes")
    if w.experts_on_cpu:
        where += f" + experts of {w.experts_on_cpu} layers on the CPU"
    fits = f"fits now on {', '.join(w.nodes_fit[:3])}" if w.nodes_fit else "no node has room for it now"
    return f"{where}, {speed_note(w.tokens_per_s)}; {fits} ({len(plan.ways)} way{'s' if len(plan.ways) > 1 else ''})"


def found_text(ways: HubWays) -> str:
    """Each model (downloads, likes), each of its files with its size, type and best way here, and
    the commands that take one."""
    found = ways.found
    if not found.models:
        return f"{found.endpoint} has no GGUF model matching that search."
    lines = []
    for m in found.models:
        gated = ", gated: accept its licence on the Hub and give the mirror a token" if m.gated else ""
        lines.append(f"{m.repo}  ({m.downloads} downloads, {m.likes} likes{gated})")
        for f in m.files:
            kind = f"{size_text(f.size)} {f.facts.quant}" if f.facts else ""
            parts = f" in {f.parts} parts" if f.parts > 1 else ""
            lines.append(f"  {f.path}  {kind}{parts}  {best_way(f, ways.plans.get(f.source), ways.nodes)}")
        lines.append("")
    first = next((f for m in found.models for f in m.files if ways.plans.get(f.source, None) and f.facts), None)
    lines.append(
        f"Read {found.headers_read} headers with {size_text(found.bytes_read)} of range requests, no file downloaded."
    )
    if first is not None:
        repo, _, rest = first.source.partition("@")
        commit, _, path = rest.partition("/")
        lines.append(f"Fetch one:           llmgw ctl mirror add {repo}@{commit} --include '{fetch_glob(path)}'")
        lines.append(f"Then serve it:       llmgw ctl model serve {first.source}")
    return "\n".join(lines)


async def _search(nc: Client, args: argparse.Namespace) -> int:
    ways = await call(nc, catalog.HUB_SEARCH, HubSearch(text=" ".join(args.query), limit=args.limit, files=args.files))
    return show(args, ways, found_text(ways))


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", metavar="QUERY", nargs="+", help="words in the repo's name (the Hub's search)")
    parser.add_argument("--limit", type=int, default=10, metavar="N", help="models at most (most downloaded first)")
    parser.add_argument("--files", type=int, default=40, metavar="N", help="files whose headers are read at most")


SEARCH = Verb(
    "search",
    "models on the Hub with their GGUF files and the ways each would run here now (headers read, nothing fetched)",
    "llmgw ctl mirror search qwen2.5 0.5b instruct",
    "`llmgw ctl mirror add` fetches one it lists; `llmgw ctl model serve` serves it once fetched",
    _search,
    _arguments,
)
"""`llmgw ctl mirror search QUERY`."""
