"""`llmgw ctl upgrade VERSION`: every machine onto a release installed on it, one machine at a
time (those that run services before those that run only an agent, so never two routers at
once), each machine's processes replaced one at a time by its supervisor and ready before the
next machine goes; progress said as it comes. A failure pauses it, saying where and why; the same
command resumes it; `--rollback` takes every machine back to the release it ran before."""

from __future__ import annotations

import argparse
import asyncio
import time

from nats.aio.client import Client

from llmgw.bus import call, call_all
from llmgw.ctl.changes import BY
from llmgw.ctl.tables import table
from llmgw.ctl.tree import Verb, show
from llmgw.proto import Empty, Page, scheduler
from llmgw.proto.errors import BusError
from llmgw.proto.release import RELEASE_LIST, RELEASE_SET, Release, ReleaseAsk

__all__ = ["RELEASES", "UPGRADE"]

_POLL_S = 0.5
_PATIENCE_S = 8.0
"""How long the agents are asked again while none answers: one just replaced may not listen yet,
or be busy starting (measuring memory bandwidth on every core)."""


async def machines(
    nc: Client, patience_s: float = _PATIENCE_S, expected: frozenset[str] = frozenset()
) -> list[Release]:
    """Each machine's release as its agent says, those that run services first (more processes),
    then by name. While no agent answers, or one of the `expected` nodes does not, they are asked
    again for up to `patience_s`; where none answered in time, the next ask waits twice as long."""
    window, deadline = 1.0, time.monotonic() + patience_s
    while True:
        asked = time.monotonic()
        said = await call_all(nc, RELEASE_LIST, Empty(), window_s=window)
        found = [r for r in said if isinstance(r, Release)]
        whole = bool(found) and expected <= {r.node for r in found}
        if whole or time.monotonic() >= deadline:
            return sorted(found, key=lambda r: (-len(r.runs), r.node))
        if time.monotonic() - asked >= window:  # (the server says at once where nobody listens)
            window *= 2
        await asyncio.sleep(0.25)
        window = max(min(window, deadline - time.monotonic()), 0.1)


def releases_table(found: list[Release]) -> str:
    """`llmgw ctl releases`: what each machine runs and how far its upgrade is."""
    rows = [
        (r.node, r.version, r.previous or "-", r.state, f"{r.done}/{len(r.steps)}", r.waiting_for or r.error or "-")
        for r in found
    ]
    return table(["NODE", "RELEASE", "BEFORE", "STATE", "STEPS", "NOW"], rows)


async def _one(nc: Client, node: str) -> Release | None:
    """Machine `node`'s release now (None: its agent does not answer: it is being replaced)."""
    said = await call_all(nc, RELEASE_LIST, Empty(), window_s=1.0, until=lambda r: r.node == node)
    return next((r for r in said if isinstance(r, Release) and r.node == node), None)


async def _machine(nc: Client, release: Release, version: str, head: str, within_s: float) -> str:
    """Take one machine to `version`: '' once it runs it, else why it paused."""
    try:
        asked = await call(nc, RELEASE_SET, ReleaseAsk(node=release.node, version=version, by=BY), node=release.node)
    except BusError as exc:
        return exc.message
    said, deadline = "", time.monotonic() + within_s
    while time.monotonic() < deadline:
        await asyncio.sleep(_POLL_S)
        now = await _one(nc, release.node)
        if now is None:
            line = "its agent is being replaced; waiting for the new one to answer"
        elif _runs(now, version):
            print(f"{head}: runs {version}", flush=True)
            return ""
        elif now.version == version and now.state == "failed" and now.changed >= asked.changed:
            return now.error  # (a failure from before this ask is its supervisor not having taken it up yet)
        else:
            step = f"step {min(now.done + 1, len(now.steps))} of {len(now.steps)}" if now.steps else "starting"
            line = f"{step}, waiting for {now.waiting_for or 'its supervisor to take it up'}"
        if line != said:
            print(f"{head}: {line}", flush=True)
            said = line
    return f"not done within {within_s:g} s"


def _runs(release: Release, version: str) -> bool:
    """Whether a machine runs `version` whole (never upgraded: the release it started from)."""
    return release.version == version and release.state in ("done", "idle")


async def _ready_nodes(nc: Client) -> frozenset[str]:
    """The nodes the scheduler hears now (none where it does not answer: the agents alone say)."""
    try:
        listed = await call(nc, scheduler.NODE_LIST, Page())
    except BusError:
        return frozenset()
    return frozenset(n.node for n in listed.nodes if (h := listed.health.get(n.node)) and h.state == "ready")


async def _upgrade(nc: Client, args: argparse.Namespace) -> int:
    expected = await _ready_nodes(nc)
    found = await machines(nc, expected=expected)
    if not found:
        print("llmgw ctl upgrade: no agent answers: is the fleet running?", flush=True)
        return 1
    if silent := sorted(expected - {r.node for r in found}):
        print(
            f"llmgw ctl upgrade: the agent of {', '.join(silent)} does not answer, though the scheduler hears "
            "it: it may be starting again; ask again in a moment (`llmgw ctl nodes` shows the fleet)",
            flush=True,
        )
        return 1
    version = args.version
    if args.rollback:
        befores = sorted({r.previous for r in found if r.previous})
        if len(befores) != 1:
            print(f"llmgw ctl upgrade --rollback: the machines ran {befores or 'nothing'} before; name one", flush=True)
            return 1
        version = befores[0]
    if not version:
        print("llmgw ctl upgrade: name the release (VERSION), or --rollback", flush=True)
        return 2
    for i, release in enumerate(found, 1):
        head = f"machine {i} of {len(found)} ({release.node})"
        if _runs(release, version):
            print(f"{head}: runs {version} already", flush=True)
            continue
        print(f"{head}: upgrading to {version}: {', '.join(release.runs) or 'its processes'}", flush=True)
        why = await _machine(nc, release, version, head, args.machine_s)
        if why:
            print(
                f"llmgw ctl upgrade: paused at {head}: {why}\n"
                f"  the same command resumes it once that is mended; `llmgw ctl upgrade --rollback` goes back",
                flush=True,
            )
            return 1
    print(f"every machine runs {version}", flush=True)
    return 0


def _upgrade_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "version", nargs="?", default="", metavar="VERSION", help="the release (<data>/releases/VERSION)"
    )
    parser.add_argument("--rollback", action="store_true", help="back to the release the machines ran before")
    parser.add_argument("--machine-s", type=float, default=600.0, metavar="S", help="the most one machine may take")


async def _releases(nc: Client, args: argparse.Namespace) -> int:
    found = await machines(nc)
    return show(args, found, releases_table(found))


UPGRADE = Verb(
    "upgrade",
    "every machine onto an installed release, one at a time, services before agents",
    "llmgw ctl upgrade 0.2.0",
    "each machine's supervisor replaces its processes one at a time; `llmgw ctl releases` shows where it is",
    _upgrade,
    _upgrade_arguments,
)
RELEASES = Verb(
    "releases",
    "what each machine runs and how far its upgrade is",
    "llmgw ctl releases",
    "`llmgw ctl upgrade VERSION` moves them on",
    _releases,
)
