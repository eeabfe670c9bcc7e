"""`llmgw ctl model ...` and `llmgw ctl models`: the catalog's models, and every change to one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
from nats.aio.client import Client

from llmgw.bus import BusError, call
from llmgw.ctl.adapter_commands import ADAPTERS
from llmgw.ctl.changes import BY, change_of
from llmgw.ctl.fleet_commands import PLAN
from llmgw.ctl.sentences import added, purged, removed, said
from llmgw.ctl.serve_commands import SERVE
from llmgw.ctl.tables import model_rows, model_yaml, models_table
from llmgw.ctl.tree import Noun, Verb, done, show
from llmgw.proto import (
    Empty,
    Model,
    ModelPurge,
    ModelPut,
    ModelRef,
    ReplicaList,
    catalog,
    convert_strict,
    scheduler,
)
from llmgw.proto.scheduler import ModelRoom, RoomAsk

__all__ = ["MODEL", "MODELS"]


async def _list(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, catalog.MODEL_LIST, Empty())
    try:
        replicas = await call(nc, scheduler.REPLICA_LIST, Empty())
        statuses = await call(nc, scheduler.MODEL_STATUS, Empty())
    except BusError as exc:
        print(f"llmgw ctl: {exc.message}; ready and status are the catalog's alone", file=sys.stderr)
        replicas, statuses = ReplicaList(replicas=[]), None
    return show(args, model_rows(listed, replicas, statuses), models_table(listed, replicas, statuses))


async def _get(nc: Client, args: argparse.Namespace) -> int:
    entry = await call(nc, catalog.MODEL_GET, ModelRef(name=args.name))
    return show(args, entry, model_yaml(entry))


async def _room(nc: Client, args: argparse.Namespace) -> int:
    room = await call(nc, scheduler.MODEL_ROOM, RoomAsk(name=args.name))
    return show(args, room, room_text(room))


def room_text(room: ModelRoom) -> str:
    """Each profile's room as a line: how many more now, and with lower classes' room taken."""

    def most(n: int, counted: int) -> str:
        return f"{counted} or more" if n >= counted else f"at most {n}"

    lines = []
    for p in room.profiles:
        line = f"{room.model} {p.profile}: more now: {most(p.more_now, p.most)}"
        if p.more_preempting > p.more_now:
            line += f"; taking lower classes' room (preemption): {most(p.more_preempting, p.most)}"
        lines.append(line + (f" ({p.why})" if p.why else ""))
    return "\n".join(lines)


def model_file(path: Path) -> Model:
    """One model from a YAML or JSON file, strictly: unknown fields are refused with their place."""
    text = path.read_bytes()
    try:
        raw = msgspec.json.decode(text) if path.suffix == ".json" else msgspec.yaml.decode(text)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{path}: not {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    return convert_strict(raw, Model, str(path))


async def _add(nc: Client, args: argparse.Namespace) -> int:
    entry = await call(
        nc, catalog.MODEL_PUT, ModelPut(model=model_file(Path(args.file)), revision=args.revision, by=BY)
    )
    return done(args, entry, added(entry))


async def _remove(nc: Client, args: argparse.Namespace) -> int:
    if args.purge:
        report = await call(nc, catalog.MODEL_PURGE, ModelPurge(name=args.name, revision=args.revision, by=BY))
        return done(args, report, purged(report))
    entry = await call(nc, catalog.MODEL_REMOVE, ModelRef(name=args.name, revision=args.revision, by=BY))
    return done(args, entry, removed(entry))


async def _change(nc: Client, args: argparse.Namespace) -> int:
    change = change_of(args)
    entry = await call(nc, catalog.MODEL_CHANGE, change)
    return done(args, entry, said(change, entry))


def _name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the model (as `llmgw ctl models` lists it)")


def _revision(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--revision",
        type=int,
        metavar="N",
        help="only if the model is still at revision N (`model get` says it): a change made since is refused; "
        "0 with add: only if it does not exist yet",
    )


def _guarded(add: Callable[[argparse.ArgumentParser], None]) -> Callable[[argparse.ArgumentParser], None]:
    """A verb's arguments with --revision beside them (a compare-and-set)."""

    def both(parser: argparse.ArgumentParser) -> None:
        add(parser)
        _revision(parser)

    return both


def _in_place(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--in-place", action="store_true", help="stop each replica before its replacement starts (no room beside it)"
    )


def _name_in_place(parser: argparse.ArgumentParser) -> None:
    _name(parser)
    _in_place(parser)


def _file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="the model as YAML (or .json); unknown fields are refused")


def _remove_arguments(parser: argparse.ArgumentParser) -> None:
    _name(parser)
    parser.add_argument(
        "--purge",
        action="store_true",
        help="also delete its files from the mirror and the nodes, once its replicas stopped (those no other "
        "model uses)",
    )


def _scale_arguments(parser: argparse.ArgumentParser) -> None:
    _name(parser)
    parser.add_argument("min", metavar="MIN", type=int, help="replicas kept running")
    parser.add_argument("max", metavar="MAX", type=int, nargs="?", help="most replicas at once (default MIN)")


def _replicas_arguments(parser: argparse.ArgumentParser) -> None:
    _name(parser)
    parser.add_argument("counts", metavar="PROFILE=COUNT", nargs="*", help="replicas of a profile (others keep theirs)")
    parser.add_argument("--cpu-memory", type=float, metavar="GB", help="add a CPU profile 'cpu' reserving this memory")
    parser.add_argument("--cpu-cores", type=int, metavar="N", help="the cores that CPU profile reserves")


def _context_arguments(parser: argparse.ArgumentParser) -> None:
    _name(parser)
    parser.add_argument("context", metavar="N", type=int, nargs="?", help="the context length in tokens")
    parser.add_argument("--max-output", type=int, metavar="N", help="the longest answer in tokens")
    _in_place(parser)


def _gpus_arguments(parser: argparse.ArgumentParser) -> None:
    _name(parser)
    parser.add_argument("counts", metavar="PROFILE=GPUS", nargs="+", help="GPUs per replica of a profile")
    _in_place(parser)


def _resources_arguments(parser: argparse.ArgumentParser) -> None:
    _name_in_place(parser)
    parser.add_argument("profile", metavar="PROFILE", help="the profile whose replicas reserve it")
    parser.add_argument("--memory", type=float, metavar="GIB", help="host memory a replica reserves, GiB")
    parser.add_argument("--cores", type=int, metavar="N", help="cores (engine threads) a replica reserves")


def _class_arguments(parser: argparse.ArgumentParser) -> None:
    _name(parser)
    parser.add_argument(
        "capacity_class", metavar="CLASS", choices=["critical", "standard", "batch"], help="%(choices)s"
    )


def _owner_arguments(parser: argparse.ArgumentParser) -> None:
    _name(parser)
    parser.add_argument("owner", metavar="OWNER", help="the team or person responsible ('' for nobody)")


def _alias_arguments(parser: argparse.ArgumentParser) -> None:
    _name(parser)
    parser.add_argument("--add", action="append", metavar="ALIAS", help="an alias to add (again for more)")
    parser.add_argument("--drop", action="append", metavar="ALIAS", help="an alias to drop (again for more)")


_RESTARTS = (
    "its replicas are replaced one at a time, each new one ready before the old one stops "
    "(or, with --in-place, stopped first)"
)

_LIST = Verb(
    "list",
    "the models: ready/wanted, status, class, what a replica reserves, profiles, aliases, warnings",
    "llmgw ctl model list --json",
    "`llmgw ctl replica list` shows each replica; `llmgw ctl model get NAME` one model whole",
    _list,
)
MODELS = Verb("models", _LIST.help, "llmgw ctl models", _LIST.then, _list)
"""`llmgw ctl models`: the same as `llmgw ctl model list`."""

_CHANGES = (
    Verb(
        "stop",
        "stop every replica, keeping the scaling",
        "llmgw ctl model stop qwen",
        "`start` brings it back",
        _change,
        _guarded(_name),
    ),
    Verb(
        "start",
        "bring a stopped model back as it was",
        "llmgw ctl model start qwen",
        "the scheduler places its replicas",
        _change,
        _guarded(_name),
    ),
    Verb(
        "restart",
        "start every replica again",
        "llmgw ctl model restart qwen",
        _RESTARTS,
        _change,
        _guarded(_name_in_place),
    ),
    Verb(
        "scale",
        "keep MIN..MAX replicas running",
        "llmgw ctl model scale qwen 1 3",
        "the scheduler starts or stops replicas to match (counts per profile end unless the total is theirs)",
        _change,
        _guarded(_scale_arguments),
    ),
    Verb(
        "replicas",
        "replicas per profile; the scaling becomes their sum",
        "llmgw ctl model replicas qwen gpu=7 cpu=4 --cpu-memory 16 --cpu-cores 8",
        "those short start first, then those over stop; `stop` keeps the counts for `start`",
        _change,
        _guarded(_replicas_arguments),
    ),
    Verb(
        "context",
        "a new context length and/or longest answer",
        "llmgw ctl model context qwen 8192 --max-output 1024",
        f"a new context: {_RESTARTS}; a new longest answer applies at once",
        _change,
        _guarded(_context_arguments),
    ),
    Verb(
        "gpus",
        "GPUs per replica of a profile",
        "llmgw ctl model gpus qwen gpu=2",
        _RESTARTS,
        _change,
        _guarded(_gpus_arguments),
    ),
    Verb(
        "resources",
        "the host memory and cores a replica of a profile reserves",
        "llmgw ctl model resources qwen cpu --memory 16 --cores 8",
        _RESTARTS,
        _change,
        _guarded(_resources_arguments),
    ),
    Verb(
        "class",
        "its capacity class: a higher class may take room from a lower one",
        "llmgw ctl model class qwen critical",
        "nothing restarts; placement uses it from now on",
        _change,
        _guarded(_class_arguments),
    ),
    Verb(
        "owner",
        "the team or person responsible",
        "llmgw ctl model owner qwen ml-platform",
        "nothing restarts",
        _change,
        _guarded(_owner_arguments),
    ),
    Verb(
        "alias",
        "add or drop other names clients may ask for",
        "llmgw ctl model alias qwen --add qwen-small --drop old",
        "routers answer to the new names at once",
        _change,
        _guarded(_alias_arguments),
    ),
)

MODEL = Noun(
    "model",
    "the catalog's models: list, get, add, remove, change how they run, plan",
    (
        _LIST,
        Verb(
            "get",
            "one model whole, as the YAML `add` takes (--json: with its revision and file, as JSON)",
            "llmgw ctl model get qwen",
            "change it with `add` (a file) or a change verb",
            _get,
            _name,
            ("show",),
        ),
        Verb(
            "add",
            "put a model from a YAML file in the catalog (or replace it)",
            "llmgw ctl model add qwen.yaml",
            "the scheduler places its replicas; `llmgw ctl models` shows them come up",
            _add,
            _guarded(_file),
            ("put",),
        ),
        Verb(
            "remove",
            "take a model out of the catalog",
            "llmgw ctl model remove qwen --purge",
            "its replicas stop; its files stay unless --purge",
            _remove,
            _guarded(_remove_arguments),
        ),
        Verb(
            "room",
            "how many more replicas of each profile fit now, and with lower classes' room taken",
            "llmgw ctl model room qwen",
            "`llmgw ctl model replicas qwen gpu=N` asks for them",
            _room,
            _name,
        ),
        *_CHANGES,
        ADAPTERS,
        PLAN,
        SERVE,
    ),
    default=_LIST,
)
"""`llmgw ctl model VERB ...`."""
