"""The `llmgw` command: `up`, `service NAME`, `plan`, `access`, and `ctl` for operators (see `tree`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from importlib.metadata import entry_points
from pathlib import Path

from llmgw.bus import ConfigError
from llmgw.ctl.access import add_access_parser
from llmgw.ctl.access_commands import KEY, PROJECT, REQUESTS, USAGE
from llmgw.ctl.fleet_commands import NODES, REPLICA, WEIGHTS
from llmgw.ctl.guard_commands import GUARD
from llmgw.ctl.hook_commands import HOOK
from llmgw.ctl.kb_commands import CACHE, KB
from llmgw.ctl.mcp_commands import MCP
from llmgw.ctl.mirror_commands import MIRROR
from llmgw.ctl.model_commands import MODEL, MODELS
from llmgw.ctl.node_commands import add_node_parser
from llmgw.ctl.people_commands import AUDIT, TENANT, USER
from llmgw.ctl.provider_commands import PROVIDER
from llmgw.ctl.signin_commands import SIGNIN
from llmgw.ctl.tree import add_nouns, run_ctl
from llmgw.ctl.tui import add_console_parser
from llmgw.ctl.upgrade_commands import RELEASES, UPGRADE

__all__ = ["main", "parser"]


def _services() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group="llmgw.services")}


def _service(name: str, rest: list[str]) -> int:
    found = _services()
    if name not in found:
        print(f"llmgw: no service '{name}'; installed: {', '.join(sorted(found))}", file=sys.stderr)
        return 2
    try:
        return found[name].load()(rest)
    except ConfigError as exc:
        print(f"llmgw service {name}: {exc}", file=sys.stderr)
        return 2


def _up(args: argparse.Namespace) -> int:
    """`llmgw up`: NATS, every service and an agent for this machine."""
    from llmgw.ctl.up import UpOptions, up

    return up(
        UpOptions(
            data_dir=args.data_dir,
            nats_port=args.nats_port,
            http_port=args.http_port,
            demo=not args.no_demo,
            listen=args.listen,
            ha=[a for a in (args.ha or "").split(",") if a],
            drain_s=args.drain_s,
        )
    )


def _plan(args: argparse.Namespace) -> int:
    """`llmgw plan FILE_OR_URL` and `llmgw plan calibrate`."""
    from llmgw.bus import BusConfig
    from llmgw.ctl.calibrate import BENCH_TYPES, Generated, calibrate, parse_types, report
    from llmgw.ctl.plan import run_plan

    home = BusConfig(data_dir=args.data_dir or "").home()
    if args.target == "calibrate":
        if args.rounds < 1:
            print(f"llmgw plan calibrate: --rounds must be 1 or more, not {args.rounds}", file=sys.stderr)
            return 2
        if args.size_mb is not None and args.size_mb < 8:
            print(f"llmgw plan calibrate: --size-mb must be 8 or more, not {args.size_mb}", file=sys.stderr)
            return 2
        threads = [args.threads] if args.threads else None
        size = args.size_mb * 2**20 if args.size_mb else None
        try:
            types = parse_types(args.types) if args.types else BENCH_TYPES
        except ValueError as exc:
            print(f"llmgw plan calibrate: {exc}", file=sys.stderr)
            return 2
        try:
            served = [Path(m) for m in args.model or []]
            done = calibrate(home, threads, served, args.rounds, Generated(types=types, size_bytes=size))
        except RuntimeError as exc:
            print(f"llmgw plan calibrate: {exc}", file=sys.stderr)
            return 1
        print(report(done))
        return 0
    bandwidth = None
    if args.node_bandwidth:
        try:
            every, one = (float(x) for x in args.node_bandwidth.split(","))
        except ValueError:
            print(
                f"llmgw plan: --node-bandwidth is ALL,CORE in GB/s (for example 40,10), not '{args.node_bandwidth}'",
                file=sys.stderr,
            )
            return 2
        bandwidth = (every, one)
    return run_plan(args.target, home, args.context, args.threads, bandwidth, args.json)


def _up_parser(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="run NATS, every service and an agent for this machine")
    up.add_argument("--data-dir", help="where state lives (default: $LLMGW_HOME or ~/.local/share/llmgw)")
    up.add_argument("--nats-port", type=int, default=4222, help="NATS client port (-1: a free one)")
    up.add_argument("--http-port", type=int, default=8080, help="the OpenAI endpoint's port (0: a free one)")
    up.add_argument("--no-demo", action="store_true", help="do not write and serve the demo model")
    up.add_argument(
        "--listen",
        default="127.0.0.1",
        metavar="ADDR",
        help="where NATS listens; off the loopback, other machines join here (`llmgw node invite`)",
    )
    up.add_argument(
        "--ha",
        metavar="A2,A3",
        help="the two other HA machines' addresses: the three run NATS as a cluster, and a router each",
    )
    up.add_argument(
        "--drain-s", type=float, default=10.0, help="at a stop, how long requests in flight may take to finish"
    )
    up.set_defaults(run=_up)


def _plan_parser(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser(
        "plan", help="memory and speed of a GGUF model on this machine; `plan calibrate` fits this node's CPU constants"
    )
    plan.add_argument("target", help="a GGUF file or URL (range requests: only its header is read), or 'calibrate'")
    plan.add_argument("--context", type=int, help="context length (default: the model's, at most 8192)")
    plan.add_argument("--threads", type=int, help="CPU threads a replica gets (default: half the cores)")
    plan.add_argument("--node-bandwidth", help="ALL,CORE memory GB/s instead of measuring this machine")
    plan.add_argument(
        "--data-dir", help="where calibration.json is kept (default: $LLMGW_HOME or ~/.local/share/llmgw)"
    )
    plan.add_argument("--json", action="store_true", help="the plan as JSON")
    plan.add_argument(
        "--model",
        action="append",
        help="calibrate: a GGUF file served here, measured beside the generated ones (repeatable)",
    )
    plan.add_argument(
        "--rounds", type=int, default=2, help="calibrate: times every model is measured, the best kept (default 2)"
    )
    plan.add_argument(
        "--size-mb",
        type=int,
        help="calibrate: MiB of each generated model (default: four times the last-level cache, so a token "
        "reads memory; a VM may report its host's whole cache)",
    )
    plan.add_argument(
        "--types",
        help="calibrate: the tensor types generated and measured, comma-separated, as Q4_K,Q6_K (default: all "
        "eight it knows): those served here; the others keep the defaults' costs",
    )
    plan.set_defaults(run=_plan)


def _convert(args: argparse.Namespace) -> int:
    """`llmgw convert FOLDER OUT`: a Hugging Face BERT embedding model as GGUF."""
    from llmgw.gguf import write_bert

    try:
        out = write_bert(Path(args.folder), Path(args.out))
    except (OSError, ValueError, KeyError) as exc:
        print(f"llmgw convert: {args.folder}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): an embedding model llama-server serves with --embedding")
    print("  put it on the mirror (`llmgw ctl mirror add`, or its imports), then `llmgw ctl model serve` it")
    return 0


def _convert_parser(sub: argparse._SubParsersAction) -> None:
    convert = sub.add_parser(
        "convert", help="a Hugging Face BERT sentence-embedding model (safetensors) as GGUF, without torch"
    )
    convert.add_argument("folder", help="the model's files: config.json, model.safetensors, tokenizer.json")
    convert.add_argument("out", help="the GGUF file to write")
    convert.set_defaults(run=_convert)


def parser() -> argparse.ArgumentParser:
    """The whole `llmgw` command line (`llmgw service NAME ...` is passed on before parsing)."""
    top = argparse.ArgumentParser(prog="llmgw", description="llmgw: your own LLMs on your own machines")
    sub = top.add_subparsers(dest="command", required=True)
    _up_parser(sub)
    sub.add_parser("service", help="run one service alone: llmgw service NAME [--flag value ...]")
    _plan_parser(sub)
    _convert_parser(sub)
    add_access_parser(sub)
    add_node_parser(sub)
    add_console_parser(sub)
    ctl = sub.add_parser(
        "ctl", help="operate a running llmgw", description="Operate a running llmgw: `llmgw ctl NOUN --help`."
    )
    add_nouns(
        ctl,
        [
            MODEL,
            MODELS,
            KEY,
            PROJECT,
            USAGE,
            REQUESTS,
            USER,
            TENANT,
            SIGNIN,
            HOOK,
            GUARD,
            KB,
            CACHE,
            MCP,
            PROVIDER,
            AUDIT,
            NODES,
            REPLICA,
            WEIGHTS,
            MIRROR,
            UPGRADE,
            RELEASES,
        ],
    )
    return top


def main(argv: list[str] | None = None) -> int:
    """Entry point of `llmgw`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["service"]:
        if len(argv) < 2:
            print(
                f"usage: llmgw service NAME [--flag value ...]; NAME is one of {', '.join(sorted(_services()))}",
                file=sys.stderr,
            )
            return 2
        return _service(argv[1], argv[2:])
    args = parser().parse_args(argv)
    if args.command == "ctl":
        return asyncio.run(run_ctl(args))
    return args.run(args)
