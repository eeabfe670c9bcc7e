"""Faults under `llmgw up` stay small: kill -9 of any process it started, under steady clients, is
noticed, said and mended by `up` itself; a stop under load lets the streams in flight finish.

Real processes as in tests/test_up.py. Each case prints its figures (requests sent, failed and how,
seconds until the killed process was back, engines and orphans after). A service that dies at start,
the catalog case and the drained stop run in `./dev test`; the other kills are `chaos` (`just chaos`).
"""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from llmgw.bus import call
from llmgw.proto import Empty, scheduler
from llmgw.proto.errors import BusError
from tests.test_up import DEMO, Up  # the running `llmgw up` the other tests use

CLIENTS = 4
STREAM_TOKENS = 64
"""A stream in flight while `up` stops (the stop is sent on its first token), short enough to end
well within `up`'s drain_s (10 s) while other tests load the machine: the demo model, SmolLM2-135M,
writes about 100 tokens a second on 2 cores left to it."""
RECOVER_S = 120
"""The longest a case waits for what was killed to be back (generous: not a speed)."""


class Load:
    """Steady clients in a thread: small completions, one after another, each outcome kept."""

    def __init__(self, up: Up) -> None:
        self.url = f"{up.base_url}/completions"
        self.headers = {"authorization": f"Bearer {up.key}"}
        self.outcomes: list[tuple[float, str]] = []
        """(when it ended, 'ok' | 'refused' | 'cut' | 'status NNN')"""
        self.done = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> "Load":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(60)

    async def _run(self) -> None:
        await asyncio.gather(*(self._client() for _ in range(CLIENTS)))

    async def _client(self) -> None:
        body = {"model": DEMO, "prompt": "hi", "max_tokens": 2}
        async with httpx.AsyncClient(timeout=30) as client:
            while not self.done.is_set():
                try:
                    r = await client.post(self.url, headers=self.headers, json=body)
                    outcome = "ok" if r.status_code == 200 else f"status {r.status_code}"
                except httpx.ConnectError:
                    outcome = "refused"
                except httpx.TransportError:
                    outcome = "cut"
                self.outcomes.append((time.monotonic(), outcome))
                await asyncio.sleep(0.05 if outcome == "ok" else 0.2)

    def figures(self, since: float = 0.0) -> dict[str, int]:
        """Requests ended after `since`, counted by outcome, and `sent`."""
        out: dict[str, int] = {}
        for when, outcome in self.outcomes:
            if when >= since:
                out[outcome] = out.get(outcome, 0) + 1
        out["sent"] = sum(out.values())
        return out

    def served_since(self, since: float) -> bool:
        """Whether a request that ended after `since` was answered."""
        return any(when >= since and outcome == "ok" for when, outcome in self.outcomes)


def _keep_reading(up: Up) -> None:
    """Read what `up` prints after its start into `up.lines` (its pipe never fills)."""

    def read() -> None:
        for line in up.proc.stdout:
            up.lines.append(line)

    threading.Thread(target=read, daemon=True).start()


def _child(up: Up, name: str) -> psutil.Process:
    """The process `up` started for `name` (a service, or 'nats-server')."""
    for proc in psutil.Process(up.proc.pid).children():
        try:
            cmd = proc.cmdline()
        except psutil.Error:  # gone, or dead and not yet reaped
            continue
        if (name == "nats-server" and proc.name() == "nats-server") or cmd[3:5] == ["service", name]:
            return proc
    raise AssertionError(f"`llmgw up` runs no {name}")


def _started(up: Up, name: str) -> list[dict]:
    """`name`'s 'started' log lines, oldest first."""
    return [
        json.loads(line)
        for line in (up.home / "logs" / f"{name}.log").read_text().splitlines()
        if line.startswith("{") and '"event": "started"' in line
    ]


def _admin(up: Up, name: str) -> str | None:
    """The admin URL in `name`'s newest 'started' log line."""
    started = _started(up, name)
    return f"http://127.0.0.1:{started[-1]['admin_port']}" if started else None


def _ready(up: Up, names: list[str]) -> bool:
    """Whether each named service says ready on its /readyz."""
    for name in names:
        try:
            if httpx.get(f"{_admin(up, name)}/readyz", timeout=2).status_code != 200:
                return False
        except httpx.TransportError:
            return False
    return True


def _engines(up: Up) -> list[psutil.Process]:
    """Every llama-server serving from this `up`'s data (by its command line)."""
    out = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if "llama-server" in (proc.info["name"] or "") and str(up.home) in " ".join(proc.info["cmdline"] or []):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
        except psutil.NoSuchProcess:
            pass
    return out


def _replica_ports(up: Up) -> set[int]:
    """The ports of the engines the scheduler's replicas name."""

    async def ask(nc):
        return (await call(nc, scheduler.REPLICA_LIST, Empty())).replicas

    return {urlsplit(r.url).port for r in up.nats(ask) if r.url}


def _port(engine: psutil.Process) -> int | None:
    cmd = engine.cmdline()
    return int(cmd[cmd.index("--port") + 1]) if "--port" in cmd else None


def _one_engine_and_no_orphan(up: Up, timeout: float = 60) -> tuple[int, int]:
    """(engines, orphans) once there is exactly one engine and a replica names it, or at `timeout`.
    An orphan: an engine no replica names (an agent that adopts its engines is their parent no more)."""
    deadline = time.monotonic() + timeout
    while True:
        engines = _engines(up)
        try:
            named = _replica_ports(up)
            orphans = [p for p in engines if _port(p) not in named]
        except (BusError, psutil.Error):  # NATS or the scheduler still coming back; an engine gone
            orphans = engines
        if (len(engines) == 1 and not orphans) or time.monotonic() > deadline:
            return len(engines), len(orphans)
        time.sleep(0.3)


SERVICES = ["catalog", "mirror", "scheduler", "router", "agent"]


def _kill_and_watch(up: Up, name: str) -> dict:
    """kill -9 `name` under steady clients; its figures once it is back and serving."""
    before = _child(up, name)
    starts = 0 if name == "nats-server" else len(_started(up, name))

    def back() -> bool:  # a new process that said it started (its admin port is the same one: up keeps it)
        try:
            now = _child(up, name)
        except AssertionError:
            return False
        fresh = now.pid != before.pid and (name == "nats-server" or len(_started(up, name)) > starts)
        return fresh and _ready(up, SERVICES)

    with Load(up) as load:
        time.sleep(2)
        killed_at = time.monotonic()
        before.send_signal(signal.SIGKILL)
        back_s = _within(RECOVER_S, back)
        if back_s is not None:  # and serving: a request answered after it was back
            ready_at = killed_at + back_s
            served = _within(RECOVER_S, lambda: load.served_since(ready_at))
            back_s = None if served is None else time.monotonic() - killed_at
        time.sleep(2)
    figures = {"case": f"kill -9 {name}", **load.figures(), "back_s": None if back_s is None else round(back_s, 1)}
    figures["engines"], figures["orphans"] = _one_engine_and_no_orphan(up)
    print(figures)
    return figures


def _within(timeout: float, done) -> float | None:
    """Seconds until `done()` held, polled; None if it did not within `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if done():
            return time.monotonic() - start
        time.sleep(0.1)
    return None


def test_a_service_that_dies_at_start_is_said_and_started_again_and_a_stop_still_stops(tmp_path):
    env = {**os.environ, "LLMGW_MAX_BODY_BYTES": "lots"}  # the router alone reads it: a bad setting, exit 2
    cmd = [sys.executable, "-m", "llmgw.ctl", "up", "--data-dir", str(tmp_path), "--nats-port", "-1"]
    proc = subprocess.Popen(
        [*cmd, "--http-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sum("router exited with code 2 after" in line for line in lines) < 2:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    started = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    proc.send_signal(signal.SIGTERM)
    lines += proc.communicate(timeout=60)[0].splitlines(keepends=True)
    printed = "".join(lines)
    assert printed.count("router exited with code 2 after") >= 2 and "starting it again in" in printed, printed
    assert proc.returncode == 0 and "llmgw up: stopped" in printed and "Traceback" not in printed, printed
    left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], [p.cmdline() for p in left]


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    running = Up(tmp_path_factory.mktemp("llmgw-faults"))
    _keep_reading(running)
    running.wait_ready()
    yield running
    if running.proc.poll() is None:
        running.stop()


def _said(up: Up, name: str) -> bool:
    return any(f"{name} was killed by SIGKILL" in line for line in up.lines)


def _assert_small(up: Up, figures: dict, name: str) -> None:
    assert figures["back_s"] is not None, f"{name} never came back: {figures}\n{''.join(up.lines)}"
    assert _said(up, name), "".join(up.lines)
    failed = figures["sent"] - figures.get("ok", 0)
    assert failed <= figures["sent"] / 100, figures
    assert (figures["engines"], figures["orphans"]) == (1, 0), figures


def test_a_catalog_killed_under_load_is_started_again_and_no_request_fails(up):
    _assert_small(up, _kill_and_watch(up, "catalog"), "catalog")


@pytest.mark.chaos
@pytest.mark.parametrize("name", ["mirror", "scheduler", "nats-server"])
def test_a_service_or_nats_killed_under_load_is_started_again_and_at_most_one_percent_fails(up, name):
    _assert_small(up, _kill_and_watch(up, name), name)


@pytest.mark.chaos
def test_a_router_killed_under_load_only_refuses_connections_until_it_is_back(up):
    figures = _kill_and_watch(up, "router")
    assert figures["back_s"] is not None and _said(up, "router"), figures
    # Those in flight at the kill are cut (one a client at most); after it, only refusals.
    assert figures.get("cut", 0) <= CLIENTS and not [k for k in figures if k.startswith("status")], figures
    assert (figures["engines"], figures["orphans"]) == (1, 0), figures


@pytest.mark.chaos
def test_an_agent_killed_under_load_is_started_again_adopts_its_engine_and_at_most_one_percent_fails(up):
    # Its engine serves on while no agent runs; the agent started again adopts it (one engine, no orphan).
    _assert_small(up, _kill_and_watch(up, "agent"), "agent")


@pytest.mark.chaos
def test_an_engine_killed_under_load_is_replaced_and_at_most_one_percent_fails(up):
    [engine] = _engines(up)

    def replaced() -> bool:
        return any(e.pid != engine.pid for e in _engines(up)) and load.served_since(killed_at + 0.5)

    with Load(up) as load:
        time.sleep(2)
        killed_at = time.monotonic()
        engine.send_signal(signal.SIGKILL)
        back_s = _within(RECOVER_S, replaced)
        time.sleep(2)
    figures = {"case": "kill -9 engine", **load.figures(), "back_s": None if back_s is None else round(back_s, 1)}
    figures["engines"], figures["orphans"] = _one_engine_and_no_orphan(up)
    print(figures)
    assert back_s is not None and figures["sent"] - figures.get("ok", 0) <= figures["sent"] / 100, figures
    assert (figures["engines"], figures["orphans"]) == (1, 0), figures


@pytest.mark.chaos
def test_nats_away_120_s_replaces_no_replica_and_locks_no_key(up):
    """nats-server frozen (SIGSTOP: its connections stay open and silent, as in a partition) for
    longer than the scheduler takes to count a node lost, under steady clients."""
    nats = _child(up, "nats-server")
    before = {r.id: r.url for r in up.nats(lambda nc: call(nc, scheduler.REPLICA_LIST, Empty())).replicas}
    [engine] = _engines(up)
    with Load(up) as load:
        time.sleep(2)
        nats.send_signal(signal.SIGSTOP)
        try:
            time.sleep(120)
        finally:
            nats.send_signal(signal.SIGCONT)
        away = load.figures()
        time.sleep(15)  # the scheduler hears the nodes again; any replacement would start now
        after = load.figures()
    now = {r.id: r.url for r in up.nats(lambda nc: call(nc, scheduler.REPLICA_LIST, Empty())).replicas}
    figures = {"case": "NATS away 120 s", "while away": away, "in all": after, "engine kept": engine.is_running()}
    print(figures)
    assert now == before and engine.is_running() and _engines(up) == [engine], figures
    assert load.served_since(time.monotonic() - 10), "requests answered once NATS was back (no key locked)"


def test_a_stop_under_load_lets_a_stream_in_flight_finish_then_stops_everything(up):
    started = psutil.Process(up.proc.pid).children(recursive=True)
    body = {"model": DEMO, "prompt": "Once", "max_tokens": STREAM_TOKENS, "stream": True, "ignore_eos": True}
    headers = {"authorization": f"Bearer {up.key}"}
    with Load(up) as load:
        time.sleep(1)
        with httpx.stream("POST", f"{up.base_url}/completions", headers=headers, json=body, timeout=60) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            stopping_at = time.monotonic()
            up.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data:")]
            streamed_s = time.monotonic() - stopping_at
        up.proc.wait(60)
    after = load.figures(stopping_at)
    print({"case": "stop under load", "stream_events": 1 + len(rest), "stream_after_stop_s": round(streamed_s, 1)})
    print({"case": "stop under load, requests after the stop", **after})
    assert rest[-1] == "data: [DONE]" and json.loads(first[5:])["choices"], rest[-3:]
    assert json.loads(rest[-2][5:])["choices"][0]["finish_reason"] == "length", rest[-2]
    assert up.proc.returncode == 0 and not [k for k in after if k.startswith("status 5")], after
    assert any("llmgw up: stopped" in line for line in up.lines), "".join(up.lines)
    time.sleep(0.5)
    left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [] and _engines(up) == [], [p.cmdline() for p in left]


def _usage_requests(up: Up) -> int:
    """Requests the usage reports count since the epoch (every group summed)."""
    from llmgw.proto import UsageQuery
    from llmgw.proto import router as router_api

    async def ask(nc):
        return await call(nc, router_api.USAGE_SUM, UsageQuery(since=0.0, group_by="model"), timeout=10)

    return sum(row.requests for row in up.nats(ask).rows)


def _fill(folder: Path) -> Path:
    """A file that takes every free byte of `folder`'s disk."""
    filler = folder / "filler"
    with contextlib.suppress(OSError), filler.open("wb", buffering=0) as f:
        while True:
            f.write(b"\0" * (1 << 20))
    with contextlib.suppress(OSError), filler.open("ab", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)
    return filler


@pytest.mark.chaos
def test_a_full_disk_loses_no_usage_and_everything_comes_back_by_itself(tmp_path):
    """The data directory's disk full for 15 s under steady clients (issue 31): every request
    answered, every one counted in usage once the disk has room (kept by the router meanwhile, none
    twice), nats-server started again by `up` (its store stops writing for good on a full disk)
    and said in one line, the scheduler leading again, the disk nearly full said in /readyz."""
    home = tmp_path / "disk"
    home.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400m", "tmpfs", str(home)], check=True)
    up = None
    try:
        up = Up(home)
        _keep_reading(up)
        up.wait_ready()
        time.sleep(3)  # the warm-up's usage in
        before = _usage_requests(up)
        with Load(up) as load:
            time.sleep(3)
            filler = _fill(home)
            full_at = time.monotonic()
            said = httpx.get(f"{_admin(up, 'router')}/readyz", timeout=5).text
            assert f"disk nearly full: {home} has 0 MB free of 400 MB" in said, said
            time.sleep(15)
            filler.unlink()
            freed_at = time.monotonic()
            deadline = freed_at + RECOVER_S
            while not any("starting it again (its log" in line for line in up.lines):
                assert time.monotonic() < deadline, "".join(up.lines)
                time.sleep(0.5)
            restarted_s = time.monotonic() - freed_at
            time.sleep(5)
        figures = load.figures()
        deadline = time.monotonic() + RECOVER_S
        while (counted := _usage_requests(up) - before) < figures.get("ok", 0) and time.monotonic() < deadline:
            time.sleep(1)
        leases = [
            json.loads(line)["event"]
            for line in (home / "logs" / "scheduler.log").read_text().splitlines()
            if line.startswith("{") and '"event": "lease' in line
        ]
        print(
            f"\nfull disk: {figures}, counted {counted}, nats restarted {restarted_s:.1f} s after space was freed "
            f"({freed_at - full_at:.0f} s full), scheduler lease events {leases[-3:]}"
        )
        assert figures.get("ok", 0) == figures["sent"], figures
        assert counted == figures["ok"], (counted, figures)
        assert leases and leases[-1] == "lease taken", leases
    finally:
        if up is not None and up.proc.poll() is None:
            up.stop()
        subprocess.run(["umount", "-l", str(home)], check=False)
