"""`llmgw console`: the terminal console (Textual) over the operators' operations: the fleet, the
models and their every change, the Hub searched, fetched and served, keys and usage.

Textual is imported when the console runs (or `ConsoleApp` is asked for), not with the parser:
every `llmgw` command and service builds this parser, and Textual is a third of a second."""

from __future__ import annotations

import argparse
import asyncio
import sys

from llmgw.ctl.tree import reach
from llmgw.ctl.tui.words import LANGUAGES, Words

__all__ = ["ConsoleApp", "Words", "add_console_parser"]


def __getattr__(name: str):
    if name == "ConsoleApp":
        from llmgw.ctl.tui.app import ConsoleApp

        return ConsoleApp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


async def _run(args: argparse.Namespace) -> int:
    from llmgw.bus import BusError, CredentialsError, connect
    from llmgw.ctl.tui.app import ConsoleApp

    where = reach(args)
    try:
        nc = await connect(where.url, "llmgw-console", patient=False, creds=where.creds, tls_ca=args.tls_ca)
    except (CredentialsError, BusError) as exc:
        print(f"llmgw console: {exc.message}", file=sys.stderr)
        return 2
    try:
        await ConsoleApp(nc, Words(args.lang)).run_async()
    finally:
        await nc.close()
    return 0


def _console(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


def add_console_parser(sub: argparse._SubParsersAction) -> None:
    """`llmgw console [--lang tr] [--nats-url ...] [--data-dir ...] [--creds ...]`."""
    console = sub.add_parser(
        "console",
        help="the terminal console: fleet, models, the Hub, keys (keyboard first; ? lists the keys)",
        description="The terminal console, signed in as `llmgw ctl` is (the same NATS and credentials).",
    )
    console.add_argument("--nats-url", help="the NATS to operate (default: the running `llmgw up`'s)")
    console.add_argument("--data-dir", help="the data directory of the `llmgw up` to operate")
    console.add_argument("--creds", help="the operator's NATS credentials (default: <data>/creds/ctl.nk)")
    console.add_argument("--tls-ca", default="", help="CA file of the NATS server's certificate")
    console.add_argument("--lang", default="", choices=["", *LANGUAGES], help="en or tr (default: from $LANG)")
    console.set_defaults(run=_console)
