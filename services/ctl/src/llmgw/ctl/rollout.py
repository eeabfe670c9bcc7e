"""A machine's upgrade, done by its supervisor (`llmgw up`, `llmgw node join`) in its loop: when
its agent passes on a request for another installed release (<data>/up/release-ask.json), the
processes it keeps are replaced one at a time, the services first, the router next and the agent
last, each ready (its /readyz) before the next goes. The router's successor listens beside it on
the same port (SO_REUSEPORT) until it is ready, then the old one drains: no connection is refused.
The agent is stopped with SIGUSR1, which leaves its ready engines for the next agent to adopt: no
replica stops. A step that fails pauses the upgrade, said in <data>/up/release.json; asking
again resumes it, asking for the previous release rolls back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import msgspec

from llmgw.bus import free_port, read_release, read_release_ask, release_python, write_release
from llmgw.ctl.keeper import how_it_ended
from llmgw.ctl.supervise import Kept
from llmgw.proto.release import INSTALLED, Release

__all__ = ["ORDER", "READY_S", "Rollout"]

ORDER = ("catalog", "mirror", "scheduler", "router", "agent")
"""What an upgrade replaces, in this order (those a machine keeps)."""
READY_S = 180.0
"""A process not ready this long after it started pauses the upgrade."""
_STOP_S = 30.0
"""How long a process has to exit before it is killed (the router: its drain beside)."""
_LOOK_S = 0.5


class _Step(msgspec.Struct):
    name: str
    phase: str
    """'stopping' (the old one), 'waiting' (for the new one to be ready)."""
    old: subprocess.Popen
    began: float
    was: tuple[str, int]
    """The release it ran and its admin port: where a failed step goes back to."""


class Rollout:
    """This machine's release and its upgrades (`tend` it in the supervisor's loop)."""

    def __init__(self, home: Path, say: Callable[[str], None] = print) -> None:
        self.home, self.say = home, say
        self.kept: dict[str, Kept] = {}
        self.ports: dict[str, int] = {}
        self.ports_changed: Callable[[], None] = lambda: None
        found = read_release(home) or Release()
        if found.state == "running":  # this supervisor stopped in the middle of it
            found = msgspec.structs.replace(found, state="failed", error="the supervisor restarted during the upgrade")
        self.release = found
        self.step: _Step | None = None
        self.leaving: list[tuple[subprocess.Popen, float]] = []
        self._ask_seen = self._ask_mtime()
        self._next_look = 0.0

    def python(self, name: str) -> str:
        """The Python that runs process `name`: its release's (the supervisor's own where that
        is not installed any more, said)."""
        version = self.release.runs.get(name, self.release.version)
        try:
            return str(release_python(self.home, version, sys.executable))
        except ValueError as exc:
            self.say(f"llmgw: {name}: {exc}; running it with {sys.executable}")
            return sys.executable

    def port(self, name: str, first: int) -> int:
        """Process `name`'s admin port: `first` until an upgrade gives it another (the router's)."""
        return self.ports.setdefault(name, first)

    def keep(self, kept: dict[str, Kept], ports_changed: Callable[[], None] = lambda: None) -> None:
        """What it replaces (started already; their admin ports as `port` gave them: the router's
        changes on an upgrade, and `ports_changed` is told), and its first word on what runs here."""
        self.kept, self.ports_changed = kept, ports_changed
        runs = {n: self.release.runs.get(n, self.release.version) for n in ORDER if n in kept}
        self._save(runs=runs)

    def _ask_mtime(self) -> float:
        with contextlib.suppress(OSError):
            return (self.home / "up" / "release-ask.json").stat().st_mtime
        return 0.0

    def _save(self, **change: object) -> None:
        self.release = msgspec.structs.replace(self.release, **change, changed=time.time())
        write_release(self.home, self.release)

    def tend(self, now: float) -> None:
        """Take up a new request, or move the upgrade under way on."""
        self._end_leaving(now)
        if now < self._next_look:
            return
        self._next_look = now + _LOOK_S
        if self.step is not None:
            self._advance(now)
            return
        mtime = self._ask_mtime()
        if mtime == self._ask_seen:
            return
        self._ask_seen = mtime
        ask = read_release_ask(self.home)
        if ask is not None and (ask.version != self.release.version or self.release.state == "failed"):
            self._begin(ask.version, now)

    def _begin(self, version: str, now: float) -> None:
        if version != self.release.version:
            previous = self.release.version if self.release.state != "failed" else self.release.previous
            steps = [n for n in ORDER if n in self.kept]
            self._save(version=version, previous=previous, state="running", steps=steps, done=0, error="")
        else:
            self._save(state="running", error="")
        self.say(f"llmgw: upgrading this machine to {version}: {', '.join(self.release.steps)}, one at a time")
        try:
            release_python(self.home, version, sys.executable)
        except ValueError as exc:
            self._fail(str(exc))
            return
        self._next(now)

    def _next(self, now: float) -> None:
        """Start the next step that is not on the release yet, or end the upgrade."""
        release, steps = self.release, self.release.steps
        done = release.done
        while done < len(steps) and release.runs.get(steps[done]) == release.version and self._serving(steps[done]):
            done += 1  # on it already (a resumed or rolled back upgrade)
        if done == len(steps):
            self._save(done=done, state="done", waiting_for="")
            self.say(f"llmgw: this machine runs {release.version} now")
            return
        name = steps[done]
        kept = self.kept[name]
        kept.held = True
        was = (release.runs.get(name, release.previous or INSTALLED), self.ports[name])
        runs = {**release.runs, name: release.version}
        old = kept.proc
        if name == "router":  # its successor beside it on the same socket, on an admin port of its own
            self.ports[name] = free_port()
            self._save(done=done, runs=runs, waiting_for=f"the router on {release.version} to be ready")
            kept.proc = kept.start()
            self.step = _Step(name, "waiting", old, now, was)
        else:
            old.send_signal(signal.SIGUSR1 if name == "agent" else signal.SIGTERM)
            self._save(done=done, runs=runs, waiting_for=f"the {name} on {was[0]} to stop")
            self.step = _Step(name, "stopping", old, now, was)
        self.say(f"llmgw: upgrade to {release.version}: {name} ({done + 1} of {len(steps)})")

    def _serving(self, name: str) -> bool:
        return self.kept[name].proc.poll() is None and self._ready(name)

    def _advance(self, now: float) -> None:
        step = self.step
        assert step is not None
        kept = self.kept[step.name]
        if step.phase == "stopping":
            if step.old.poll() is None:
                if now - step.began > _STOP_S:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(step.old.pid, signal.SIGKILL)
                return
            kept.proc = kept.start()
            step.phase, step.began = "waiting", now
            self._save(waiting_for=f"the {step.name} on {self.release.version} to be ready")
            return
        if kept.proc.poll() is not None:
            ended = how_it_ended(kept.proc.returncode)
            said = f"{ended} at start, saying: {_last_line(kept.log)}"
            self._fail(f"the {step.name} on {self.release.version} {said} (its log: {kept.log})")
        elif self._ready(step.name):
            if step.name == "router":
                self.ports_changed()
                step.old.terminate()  # it drains what it holds, then exits
                self.leaving.append((step.old, now + _STOP_S))
            kept.held, self.step = False, None
            kept.keeper.started(now)
            self._save(done=self.release.done + 1)
            self._next(now)
        elif now - step.began > READY_S:
            late = f"was not ready within {READY_S:g} s; its log: {kept.log}"
            self._fail(f"the {step.name} on {self.release.version} {late}")

    def _fail(self, why: str) -> None:
        """Pause: the failed step's process goes back to the release it ran (the old router, still
        serving, is kept; another is started again by its keeper), the rest stay as they are."""
        step, runs = self.step, dict(self.release.runs)
        if step is not None:
            kept, (version, port) = self.kept[step.name], step.was
            runs[step.name] = version
            if step.phase == "waiting" and step.name == "router":
                kept.proc.terminate()
                self.leaving.append((kept.proc, time.monotonic() + _STOP_S))
                kept.proc, self.ports[step.name] = step.old, port
            elif kept.proc.poll() is None:
                kept.proc.terminate()  # its keeper starts it again on the release it ran
            kept.held, self.step = False, None
        self._save(state="failed", error=why, waiting_for="", runs=runs)
        self.say(f"llmgw: upgrade to {self.release.version} paused: {why}")

    def stop(self) -> None:
        """Before the supervisor stops what it keeps: the processes an upgrade holds aside (an old
        router draining, the old one of a step under way) are stopped and waited for."""
        held = [proc for proc, _ in self.leaving]
        if self.step is not None and self.step.old.poll() is None:
            held.append(self.step.old)
        for proc in held:
            proc.terminate()
        for proc in held:
            try:
                proc.wait(_STOP_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

    def _ready(self, name: str) -> bool:
        url = f"http://127.0.0.1:{self.ports[name]}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=0.3) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _end_leaving(self, now: float) -> None:
        for proc, kill_at in list(self.leaving):
            if proc.poll() is not None:
                self.leaving.remove((proc, kill_at))
            elif now > kill_at:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


def _last_line(log: Path) -> str:
    """What a process wrote last to its log (its last words when it failed)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 2000))
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "nothing"
    return lines[-1][:300] if lines else "nothing"
