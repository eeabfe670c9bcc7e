"""When `llmgw up` starts a process that died again: a backoff decided from the times passed in
(no clock read here), and how a process ended, in words; without I/O."""

from __future__ import annotations

import signal

import msgspec

__all__ = ["Backoff", "Keeper", "StoreWatch", "how_it_ended"]


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """How long to wait before starting a dead process again."""

    first_s: float = 0.5
    """The wait after a death that follows a steady run."""
    most_s: float = 10.0
    """The longest wait: deaths in a row double the wait up to this."""
    steady_s: float = 30.0
    """A process that ran this long before it died starts from `first_s` again."""


class Keeper:
    """One process's restarts: when it started, when it is due to start again."""

    def __init__(self, policy: Backoff, now: float) -> None:
        self.policy = policy
        self.started_at = now
        self.next_s = policy.first_s
        self.due_at: float | None = None
        """When to start it again; None while it runs."""

    def ended(self, now: float) -> float:
        """It died at `now`: the wait before it starts again (also kept as `due_at`)."""
        if now - self.started_at >= self.policy.steady_s:
            self.next_s = self.policy.first_s
        wait = self.next_s
        self.next_s = min(self.next_s * 2, self.policy.most_s)
        self.due_at = now + wait
        return wait

    def due(self, now: float) -> bool:
        """Whether it is dead and its wait is over."""
        return self.due_at is not None and now >= self.due_at

    def started(self, now: float) -> None:
        """It was started again at `now`."""
        self.started_at = now
        self.due_at = None


class StoreWatch:
    """Whether nats-server must be started again for its store: a write that failed (a full disk)
    leaves JetStream's file store refusing every write until the server starts again, even once
    there is room (seen: still failing 180 s after space was freed). It is due once the server
    said so in its log (or its disk was seen full) and the disk has `room_mb` free again."""

    SIGN = "Critical write error"
    """What nats-server logs when its file store stops writing."""

    def __init__(self, room_mb: float = 64.0) -> None:
        self.room_mb = room_mb
        self.broken = False

    def read(self, lines: list[str]) -> None:
        """The server's new log lines."""
        self.broken = self.broken or any(self.SIGN in line for line in lines)

    def due(self, free_mb: float) -> bool:
        """Whether to start it again now, with `free_mb` free on its store's disk (a disk seen
        full counts as the sign too: the server's log is on it, and may not have taken the line)."""
        self.broken = self.broken or free_mb < 1
        return self.broken and free_mb >= self.room_mb

    def restarted(self) -> None:
        """It was started again: its store writes."""
        self.broken = False


def how_it_ended(returncode: int) -> str:
    """A Popen return code in words: 'exited with code 1', 'was killed by SIGKILL'."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"
