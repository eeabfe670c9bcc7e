"""The `llmgw` command: `up`, `service NAME`, and `ctl` for operators."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import msgspec

from llmgw.bus import BusError, ConfigError, connect, gather, request
from llmgw.proto import (
    Empty,
    FileInfo,
    FileList,
    FileRef,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyRef,
    Limits,
    Model,
    ModelChange,
    ModelEntry,
    ModelList,
    ModelPurge,
    ModelPut,
    ModelRef,
    ModelStatusList,
    NodeList,
    Profile,
    Project,
    PurgeReport,
    ReplicaList,
    Scaling,
    Subjects,
    UsageQuery,
    UsageReport,
    WeightsCollect,
    WeightsDeleted,
    convert_strict,
)

__all__ = ["main", "models_table", "purged"]

_PURGE_TIMEOUT_S = 150.0
"""A purge waits for the model's replicas to stop (the catalog's purge_wait_s, 60 s by default)."""


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


async def _ctl(args: argparse.Namespace) -> int:
    try:
        nc = await connect(args.nats_url, "llmgw-ctl", patient=False)
    except BusError as exc:
        print(f"llmgw ctl: {exc.message}", file=sys.stderr)
        return 1
    try:
        if args.what == "model" and args.verb == "list":
            out = await request(nc, Subjects.CATALOG_MODEL_LIST, Empty(), ModelList)
        elif args.what == "model" and args.verb in ("get", "show"):
            out = await request(nc, Subjects.CATALOG_MODEL_GET, ModelRef(name=args.arg), ModelEntry)
        elif args.what == "model" and args.verb == "remove" and args.purge:
            report = await request(
                nc,
                Subjects.CATALOG_MODEL_PURGE,
                ModelPurge(name=args.arg, by="ctl"),
                PurgeReport,
                timeout=_PURGE_TIMEOUT_S,
            )
            print(purged(report), file=sys.stderr)
            out = report
        elif args.what == "model" and args.verb == "remove":
            out = await request(nc, Subjects.CATALOG_MODEL_REMOVE, ModelRef(name=args.arg), ModelEntry)
            print(
                f"Removed {args.arg} from the catalog: its replicas stop; its files stay (`--purge` deletes them).",
                file=sys.stderr,
            )
        elif args.what == "model" and args.verb in ("put", "add"):
            out = await request(
                nc, Subjects.CATALOG_MODEL_PUT, ModelPut(model=_model_file(Path(args.arg)), by="ctl"), ModelEntry
            )
        elif args.what == "models":
            listed = await request(nc, Subjects.CATALOG_MODEL_LIST, Empty(), ModelList)
            if args.json:
                out = listed
            else:
                replicas = await request(nc, Subjects.SCHEDULER_REPLICA_LIST, Empty(), ReplicaList)
                statuses = await request(nc, Subjects.SCHEDULER_MODEL_STATUS, Empty(), ModelStatusList)
                print(models_table(listed, replicas, statuses))
                return 0
        elif args.what == "model" and args.verb in (
            "stop",
            "start",
            "restart",
            "scale",
            "replicas",
            "context",
            "gpus",
            "class",
            "owner",
            "alias",
        ):
            change = _change(args)
            out = await request(nc, Subjects.CATALOG_MODEL_CHANGE, change, ModelEntry)
            print(_said(change, out), file=sys.stderr)
        elif args.what == "model" and args.verb == "plan":
            return await _fleet_plan(nc, args)
        elif args.what == "weights":
            return await _collect(nc, args)
        elif args.what in ("key", "project", "usage"):
            return await _access(nc, args)
        elif args.what == "replica" and args.verb == "list":
            out = await request(nc, Subjects.SCHEDULER_REPLICA_LIST, Empty(), ReplicaList)
        else:
            print(f"llmgw ctl: unknown command '{args.what} {args.verb}'", file=sys.stderr)
            return 2
    except (BusError, msgspec.ValidationError, msgspec.DecodeError, OSError, ValueError) as exc:
        print(f"llmgw ctl: {exc}", file=sys.stderr)
        return 1
    finally:
        await nc.close()
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(out)) + b"\n")
    return 0


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(
        requests_per_minute=args.rpm,
        tokens_per_minute=args.tpm,
        concurrent=args.concurrent,
        tokens_per_day=args.tokens_day,
        tokens_per_month=args.tokens_month,
    )


async def _access(nc, args: argparse.Namespace) -> int:
    """`llmgw ctl key create|list|revoke`, `project put`, `usage`: the router's keys, projects and usage."""
    if args.what == "key" and args.verb == "create":
        if not args.arg:
            raise ValueError("key create needs a name: llmgw ctl key create NAME [--project P] [--rpm N] ...")
        created = await request(
            nc,
            Subjects.ROUTER_KEY_CREATE,
            msgspec.convert(
                {
                    "name": args.arg,
                    "admin": args.admin,
                    "project": args.project or "default",
                    "expires_in_s": args.expires_days * 86400 if args.expires_days else None,
                    "models": [m for m in (args.models or "").split(",") if m],
                    "limits": msgspec.to_builtins(_limits(args)),
                },
                KeyCreate,
            ),
            KeyCreated,
        )
        print(f"key {created.id} ({created.name}); it is shown this once:", file=sys.stderr)
        print(created.key)
        return 0
    if args.what == "key" and args.verb == "list":
        keys = await request(nc, Subjects.ROUTER_KEY_LIST, Empty(), KeyList)
        print(
            _table(
                ["ID", "NAME", "PROJECT", "ADMIN", "MODELS", "LIMITS", "EXPIRES"],
                [
                    [
                        kid,
                        k.name,
                        k.project,
                        "yes" if k.admin else "",
                        ",".join(k.models) or "all",
                        _limits_text(k.limits),
                        time.strftime("%Y-%m-%d", time.gmtime(k.expires)) if k.expires else "never",
                    ]
                    for kid, k in keys.keys.items()
                ],
            )
        )
        return 0
    if args.what == "key" and args.verb == "revoke":
        await request(nc, Subjects.ROUTER_KEY_REVOKE, msgspec.convert({"id": args.arg or ""}, KeyRef), KeyList)
        print(f"key {args.arg} revoked: it stops working at once on every router", file=sys.stderr)
        return 0
    if args.what == "project" and args.verb in ("put", "add"):
        project = await request(nc, Subjects.ROUTER_PROJECT_PUT, Project(name=args.arg, limits=_limits(args)), Project)
        print(f"project {project.name}: {_limits_text(project.limits)}", file=sys.stderr)
        return 0
    if args.what == "usage":
        report = await request(
            nc,
            Subjects.ROUTER_USAGE_SUM,
            UsageQuery(since=time.time() - args.since_hours * 3600, group_by=args.by),
            UsageReport,
            timeout=60.0,
        )
        print(
            _table(
                [args.by.upper(), "REQUESTS", "ERRORS", "PROMPT", "CACHED", "COMPLETION"],
                [
                    [r.group, r.requests, r.errors, r.prompt_tokens, r.cached_tokens, r.completion_tokens]
                    for r in report.rows
                ],
            )
        )
        return 0
    raise ValueError(f"unknown command '{args.what} {args.verb}': key create|list|revoke, project put, usage")


def _limits_text(limits: Limits) -> str:
    said = [f"{k}={v}" for k, v in msgspec.structs.asdict(limits).items() if v is not None]
    return " ".join(said) or "none"


def _table(header: list[str], rows: list) -> str:
    """Columns padded to their widest cell, two spaces apart."""
    rows = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


async def _fleet_plan(nc, args: argparse.Namespace) -> int:
    """`llmgw ctl model plan FILE|URL|OWNER/REPO[/FILE]`: the ways to run it on the fleet's nodes.

    A repository in the mirror plans every GGUF file in it (its quantisations; the first part
    of a split one).
    """
    from llmgw.ctl.plan import make_plan, plan_text
    from llmgw.gguf import GGUFError
    from llmgw.modelplan import node_facts

    target = args.arg
    if not target:
        raise ValueError("usage: llmgw ctl model plan FILE|URL|OWNER/REPO[/FILE] [--context N] [--threads N]")
    wheres = [target]
    if not target.startswith(("http://", "https://")) and not Path(target).exists():
        if target.count("/") == 1:  # a repository: its GGUF files
            held = await request(nc, Subjects.MIRROR_FILE_LIST, Empty(), FileList)
            wheres = [
                f.url
                for f in held.files
                if f.source.startswith(target + "/")
                and f.source.endswith(".gguf")
                and ("-of-" not in f.source or "-00001-of-" in f.source)
            ]
            if not wheres:
                raise ValueError(f"the mirror holds no GGUF file under '{target}'")
        else:
            wheres = [(await request(nc, Subjects.MIRROR_FILE_STAT, FileRef(source=target), FileInfo)).url]
    listed = await request(nc, Subjects.SCHEDULER_NODE_LIST, Empty(), NodeList)
    if not listed.nodes:
        raise ValueError("no node has registered with the scheduler: start an agent (`llmgw service agent`)")
    try:
        plan = await asyncio.to_thread(
            make_plan, wheres, [node_facts(n) for n in listed.nodes], args.context, args.threads
        )
    except GGUFError as exc:
        raise ValueError(str(exc)) from None
    if args.json:
        sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(plan)) + b"\n")
    else:
        print(plan_text(plan))
    return 0


async def _collect(nc, args: argparse.Namespace) -> int:
    """`llmgw ctl weights --collect`: every node deletes the cached weights no model in the catalog uses."""
    if not args.collect:
        raise ValueError("usage: llmgw ctl weights --collect (deletes cached weights no model uses)")
    listed = await request(nc, Subjects.CATALOG_MODEL_LIST, Empty(), ModelList)
    keep = sorted({e.model.source for e in listed.models})
    answers = await gather(nc, Subjects.AGENT_WEIGHTS_COLLECT, WeightsCollect(keep=keep), WeightsDeleted, 3.0)
    if not answers:
        print("No agent answered: no node to collect on.", file=sys.stderr)
        return 1
    for a in answers:
        if isinstance(a, BusError):
            print(f"an agent failed: {a.message}", file=sys.stderr)
        elif a.deleted:
            print(f"{a.where}: deleted {', '.join(a.deleted)}")
        else:
            print(f"{a.where}: nothing unused")
    return 0


def _model_file(path: Path) -> Model:
    """One model from a YAML or JSON file, strictly: unknown fields are refused with their place."""
    text = path.read_bytes()
    try:
        raw = msgspec.json.decode(text) if path.suffix == ".json" else msgspec.yaml.decode(text)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{path}: not {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    return convert_strict(raw, Model, str(path))


def _reserves(profile: Profile) -> str:
    """What one replica of `profile` holds: cards, or cores and host memory (on each of its nodes)."""
    across = f" on each of {profile.nodes} nodes" if profile.nodes > 1 else ""
    if profile.gpus:
        return f"{profile.gpus}x{profile.gpu_class or 'gpu'}{across}"
    cores = f"{profile.cpu_cores} cores" if profile.cpu_cores else "half the cores"
    share = f"weights/{profile.nodes}" if profile.nodes > 1 else "weights"
    memory = f"{profile.host_memory_mb / 1024:.1f} GiB" if profile.host_memory_mb else f"{share}+10%"
    return f"{cores}, {memory}{across}"


def models_table(listed: ModelList, replicas: ReplicaList, statuses: ModelStatusList | None = None) -> str:
    """`llmgw ctl models`: name, ready/wanted, status, class, what a replica reserves, profiles (with
    counts), aliases, fallbacks, and warnings (replicas that failed, and why)."""
    ready: dict[str, int] = {}
    failed: dict[str, list[str]] = {}
    for r in replicas.replicas:
        ready[r.model] = ready.get(r.model, 0) + (r.state == "ready")
        if r.state == "failed":
            failed.setdefault(r.model, []).append(r.error)
    rows = []
    for e in listed.models:
        m = e.model
        counted = any(p.replicas is not None for p in m.profiles)
        profiles = ", ".join(f"{p.name}={p.replicas or 0}" if counted else p.name for p in m.profiles)
        known = {s.model: s for s in statuses.models} if statuses else {}
        st = known.get(m.name)
        status = st.state if st else ("stopped" if m.stopped else "running")
        if e.declared_in:
            status += " (declared)"
        best = max(m.profiles, key=lambda p: p.priority)
        errors = failed.get(m.name, [])
        warning = st.reason if st and st.reason else (f"{len(errors)} failed: {errors[-1]}" if errors else "-")
        rows.append(
            (
                m.name,
                f"{ready.get(m.name, 0)}/{st.wanted if st else m.scaling.min}",
                status,
                m.capacity_class,
                _reserves(best),
                profiles,
                ", ".join(m.aliases) or "-",
                ", ".join(m.fallbacks) or "-",
                warning,
            )
        )
    return _table(
        ["MODEL", "READY", "STATUS", "CLASS", "RESERVES", "PROFILES", "ALIASES", "FALLBACKS", "WARNINGS"], rows
    )


def _change(args: argparse.Namespace) -> ModelChange:
    """The change `llmgw ctl model stop|start|scale|replicas NAME ...` asks for."""
    change = ModelChange(name=args.arg, action=args.verb, by="ctl", in_place=args.in_place)
    if args.verb == "scale":
        if not 1 <= len(args.rest) <= 2:
            raise ValueError("usage: llmgw ctl model scale NAME MIN [MAX]")
        low = int(args.rest[0])
        change.scaling = Scaling(min=low, max=int(args.rest[-1]))
    elif args.verb == "replicas":
        change.counts = _pairs(args.rest)
        if args.cpu_memory is not None:
            change.cpu_memory_mb = int(args.cpu_memory * 1024)
        change.cpu_cores = args.cpu_cores
    elif args.verb == "context":
        change.context = int(args.rest[0]) if args.rest else None
        change.max_output = args.max_output
    elif args.verb == "gpus":
        change.gpus = _pairs(args.rest)
    elif args.verb in ("class", "owner"):
        if len(args.rest) != 1:
            raise ValueError(f"usage: llmgw ctl model {args.verb} NAME VALUE")
        change.capacity_class, change.owner = (args.rest[0], None) if args.verb == "class" else (None, args.rest[0])
    elif args.verb == "alias":
        change.add_aliases, change.remove_aliases = args.add or [], args.drop or []
        if not (change.add_aliases or change.remove_aliases):
            raise ValueError("usage: llmgw ctl model alias NAME [--add ALIAS ...] [--drop ALIAS ...]")
    return msgspec.convert(msgspec.to_builtins(change), ModelChange)  # validated like any message


def _pairs(items: list[str]) -> dict[str, int]:
    """PROFILE=COUNT arguments."""
    out = {}
    for item in items:
        profile, eq, count = item.partition("=")
        if not eq or not count.isdigit():
            raise ValueError(f"'{item}' is not PROFILE=COUNT (for example gpu=7 cpu=4)")
        out[profile] = int(count)
    return out


def _said(change: ModelChange, entry: ModelEntry) -> str:
    """One sentence of what changed and what happens next."""
    m = entry.model
    if change.action == "stop":
        return f"Stopped {m.name}: its replicas stop; `start` brings back {m.stopped.min}."
    how = (
        "each stops before its replacement starts"
        if m.rollout == "in-place"
        else "each replacement is ready before the old one stops"
    )
    if change.action == "restart":
        return f"Restarting {m.name} (generation {m.generation}): its replicas start again one at a time; {how}."
    counts = {p.name: p.replicas for p in m.profiles if p.replicas is not None}
    where = f" ({', '.join(f'{k}={v}' for k, v in counts.items())})" if counts else ""
    if change.action == "replicas":
        return f"{m.name} now runs {m.scaling.min} replicas{where}. Those short start first, then those over stop."
    if change.action in ("context", "gpus"):
        if change.action == "context" and change.context is None:
            return f"{m.name}: max output {m.max_output}, applied at once; no replica restarts."
        return (
            f"{m.name}: context {m.context}, max output {m.max_output or 'unset'}; "
            f"its replicas restart one at a time, {how}."
        )
    if change.action in ("class", "owner", "alias"):
        return f"{m.name}: class {m.capacity_class}, owner {m.owner or '-'}, aliases {', '.join(m.aliases) or '-'}."
    return f"{m.name} now runs {m.scaling.min}..{m.scaling.max} replicas{where}."


def purged(report: PurgeReport) -> str:
    """One sentence of what a purge deleted and what it kept, and why."""
    said = [f"Removed {report.entry.model.name} from the catalog."]
    by_source: dict[str, list[str]] = {}
    for d in report.deleted:
        by_source.setdefault(d.source, []).append(d.where)
    said += [f"Deleted {source} from {', '.join(sorted(where))}." for source, where in by_source.items()]
    said += [f"Kept {k.source} ({k.where}): {k.why}." for k in report.kept]
    if not report.deleted and not report.kept:
        said.append(f"No copy of {report.entry.model.source} was found to delete.")
    return " ".join(said)


def _plan(args: argparse.Namespace) -> int:
    """`llmgw plan FILE_OR_URL` and `llmgw plan calibrate`."""
    from llmgw.bus import BusConfig
    from llmgw.ctl.calibrate import calibrate, report
    from llmgw.ctl.plan import run_plan
    from llmgw.modelplan import DEFAULT_CPU

    home = BusConfig(data_dir=args.data_dir or "").home()
    if args.target == "calibrate":
        threads = [args.threads] if args.threads else None
        try:
            fitted, points = calibrate(home, threads)
        except RuntimeError as exc:
            print(f"llmgw plan calibrate: {exc}", file=sys.stderr)
            return 1
        print(report(points, DEFAULT_CPU, fitted))
        print(f"kept in {home / 'calibration.json'}; the agent reports it and estimates use it")
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
    parser = argparse.ArgumentParser(prog="llmgw", description="llmgw: your own LLMs on your own machines")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run NATS, every service and an agent for this machine")
    up.add_argument("--data-dir", help="where state lives (default: $LLMGW_HOME or ~/.local/share/llmgw)")
    up.add_argument("--nats-port", type=int, default=4222, help="NATS client port (-1: a free one)")
    up.add_argument("--http-port", type=int, default=8080, help="the OpenAI endpoint's port (0: a free one)")
    up.add_argument("--no-demo", action="store_true", help="do not write and serve the demo model")
    sub.add_parser("service", help="run one service alone: llmgw service NAME [--flag value ...]")
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
    ctl = sub.add_parser("ctl", help="operate a running llmgw")
    ctl.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    ctl.add_argument("what", choices=["model", "models", "replica", "weights", "key", "project", "usage"])
    ctl.add_argument(
        "verb",
        nargs="?",
        default="list",
        choices=[
            "list",
            "get",
            "show",
            "add",
            "put",
            "remove",
            "stop",
            "start",
            "restart",
            "scale",
            "replicas",
            "plan",
            "context",
            "gpus",
            "class",
            "owner",
            "alias",
            "create",
            "revoke",
        ],
    )
    ctl.add_argument("--json", action="store_true", help="models: JSON instead of a table")
    ctl.add_argument("arg", nargs="?", help="a model name, or for put a JSON file of the model")
    ctl.add_argument("rest", nargs="*", help="scale: MIN [MAX]; replicas: PROFILE=COUNT ...")
    ctl.add_argument("--cpu-memory", type=float, help="replicas: add a CPU profile reserving this many GB")
    ctl.add_argument("--cpu-cores", type=int, help="replicas: cores that CPU profile reserves")
    ctl.add_argument("--max-output", type=int, help="context: the longest answer in tokens")
    ctl.add_argument("--context", type=int, help="plan: the context length (default: the model's, at most 8192)")
    ctl.add_argument("--threads", type=int, help="plan: CPU threads a replica gets (default: half a node's)")
    ctl.add_argument("--add", action="append", help="alias: an alias to add (repeatable)")
    ctl.add_argument("--drop", action="append", help="alias: an alias to drop (repeatable)")
    ctl.add_argument(
        "--in-place",
        action="store_true",
        help="restart, context, gpus: stop each replica before its replacement (no room beside it)",
    )
    ctl.add_argument(
        "--collect", action="store_true", help="weights: delete cached weights no model uses, on every node"
    )
    ctl.add_argument(
        "--purge",
        action="store_true",
        help="remove: also delete its files from the mirror and the nodes (those no other model uses)",
    )
    ctl.add_argument("--project", help="key create: its project (default: default)")
    ctl.add_argument("--models", help="key create: the models it may use, comma-separated (default: all)")
    ctl.add_argument("--admin", action="store_true", help="key create: it may use the admin API")
    ctl.add_argument("--expires-days", type=float, help="key create: days until it stops working")
    for flag, what in (
        ("rpm", "requests a minute"),
        ("tpm", "tokens a minute"),
        ("concurrent", "requests at once"),
        ("tokens-day", "tokens a UTC day"),
        ("tokens-month", "tokens a UTC month"),
    ):
        ctl.add_argument(f"--{flag}", type=int, help=f"key create, project put: at most this many {what}")
    ctl.add_argument("--since-hours", type=float, default=24.0, help="usage: the last this many hours (default 24)")
    ctl.add_argument("--by", default="model", choices=["model", "project", "key", "replica"], help="usage: one row per")
    args = parser.parse_args(argv)
    if args.command == "plan":
        return _plan(args)
    if args.command == "up":
        from llmgw.ctl.up import UpOptions, up

        return up(
            UpOptions(data_dir=args.data_dir, nats_port=args.nats_port, http_port=args.http_port, demo=not args.no_demo)
        )
    return asyncio.run(_ctl(args))
