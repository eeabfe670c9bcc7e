"""Where a running `llmgw up` is: the state it writes in its data directory (<data>/up/up.json),
read by `llmgw ctl` to reach it."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

__all__ = ["UpState", "running_up", "write_up_state"]


class UpState(msgspec.Struct, kw_only=True):
    """What `llmgw up` says of itself while it runs."""

    base_url: str
    nats_url: str
    pid: int


def _path(home: Path) -> Path:
    return home / "up" / "up.json"


def write_up_state(home: Path, state: UpState) -> None:
    """Write `state` whole (a reader never sees half of it)."""
    part = _path(home).with_suffix(".part")
    part.write_bytes(msgspec.json.encode(state))
    part.replace(_path(home))


def running_up(home: Path) -> UpState | None:
    """The state of the `llmgw up` running over `home` (None: none is, or its file does not read)."""
    try:
        state = msgspec.json.decode(_path(home).read_bytes(), type=UpState)
        os.kill(state.pid, 0)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return state
