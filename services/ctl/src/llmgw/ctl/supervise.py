"""The processes `llmgw up` (and `llmgw node join`) start and keep: each started again after a
backoff when it dies (`keeper`), said in one line; nats-server started again once its full disk
has room (`StoreKeeper`); all stopped in order, the router drained first (`stop_in_order`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from llmgw.bus import BusError, NatsServer, die_with_parent, start_nats_server
from llmgw.ctl.keeper import Backoff, Keeper, StoreWatch, how_it_ended

__all__ = ["Kept", "StoreKeeper", "listening", "spawn_nats", "spawn_service", "stop_in_order"]


class Kept:
    """A process `up` started and starts again when it dies (`start` makes it)."""

    def __init__(
        self,
        name: str,
        start: Callable[[], subprocess.Popen],
        log: Path,
        policy: Backoff,
        running: subprocess.Popen | None = None,
    ) -> None:
        self.name, self.start, self.log = name, start, log
        self.proc = running or start()
        self.keeper = Keeper(policy, time.monotonic())
        self.held = False
        """An upgrade is replacing it: `tend` leaves it to the upgrade."""

    def restart(self, now: float) -> None:
        """Stop it (SIGTERM, then SIGKILL after 10 s) and start it again at once."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.keeper.started(now)
        try:
            self.proc = self.start()
        except BusError as exc:  # not listening yet: `tend` tries again after the backoff
            wait = self.keeper.ended(now)
            print(f"llmgw up: {self.name} did not start: {exc.message}; trying again in {wait:g} s", flush=True)

    def tend(self, now: float) -> None:
        """Notice that it died (said in one line), or start it again once its wait is over."""
        if self.held:
            return
        if self.keeper.due(now):
            self.keeper.started(now)
            try:
                self.proc = self.start()
            except BusError as exc:  # nats-server that did not listen: try again later
                wait = self.keeper.ended(now)
                print(f"llmgw up: {self.name} did not start: {exc.message}; trying again in {wait:g} s", flush=True)
        elif self.keeper.due_at is None and self.proc.poll() is not None:
            ran = now - self.keeper.started_at
            wait = self.keeper.ended(now)
            print(
                f"llmgw up: {self.name} {how_it_ended(self.proc.returncode)} after {ran:.1f} s; "
                f"starting it again in {wait:g} s (its log: {self.log})",
                flush=True,
            )


class StoreKeeper:
    """Starts nats-server again where its file store stopped writing (a full disk) and there is
    room again (`keeper.StoreWatch`), reading its log as it grows; says so in one line."""

    def __init__(self, nats: Kept, store: Path) -> None:
        self.nats, self.store, self.watch = nats, store, StoreWatch()
        self.read_to = nats.log.stat().st_size if nats.log.exists() else 0
        self.next_at = 0.0

    def tend(self, now: float) -> None:
        """Once a second: the log's new lines, then the disk, then perhaps a restart."""
        if now < self.next_at:
            return
        self.next_at = now + 1.0
        with contextlib.suppress(OSError), self.nats.log.open("rb") as log:
            log.seek(self.read_to)
            data = log.read()
            self.read_to += len(data)
            self.watch.read(data.decode(errors="replace").splitlines())
        try:
            free_mb = shutil.disk_usage(self.store).free / 2**20
        except OSError:
            return
        if self.watch.due(free_mb):
            print(
                f"llmgw up: nats-server stopped writing its store when the disk was full; with "
                f"{free_mb:,.0f} MB free again, starting it again (its log: {self.nats.log})",
                flush=True,
            )
            self.nats.restart(now)
            self.watch.restarted()
            with contextlib.suppress(OSError):  # what the stopped server wrote on its way out is read
                self.read_to = self.nats.log.stat().st_size


def spawn_service(
    name: str, home: Path, bus: tuple[str, Path], admin: int, extra: list[str], python: str = sys.executable
) -> subprocess.Popen:
    """`llmgw service NAME` run by `python` (a release's) as its own process (its own process
    group: Ctrl-C reaches only its keeper, which stops it in order), its output appended to
    <home>/logs/NAME.log; `bus`: the NATS URL and the credentials it connects with."""
    nats_url, creds = bus
    held = [int(extra[extra.index("--listen-fd") + 1])] if "--listen-fd" in extra else []  # the router's socket
    cmd = [python, "-m", "llmgw.ctl", "service", name, "--nats-url", nats_url, "--data-dir", str(home)]
    cmd += ["--admin-port", str(admin), "--creds", str(creds), *extra]
    with open(home / "logs" / f"{name}.log", "ab") as log:  # the child keeps its own copy
        return subprocess.Popen(
            cmd, stdout=log, stderr=log, start_new_session=True, preexec_fn=die_with_parent, pass_fds=held
        )


def listening(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` (0: a free port) for the routers this supervisor starts
    (`--listen-fd`): it stays open here across their restarts and upgrades, so a connection
    waiting on it is taken by the next router, never refused."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def spawn_nats(home: Path, port: int, conf: Path, host: str = "127.0.0.1") -> NatsServer:
    """nats-server with configuration `conf` on `host:port`, its log in <home>/nats."""
    return start_nats_server(
        home / "nats", port=port, host=host, config=conf, start_new_session=True, preexec_fn=die_with_parent
    )


def stop_in_order(kept: dict[str, Kept], drain_s: float) -> None:
    """The router first: it stops taking requests at once and lets those in flight finish for up to
    `drain_s`. Then the agent (it stops its engines) and the services the router read from; NATS last."""
    for names, timeout in (
        (("router",), drain_s + 10),
        (("agent", "scheduler", "mirror", "catalog"), 30),
        (("nats-server",), 10),
    ):
        _terminate([kept[name].proc for name in names if name in kept], timeout)


def _terminate(procs: list[subprocess.Popen], timeout: float) -> None:
    """SIGTERM each (its own process group), then SIGKILL the group of any still running at `timeout`."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
