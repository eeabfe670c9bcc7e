"""The `llmgw` command: `up`, `service NAME`, and `ctl` for operators."""

from __future__ import annotations

import argparse
import asyncio
import sys
from importlib.metadata import entry_points
from pathlib import Path

import msgspec

from llmgw.bus import BusError, connect, request
from llmgw.proto import Empty, ModelEntry, ModelList, ModelPut, ModelRef, ReplicaList, Subjects

__all__ = ["main"]


def _services() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group="llmgw.services")}


def _service(name: str, rest: list[str]) -> int:
    found = _services()
    if name not in found:
        print(f"llmgw: no service '{name}'; installed: {', '.join(sorted(found))}", file=sys.stderr)
        return 2
    return found[name].load()(rest)


async def _ctl(args: argparse.Namespace) -> int:
    nc = await connect(args.nats_url, "llmgw-ctl")
    try:
        if args.what == "model" and args.verb == "list":
            out = await request(nc, Subjects.CATALOG_MODEL_LIST, Empty(), ModelList)
        elif args.what == "model" and args.verb == "get":
            out = await request(nc, Subjects.CATALOG_MODEL_GET, ModelRef(name=args.arg), ModelEntry)
        elif args.what == "model" and args.verb == "remove":
            out = await request(nc, Subjects.CATALOG_MODEL_REMOVE, ModelRef(name=args.arg), ModelEntry)
        elif args.what == "model" and args.verb == "put":
            raw = Path(args.arg).read_bytes()
            put = msgspec.json.decode(b'{"model": %s, "by": "ctl"}' % raw, type=ModelPut)
            out = await request(nc, Subjects.CATALOG_MODEL_PUT, put, ModelEntry)
        elif args.what == "replica" and args.verb == "list":
            out = await request(nc, Subjects.SCHEDULER_REPLICA_LIST, Empty(), ReplicaList)
        else:
            print(f"llmgw ctl: unknown command '{args.what} {args.verb}'", file=sys.stderr)
            return 2
    except (BusError, msgspec.ValidationError, msgspec.DecodeError, OSError) as exc:
        print(f"llmgw ctl: {exc}", file=sys.stderr)
        return 1
    finally:
        await nc.close()
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(out)) + b"\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `llmgw`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["service"]:
        if len(argv) < 2:
            print(f"usage: llmgw service NAME [--flag value ...]; NAME is one of {', '.join(sorted(_services()))}", file=sys.stderr)
            return 2
        return _service(argv[1], argv[2:])
    parser = argparse.ArgumentParser(prog="llmgw", description="llmgw: your own LLMs on your own machines")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run NATS, every service and an agent for this machine")
    up.add_argument("--data-dir", help="where state lives (default: $LLMGW_HOME or ~/.local/share/llmgw)")
    up.add_argument("--nats-port", type=int, default=4222, help="NATS client port (-1: a free one)")
    up.add_argument("--http-port", type=int, default=8080, help="the OpenAI endpoint's port (0: a free one)")
    up.add_argument("--no-demo", action="store_true", help="do not write and serve the demo model")
    sub.add_parser("service", help="run one service alone: llmgw service NAME [--flag value ...]")
    ctl = sub.add_parser("ctl", help="operate a running llmgw")
    ctl.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    ctl.add_argument("what", choices=["model", "replica"])
    ctl.add_argument("verb", choices=["list", "get", "put", "remove"])
    ctl.add_argument("arg", nargs="?", help="a model name, or for put a JSON file of the model")
    args = parser.parse_args(argv)
    if args.command == "up":
        from llmgw.ctl.up import UpOptions, up

        return up(UpOptions(data_dir=args.data_dir, nats_port=args.nats_port, http_port=args.http_port, demo=not args.no_demo))
    return asyncio.run(_ctl(args))
