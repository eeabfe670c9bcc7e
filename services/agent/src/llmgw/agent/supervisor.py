"""The child processes of the agent (engines and llama.cpp RPC workers alike): started, waited for
until they serve, their output kept, their exit watched, stopped gracefully (then killed).

Each child runs in a process group of its own that dies with the agent (PR_SET_PDEATHSIG), and
its pid is noted in a file until it is reaped, so a restarted agent ends what a hard-killed one
left (`end_leftovers`). What differs between children is passed in (`ChildSpec`): the command,
the check that it serves, and what to do when it exits.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import psutil

from llmgw.agent.core import Launch, redact
from llmgw.bus import die_with_parent

__all__ = ["Child", "ChildSpec", "StartFailed", "Supervisor", "end_leftovers"]

LOG_TAIL = 40
"""Last lines of a child's output kept (a failed replica's report carries them)."""
LAST_WORDS_S = 2.0
"""How long a child that failed has to finish printing why."""


class StartFailed(Exception):
    """A child that exited or did not serve in time at start; the message says which, `tail` is
    what it printed last."""

    def __init__(self, message: str, tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.tail = tail or []


@dataclass(frozen=True, kw_only=True)
class ChildSpec:
    """What one child is: how it starts, how it is known to serve, what happens when it exits."""

    name: str
    """Its log's and pid note's name (unique among the children)."""
    launch: Launch
    up: Callable[[], Awaitable[bool]]
    """Whether it serves now (an HTTP health check, a port that accepts)."""
    timeout_s: float
    """How long it has to serve."""
    what: str
    """What errors call it ("engine")."""
    on_exit: Callable[[Child, int], Awaitable[None]]
    """Called with its status when it exits after serving, unless it was asked to stop."""
    note: dict[str, str] = field(default_factory=dict)
    """What its pid note says of it besides pid and start (replica, model)."""
    secrets: tuple[str, ...] = ()
    """Hidden from its log and its last lines (an engine's key, which it may print)."""


def end_leftovers(folder: Path) -> list[dict]:
    """End the children a previous agent of this node left (their process groups), if still running.

    Children die with their agent (PR_SET_PDEATHSIG); this catches what that cannot: an agent
    killed between fork and exec, or a child that ignored the signal. A pid now used by
    another program is left alone (its start time is after the note was written).
    """
    ended = []
    for note_path in sorted(folder.glob("*.json")):
        try:
            note = msgspec.json.decode(note_path.read_bytes())
            pid = int(note["pid"])
            started = psutil.Process(pid).create_time()
            if started <= float(note["started"]) + 1:
                os.killpg(pid, signal.SIGKILL)
                ended.append({"replica": note["replica"], "model": note.get("model", ""), "pid": pid})
        except (OSError, ValueError, KeyError, msgspec.DecodeError, psutil.Error):
            pass  # gone already, or not ours
        note_path.unlink(missing_ok=True)
    return ended


class Child:
    """One running child process, its output and last lines."""

    def __init__(self, spec: ChildSpec, proc: asyncio.subprocess.Process, log: Path, note: Path) -> None:
        self.spec, self.proc, self.note = spec, proc, note
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self.stopping = False
        """Asked to stop: its exit is no news."""
        self.pump = asyncio.create_task(self._read(log))
        self.watch: asyncio.Task | None = None

    @property
    def pid(self) -> int:
        """Its pid (and its process group's)."""
        return self.proc.pid

    async def _read(self, log: Path) -> None:
        with open(log, "ab") as out:
            async for raw in self.proc.stdout:
                line = redact(raw.decode(errors="replace"), self.spec.secrets)
                out.write(line.encode())
                self.tail.append(line.rstrip())

    async def wait_up(self) -> None:
        """Until it serves; StartFailed if it exits first or takes longer than its timeout."""
        deadline = time.monotonic() + self.spec.timeout_s
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                raise StartFailed(f"{self.spec.what} exited at start with status {self.proc.returncode}")
            if await self.spec.up():
                return
            await asyncio.sleep(0.1)
        raise StartFailed(f"{self.spec.what} not up within {self.spec.timeout_s:g}s (startup_timeout_s)")

    async def last_words(self) -> None:
        """Let it finish printing (its last lines explain a failure), for a moment at most."""
        await asyncio.wait({self.pump}, timeout=LAST_WORDS_S)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM to its process group, SIGKILL after `grace_s`; its pid note goes."""
        self.stopping = True
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                await asyncio.wait_for(self.proc.wait(), grace_s)
            except TimeoutError:
                os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
            except ProcessLookupError:
                await self.proc.wait()
        self.note.unlink(missing_ok=True)


class Supervisor:
    """The agent's children, by name: their logs under `logs`, their pid notes under `notes`."""

    def __init__(self, logs: Path, notes: Path, grace_s: float) -> None:
        self.logs, self.notes, self.grace_s = logs, notes, grace_s
        self.children: dict[str, Child] = {}

    async def prepare(self) -> list[dict]:
        """Make its folders; end what a previous agent left (said in the list returned)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.notes.mkdir(parents=True, exist_ok=True)
        return await asyncio.to_thread(end_leftovers, self.notes)

    def pids(self) -> set[int]:
        """The pids of the children running now."""
        return {c.pid for c in self.children.values()}

    async def start(self, spec: ChildSpec) -> Child:
        """Start it and wait until it serves, then watch for its exit. A child that does not come
        up is stopped (its last lines kept) and StartFailed raised, leaving nothing behind."""
        proc = await asyncio.create_subprocess_exec(
            *spec.launch.argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **spec.launch.env},
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        note = self.notes / f"{spec.name}.json"
        note.write_bytes(msgspec.json.encode({**spec.note, "pid": proc.pid, "started": time.time()}))
        child = Child(spec, proc, self.logs / f"{spec.name}.log", note)
        self.children[spec.name] = child
        try:
            await child.wait_up()
        except StartFailed as exc:
            await self._end(child)
            await child.last_words()
            exc.tail = list(child.tail)
            raise
        except BaseException:  # a stop while it starts (cancelled): nothing half-started stays
            await self._end(child)
            raise
        child.watch = asyncio.create_task(self._watch(child))
        return child

    async def _watch(self, child: Child) -> None:
        code = await child.proc.wait()
        await child.pump
        child.note.unlink(missing_ok=True)
        if self.children.get(child.spec.name) is child:
            del self.children[child.spec.name]
        if not child.stopping:
            await child.spec.on_exit(child, code)

    async def _end(self, child: Child) -> None:
        await child.stop(self.grace_s)
        if self.children.get(child.spec.name) is child:
            del self.children[child.spec.name]

    async def stop(self, name: str) -> None:
        """Stop the child of that name, if one runs (or starts)."""
        child = self.children.get(name)
        if child is not None:
            await self._end(child)
