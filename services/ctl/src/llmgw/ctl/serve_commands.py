"""`llmgw ctl model serve SOURCE`: put a mirrored file into service the way chosen, or with
`--plan` list every way it can run on the fleet now (the catalog keeps the rule that makes the
CPU a choice made on purpose, so this asks; it does not decide)."""

from __future__ import annotations

import argparse
import sys

from nats.aio.client import Client

from llmgw.bus import call
from llmgw.ctl.changes import BY
from llmgw.ctl.sentences import added
from llmgw.ctl.tree import Verb, done, show
from llmgw.proto import catalog
from llmgw.proto.catalog import ServeModel, ServePlan, ServePlanAsk, ServeWay

__all__ = ["SERVE", "plan_table"]


def _reply(seconds: float) -> str:
    if seconds < 90:
        return f"about {max(round(seconds), 1)} seconds"
    return f"about {round(seconds / 60)} minutes"


def _way(w: ServeWay) -> str:
    threads = f"{w.threads} thread{'s' if w.threads != 1 else ''}"
    if w.kind == "across-nodes":
        return f"CPU across {w.nodes} nodes, {threads} each"
    if not w.cards:
        return f"CPU, {threads}"
    if w.experts_on_cpu:
        return f"{w.cards}x {w.card_class}, experts of {w.experts_on_cpu} layers on the CPU ({threads})"
    return f"{w.cards}x {w.card_class}"


def _memory(w: ServeWay) -> str:
    per = "/card" if w.cards else ("/node" if w.nodes > 1 else "")
    host = f" + {w.host_mb / 1024:.1f} GiB host" if w.host_mb else ""
    parts = f"(weights {w.weights_mb}, KV {w.kv_mb}, buffers {w.buffers_mb} MiB)"
    return f"{w.memory_mb / 1024:.1f} GiB{per}{host} {parts}"


def _speed(w: ServeWay) -> str:
    if w.tokens_per_s <= 0:
        return "unknown"
    figure = f"{w.tokens_per_s:.1f}" if w.tokens_per_s < 10 else f"{w.tokens_per_s:.0f}"
    return f"~{figure}" + (" (calibrated)" if w.calibrated else "")


def _mark(w: ServeWay) -> str:
    return f"{w.mark}: 500 tokens in {_reply(w.reply_500_s)}" if w.mark else ""


def _verdict(w: ServeWay) -> str:
    if w.verdict_s <= 0:
        return "unknown"
    return f"{w.verdict_s:.2f} s (reads ~{w.prefill_tokens_per_s:.0f} tok/s)"


def plan_table(plan: ServePlan, judge: bool = False) -> str:
    """The ways as a table, best first: way, memory, fits on, more replicas, ~tok/s, mark; for a
    judge, how soon a verdict comes (a 256-token prompt read: prefill) instead of the mark."""
    trained = f", trained for {plan.trained_context}" if plan.trained_context else ""
    lines = [f"{plan.source}: context {plan.context}{trained}, {plan.slots} slots", ""]
    rows = [("WAY", "MEMORY", "FITS ON", "MORE", "~TOK/S", "VERDICT" if judge else "MARK")]
    for w in plan.ways:
        fits = ", ".join(w.nodes_fit) or f"none now ({w.node} when room is free)"
        last = _verdict(w) if judge else _mark(w)
        rows.append((_way(w), _memory(w), fits, str(w.more_replicas), _speed(w), last))
    if plan.ways:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(n) for c, n in zip(r, widths, strict=True)).rstrip() for r in rows]
    else:
        lines.append("No way to run it on this fleet.")
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


async def _serve(nc: Client, args: argparse.Namespace) -> int:
    if args.plan:
        ask = ServePlanAsk(source=args.source, context=args.context, cores=args.cores, judge=args.judge)
        plan = await call(nc, catalog.SERVE_PLAN, ask)
        return show(args, plan, plan_table(plan, args.judge))
    serve = ServeModel(
        source=args.source,
        name=args.name,
        cpu=args.cpu,
        gpus=args.gpus,
        cores=args.cores,
        context=args.context,
        replicas=args.replicas,
        cpu_anyway=args.cpu_anyway,
        judge=args.judge,
        by=BY,
    )
    entry = await call(nc, catalog.SERVE, serve)
    for warning in entry.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return done(args, entry, added(entry))


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="OWNER/REPO@COMMIT/FILE", help="a GGUF file the mirror holds, verified")
    parser.add_argument("--name", default="", help="the model's name (default: from the file's)")
    where = parser.add_argument_group("where it runs (default: the plan's best way; both: cards first, then CPUs)")
    where.add_argument("--cpu", action="store_true", help="a profile on the CPU")
    where.add_argument("--gpus", type=int, default=0, metavar="N", help="a profile on N cards a replica")
    parser.add_argument(
        "--cores", type=int, default=0, metavar="N", help="CPU threads a replica (default: half a node's)"
    )
    parser.add_argument(
        "--context", type=int, default=0, metavar="N", help="context in tokens (default: the model's, at most 8192)"
    )
    parser.add_argument("--replicas", default="", metavar="gpu=7,cpu=4", help="replicas per profile (default: one)")
    parser.add_argument(
        "--cpu-anyway", action="store_true", help="the CPU on purpose: even very slow, or while cards that fit are free"
    )
    parser.add_argument(
        "--judge", action="store_true", help="a guardrail judge: served on the CPU even where it writes very slowly"
    )
    parser.add_argument("--plan", action="store_true", help="list every way it can run now, best first; serve nothing")


SERVE = Verb(
    "serve",
    "serve a mirrored GGUF file: the way chosen becomes its profiles (--plan: the ways it can run)",
    "llmgw ctl model serve org/repo@<commit>/model.Q4_K_M.gguf --cpu --cores 4 --plan",
    "the scheduler places its replicas; `llmgw ctl models` shows them come up",
    _serve,
    _arguments,
)
"""`llmgw ctl model serve SOURCE [...]`."""
