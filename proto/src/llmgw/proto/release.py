"""A machine's release and its upgrades: each machine's supervisor (`llmgw up`, `llmgw node join`)
runs what it keeps with one installed release's Python, and replaces them one at a time when its
agent is asked for another (`llmgw ctl upgrade`, machine by machine)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from llmgw.proto._endpoint import Endpoint, Event
from llmgw.proto._types import Empty, Name

__all__ = [
    "INSTALLED",
    "RELEASE_CHANGED",
    "RELEASE_LIST",
    "RELEASE_SET",
    "Release",
    "ReleaseAsk",
    "Version",
]

INSTALLED = "installed"
"""The release a supervisor was started from (its own Python), before any upgrade."""

Version = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")]
"""A release's name: its folder under <data>/releases/ ('installed': the supervisor's own)."""


class Release(Struct, kw_only=True):
    """What a machine runs, and how far its latest upgrade is."""

    node: str = ""
    version: str = INSTALLED
    """The release asked for last (what every step runs once it is done)."""
    previous: str = ""
    """The release before it ('': none): what a rollback goes back to."""
    state: Literal["idle", "running", "done", "failed", "unsupervised"] = "idle"
    """idle: never upgraded; running: replacing its processes; done; failed: paused at a step
    (asking again resumes there); unsupervised: not run by `llmgw up` or `node join`."""
    steps: list[str] = field(default_factory=list)
    """What it replaces, in order: the services, the router, its agent last."""
    done: int = 0
    """How many of `steps` run `version` and are ready."""
    runs: dict[str, str] = field(default_factory=dict)
    """The release each process runs now, by process."""
    waiting_for: str = ""
    """What the step under way waits for, in words."""
    error: str = ""
    changed: float = 0.0
    """Unix time of the latest change."""


class ReleaseAsk(Struct, kw_only=True):
    """Run this installed release on one machine, one process at a time."""

    node: Name
    version: Version
    by: str = ""


RELEASE_SET = Endpoint(
    "agent",
    "release.set",
    ReleaseAsk,
    Release,
    "Replace what this machine runs with an installed release, one process at a time.",
    per_node=True,
)
RELEASE_LIST = Endpoint(
    "agent", "release.show", Empty, Release, "Each machine's release and its upgrade's progress.", every_instance=True
)
RELEASE_CHANGED = Event("release", Release, "A machine's upgrade moved on (or ended).", ("node",), "agent")
