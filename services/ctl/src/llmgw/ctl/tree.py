"""The shape of `llmgw ctl`: nouns holding verbs, each verb with its own arguments, an example and
what happens next; and the one place that connects to NATS, runs a verb and reports its errors."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import msgspec
from nats.aio.client import Client
from opentelemetry import trace

from llmgw.bus import BusError, CredentialsError, TracingError, connect, data_home, setup_tracing
from llmgw.ctl.over_api import API_KEY_ENV, AdminApi
from llmgw.ctl.upstate import running_up
from llmgw.proto import plainly

_tracer = trace.get_tracer("llmgw.ctl")

__all__ = [
    "DEFAULT_NATS_URL",
    "Noun",
    "Reach",
    "Verb",
    "add_nouns",
    "done",
    "emit",
    "reach",
    "run_ctl",
    "show",
    "tenant_filter",
]

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
_CREDS_HELP = "$LLMGW_CREDS, else <data>/creds/ctl.nk where `llmgw up` writes it"
_API_HELP = (
    f"ask through a router's admin API at URL (http://HOST:8080) with the key in ${API_KEY_ENV} "
    "(a key your user owns, or an admin's) instead of NATS"
)
_URL_HELP = f"the NATS to operate (default: the running `llmgw up`'s over the data directory, else {DEFAULT_NATS_URL})"
_DATA_HELP = "the data directory of the `llmgw up` to operate (default: $LLMGW_HOME, else ~/.local/share/llmgw)"

Run = Callable[[Client, argparse.Namespace], Awaitable[int]]


def _no_arguments(_: argparse.ArgumentParser) -> None:
    return None


@dataclass(frozen=True)
class Verb:
    """One command: `llmgw ctl NOUN VERB ...` (or `llmgw ctl NOUN` for a noun that is its own verb)."""

    name: str
    help: str
    """What it does, one line (the noun's help lists it)."""
    example: str
    """A command line that does it."""
    then: str
    """What happens after it answers."""
    run: Run
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    """Adds the verb's own arguments to its parser."""
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Noun:
    """A group of verbs: `llmgw ctl model ...`."""

    name: str
    help: str
    verbs: tuple[Verb, ...]
    default: Verb | None = None
    """What the noun alone runs (`llmgw ctl model` lists the models)."""
    flags: Callable[[argparse.ArgumentParser], None] = field(default=_no_arguments)
    """Options of the noun itself (`llmgw ctl weights --collect`)."""


def _common() -> argparse.ArgumentParser:
    """Options every verb takes after its words as well as before the noun."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", default=argparse.SUPPRESS, help=_URL_HELP)
    common.add_argument("--data-dir", default=argparse.SUPPRESS, help=_DATA_HELP)
    common.add_argument(
        "--creds", default=argparse.SUPPRESS, help="the operator's NATS credentials (default: " + _CREDS_HELP + ")"
    )
    common.add_argument("--tls-ca", default=argparse.SUPPRESS, help="CA file of the NATS server's certificate")
    common.add_argument("--api", default=argparse.SUPPRESS, metavar="URL", help=_API_HELP)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="JSON on stdout instead of words for people"
    )
    return common


def _leaf(sub: argparse._SubParsersAction, verb: Verb, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        verb.name,
        aliases=list(verb.aliases),
        help=verb.help,
        description=verb.help,
        epilog=f"example:\n  {verb.example}\n\nthen: {verb.then}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    verb.arguments(parser)
    parser.set_defaults(run=verb.run, verb=verb.name)


def add_nouns(ctl: argparse.ArgumentParser, nouns: list[Noun | Verb]) -> None:
    """Give `ctl` a subcommand for each noun (with its verbs) and each verb that stands alone."""
    ctl.add_argument("--nats-url", default=None, help=_URL_HELP)
    ctl.add_argument("--data-dir", default=None, help=_DATA_HELP)
    ctl.add_argument("--creds", default=None, help="the operator's NATS credentials (default: " + _CREDS_HELP + ")")
    ctl.add_argument("--tls-ca", default="", help="CA file of the NATS server's certificate (TLS)")
    ctl.add_argument("--api", default="", metavar="URL", help=_API_HELP)
    ctl.add_argument("--json", action="store_true", default=False, help="JSON on stdout instead of words for people")
    ctl.set_defaults(run=None, noun_parser=ctl)
    common = _common()
    sub = ctl.add_subparsers(title="what to operate", metavar="NOUN")
    for noun in nouns:
        if isinstance(noun, Verb):
            _leaf(sub, noun, common)
            continue
        parser = sub.add_parser(noun.name, help=noun.help, description=noun.help, parents=[common])
        noun.flags(parser)
        parser.set_defaults(run=noun.default.run if noun.default else None, verb=noun.default and noun.default.name)
        parser.set_defaults(noun_parser=parser)
        verbs = parser.add_subparsers(title="verbs", metavar="VERB")
        for verb in noun.verbs:
            _leaf(verbs, verb, common)


def emit(data: object) -> None:
    """`data` as indented JSON on stdout."""
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(data)) + b"\n")
    sys.stdout.flush()


def tenant_filter(parser: argparse.ArgumentParser) -> None:
    """A list's `--tenant`: only that tenant's (every tenant's where left out)."""
    parser.add_argument("--tenant", default="", help="only this tenant's")


def show(args: argparse.Namespace, data: object, text: str) -> int:
    """A table (`text`) for people on stdout, or `data` as JSON with `--json`."""
    if args.json:
        emit(data)
    else:
        print(text)
    return 0


def done(args: argparse.Namespace, data: object, sentence: str) -> int:
    """What a change did, one sentence on stderr; `data` on stdout too with `--json`."""
    print(sentence, file=sys.stderr)
    if args.json:
        emit(data)
    return 0


class Reach(NamedTuple):
    """Where `llmgw ctl` connects and how it signs in; `up`: the running `llmgw up` it found."""

    url: str
    creds: str
    home: Path
    up: bool


def reach(args: argparse.Namespace) -> Reach:
    """The NATS and credentials of the llmgw to operate: as given (`--nats-url`, `--creds`,
    $LLMGW_CREDS), else what the `llmgw up` running over the data directory (`--data-dir`,
    $LLMGW_HOME, ~/.local/share/llmgw) wrote there: its NATS URL (<data>/up/up.json, while its
    process lives) and the operator's credentials (<data>/creds/ctl.nk)."""
    home = data_home(args.data_dir)
    running = running_up(home)
    url = args.nats_url or (running.nats_url if running else DEFAULT_NATS_URL)
    if args.creds is not None:
        creds = args.creds
    elif os.environ.get("LLMGW_CREDS"):
        creds = os.environ["LLMGW_CREDS"]
    else:
        creds = str(home / "creds" / "ctl.nk") if (home / "creds" / "ctl.nk").exists() else ""
    return Reach(url, creds, home, running is not None)


async def run_ctl(args: argparse.Namespace) -> int:
    """Connect to NATS, run the verb parsed into `args`, and say what went wrong if anything did."""
    if args.run is None:
        args.noun_parser.print_usage(sys.stderr)
        print(f"{args.noun_parser.prog}: name what to do; `--help` lists it", file=sys.stderr)
        return 2
    try:  # the operator's change is the root of its trace: ctl -> catalog -> scheduler -> agent
        setup_tracing("ctl", "0.1.0")
    except TracingError as exc:
        print(f"llmgw ctl: {exc}", file=sys.stderr)
        return 2
    if args.api:
        return await _run_over_api(args)
    where = reach(args)
    try:
        nc = await connect(where.url, "llmgw-ctl", patient=False, creds=where.creds, tls_ca=args.tls_ca)
    except CredentialsError as exc:
        print(f"llmgw ctl: {exc.message}{_not_up(args, where)}", file=sys.stderr)
        return 2
    except BusError as exc:
        print(f"llmgw ctl: {exc.message}{_not_up(args, where)}", file=sys.stderr)
        return 1
    try:
        return await _run_verb(nc, args)
    finally:
        await nc.close()


async def _run_verb(nc: Client | AdminApi, args: argparse.Namespace) -> int:
    """The verb's exit status; a refusal or failure said in one line (status 1)."""
    try:
        with _tracer.start_as_current_span(f"llmgw ctl {args.noun_parser.prog.split()[-1]} {args.verb or ''}".strip()):
            return await args.run(nc, args)
    except msgspec.ValidationError as exc:
        print(f"llmgw ctl: {plainly(exc)}", file=sys.stderr)
        return 1
    except (BusError, msgspec.DecodeError, OSError, ValueError) as exc:
        print(f"llmgw ctl: {exc}", file=sys.stderr)
        return 1


async def _run_over_api(args: argparse.Namespace) -> int:
    """The verb through a router's admin API (`--api`), with the key in $LLMGW_API_KEY."""
    key = os.environ.get(API_KEY_ENV, "").strip()
    if not key:
        print(
            f"llmgw ctl: --api sends your API key: put it in ${API_KEY_ENV} (never on the command line)",
            file=sys.stderr,
        )
        return 2
    return await _run_verb(AdminApi(args.api, key), args)


def _not_up(args: argparse.Namespace, where: Reach) -> str:
    """What to add to a failed connection where ctl looked for a running `llmgw up` and found none."""
    if args.nats_url or where.up:
        return ""
    return (
        f"; no `llmgw up` is running over {where.home}: start one, or name its data directory "
        "(--data-dir, or LLMGW_HOME) or its NATS (--nats-url)"
    )
