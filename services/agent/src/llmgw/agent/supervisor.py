"""The child processes of the agent (engines and llama.cpp RPC workers alike): started, waited for
until they serve, their output kept, their exit watched, stopped gracefully (then killed).

Each child runs in a process group of its own and writes its output to a file of its own (the
agent copies it to its log, secrets hidden), so it needs no agent to write to. Its pid is noted
in a file until it ends. A child that `survives` (an engine) keeps serving when the agent dies,
and a restarted agent is handed it (`Left`) to adopt or end; any other (a worker) dies with the
agent (PR_SET_PDEATHSIG), and what a hard-killed agent left of those is ended at the next start.
What differs between children is passed in (`ChildSpec`): the command, the check that it
serves, and what to do when it exits.

An engine whose agent never comes back serves on, unknown to the scheduler once it replaced
it: starting the agent again adopts it and the scheduler has it stopped (it was replaced), or
an operator ends it by its note (`kill -TERM -<pid>`, the pid in <data_dir>/agent/engines/
<replica>.json). Under systemd the agent's unit needs KillMode=process for engines to outlive
an agent that crashed or was restarted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
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

__all__ = ["Child", "ChildSpec", "Left", "StartFailed", "Supervisor", "find_left"]

LOG_TAIL = 40
"""Last lines of a child's output kept (a failed replica's report carries them)."""
LAST_WORDS_S = 2.0
"""How long a child that failed has to finish printing why."""
READ_EVERY_S = 0.1
"""How often a child's output file is read for new lines."""
OUTPUT_KEPT = 1 << 20
"""A child's output file is emptied once this much of it was copied to its log (a line it
prints at that very moment may be lost)."""
POLL_S = 0.2
"""How often an adopted child (not this agent's own: it cannot wait for it) is looked at."""


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
    note: dict[str, object] = field(default_factory=dict)
    """What its pid note says of it besides pid and start (replica, model; what an engine is
    adopted by)."""
    secrets: tuple[str, ...] = ()
    """Hidden from its log and its last lines (an engine's key, which it may print)."""
    survives: bool = False
    """Keeps running when the agent dies, for the next agent to adopt (an engine); else it dies
    with the agent."""


@dataclass(frozen=True, kw_only=True)
class Left:
    """A child that survived a previous agent: the same process its note names, still running."""

    name: str
    pid: int
    note: dict
    cmdline: list[str]
    """Its command line as the system says it now."""


def _same(note: dict) -> psutil.Process | None:
    """The process a note names if it still runs and is that one (started by the time the note
    was written, not a later program given the same pid), else None."""
    try:
        proc = psutil.Process(int(note["pid"]))
        if proc.create_time() <= float(note["started"]) + 1 and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (ValueError, KeyError, TypeError, psutil.Error):
        pass
    return None


def find_left(folder: Path) -> tuple[list[Left], list[dict]]:
    """What a previous agent of this node left: the children that survive it and still run (their
    notes kept, for the caller to adopt or end), and those ended here (the others still running:
    a worker, or a child that ignored PR_SET_PDEATHSIG). A note of a child gone, or whose pid
    another program has now, is removed (that program left alone).
    """
    left, ended = [], []
    for note_path in sorted(folder.glob("*.json")):
        try:
            note = msgspec.json.decode(note_path.read_bytes())
        except (OSError, msgspec.DecodeError):
            note = {}
        proc = _same(note) if isinstance(note, dict) else None
        if proc is not None and note.get("survives"):
            try:
                left.append(Left(name=note_path.stem, pid=proc.pid, note=note, cmdline=proc.cmdline()))
                continue
            except psutil.Error:
                pass  # gone meanwhile
        elif proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
                ended.append({"replica": note.get("replica", ""), "model": note.get("model", ""), "pid": proc.pid})
        note_path.unlink(missing_ok=True)
        note_path.with_suffix(".out").unlink(missing_ok=True)
    return left, ended


class _Adopted:
    """A child this agent did not start (a previous one did): looked at, since it cannot be waited for."""

    def __init__(self, pid: int, started: float) -> None:
        self.pid, self.started = pid, started
        self.returncode: int | None = None
        """Set once it ended; its status is not known (-1)."""

    async def wait(self) -> int:
        """Until it ended."""
        while self.returncode is None:
            if _same({"pid": self.pid, "started": self.started}) is None:
                self.returncode = -1
            else:
                await asyncio.sleep(POLL_S)
        return self.returncode


async def _terminate(proc, grace_s: float) -> None:
    """SIGTERM to its process group, SIGKILL after `grace_s`."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        except ProcessLookupError:
            await proc.wait()


class Child:
    """One running child process, its output and last lines."""

    def __init__(self, spec: ChildSpec, proc, log: Path, note: Path, at_end: bool = False) -> None:
        self.spec, self.proc, self.note = spec, proc, note
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self.stopping = False
        """Asked to stop: its exit is no news."""
        self.pump = asyncio.create_task(self._read(note.with_suffix(".out"), log, at_end))
        self.watch: asyncio.Task | None = None

    @property
    def pid(self) -> int:
        """Its pid (and its process group's)."""
        return self.proc.pid

    async def _read(self, output: Path, log: Path, at_end: bool) -> None:
        """Copy what it prints to its log, secrets hidden, keeping its last lines, until it ended
        and all of it was read (from the end of what it printed before, `at_end`: adopted)."""
        output.touch(exist_ok=True)  # gone (removed by hand): nothing more of it is read
        with open(output, "rb") as src, open(log, "ab") as out:
            if at_end:
                src.seek(0, os.SEEK_END)
            rest = b""
            while True:
                ended = self.proc.returncode is not None
                chunk = src.read(1 << 16)
                if chunk:
                    *lines, rest = (rest + chunk).split(b"\n")
                    for raw in lines:
                        self._line(out, raw)
                    continue
                if ended:
                    if rest:
                        self._line(out, rest)
                    return
                if src.tell() > OUTPUT_KEPT:
                    os.truncate(output, 0)
                    src.seek(0)
                await asyncio.sleep(READ_EVERY_S)

    def _line(self, out, raw: bytes) -> None:
        line = redact(raw.decode(errors="replace"), self.spec.secrets)
        out.write(f"{line}\n".encode())
        out.flush()
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
        await _terminate(self.proc, grace_s)
        await self.last_words()
        self.forget()

    def forget(self) -> None:
        """Its pid note and output file go (it ended)."""
        self.note.unlink(missing_ok=True)
        self.note.with_suffix(".out").unlink(missing_ok=True)

    def leave(self) -> None:
        """Stop watching it and copying its output, leaving it running and noted (for the next agent)."""
        self.stopping = True
        for task in (self.pump, self.watch):
            if task is not None:
                task.cancel()


class Supervisor:
    """The agent's children, by name: their logs under `logs`, their pid notes under `notes`."""

    def __init__(self, logs: Path, notes: Path, grace_s: float) -> None:
        self.logs, self.notes, self.grace_s = logs, notes, grace_s
        self.children: dict[str, Child] = {}

    async def prepare(self) -> tuple[list[Left], list[dict]]:
        """Make its folders; what a previous agent left (`find_left`): the children to adopt or
        end, and those ended."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.notes.mkdir(parents=True, exist_ok=True)
        return await asyncio.to_thread(find_left, self.notes)

    def pids(self) -> set[int]:
        """The pids of the children running now."""
        return {c.pid for c in self.children.values()}

    async def start(self, spec: ChildSpec) -> Child:
        """Start it and wait until it serves, then watch for its exit. A child that does not come
        up is stopped (its last lines kept) and StartFailed raised, leaving nothing behind."""
        note = self.notes / f"{spec.name}.json"
        fd = os.open(note.with_suffix(".out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.launch.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                env={**os.environ, **spec.launch.env},
                start_new_session=True,
                preexec_fn=None if spec.survives else die_with_parent,
            )
        finally:
            os.close(fd)
        note.write_bytes(
            msgspec.json.encode({**spec.note, "pid": proc.pid, "started": time.time(), "survives": spec.survives})
        )
        child = Child(spec, proc, self.logs / f"{spec.name}.log", note)
        self.children[spec.name] = child
        try:
            await child.wait_up()
        except StartFailed as exc:
            await self._end(child)
            exc.tail = list(child.tail)
            raise
        except BaseException:  # a stop while it starts (cancelled): nothing half-started stays
            await self._end(child)
            raise
        child.watch = asyncio.create_task(self._watch(child))
        return child

    def adopt(self, spec: ChildSpec, left: Left) -> Child:
        """Watch a child a previous agent left (found by `prepare`) as if started here."""
        note = self.notes / f"{left.name}.json"
        child = Child(spec, _Adopted(left.pid, float(left.note["started"])), self.logs / f"{spec.name}.log", note, True)
        self.children[spec.name] = child
        child.watch = asyncio.create_task(self._watch(child))
        return child

    async def end(self, left: Left) -> None:
        """End a child a previous agent left that is not adopted (SIGTERM, SIGKILL after the grace)."""
        await _terminate(_Adopted(left.pid, float(left.note["started"])), self.grace_s)
        (self.notes / f"{left.name}.json").unlink(missing_ok=True)
        (self.notes / f"{left.name}.out").unlink(missing_ok=True)

    async def _watch(self, child: Child) -> None:
        code = await child.proc.wait()
        await child.pump
        child.forget()
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

    def leave(self, name: str) -> None:
        """Leave the child of that name running for the next agent (`Child.leave`)."""
        child = self.children.pop(name, None)
        if child is not None:
            child.leave()
