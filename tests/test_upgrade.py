"""Today's llmgw started on a data directory an earlier release wrote: the release before users and
tenants (`tests/releases.py`) runs `llmgw up`, makes a project with a limit and a key in it, answers
with that key and stops; today's `llmgw up` on the same directory answers the same key, in the
default tenant, under the same project's limit, and makes its first admin user."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import psutil

from llmgw.bus import BusError, call
from llmgw.proto import Page, scheduler
from tests.releases import BEFORE_TENANTS, earlier, install
from tests.test_up import DEMO, Up


def _ctl(home: Path, *words: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "llmgw.ctl", "ctl", "--data-dir", str(home), *words]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def test_keys_and_projects_an_earlier_release_wrote_work_under_todays(tmp_path):
    home, before = tmp_path / "home", earlier(BEFORE_TENANTS, tmp_path / "release")
    old = Up(home, env=before)
    try:
        old.wait_ready()
        assert "console user:" not in "".join(old.lines)  # that release had no users
        put = _ctl(home, "project", "put", "team", "--rpm", "2", env=before)
        assert put.returncode == 0, put.stderr
        made = _ctl(home, "key", "create", "legacy", "--project", "team", env=before)
        assert made.returncode == 0, made.stderr
        key = made.stdout.strip().splitlines()[-1]
        legacy = openai.OpenAI(base_url=old.base_url, api_key=key, max_retries=0)
        assert legacy.completions.create(model=DEMO, prompt="hi", max_tokens=1).choices
    finally:
        old.stop()

    new = Up(home)
    try:
        new.wait_ready()
        assert "console user:    admin, password" in "".join(new.lines)
        legacy = openai.OpenAI(base_url=new.base_url, api_key=key, max_retries=0)
        assert legacy.completions.create(model=DEMO, prompt="hi", max_tokens=1).choices
        refused = None
        for _ in range(3):  # the project's 2 a minute, the request the old release answered among them
            try:
                legacy.completions.create(model=DEMO, prompt="hi", max_tokens=1)
            except openai.RateLimitError as exc:
                refused = exc
                break
        assert refused is not None and "project 'team'" in str(refused), "the project's limit was lost"
        listed = _ctl(home, "key", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        [record] = [k for k in json.loads(listed.stdout)["keys"].values() if k["name"] == "legacy"]
        assert (record["tenant"], record["owner"], record["project"]) == ("default", "", "team")
    finally:
        new.stop()


def _pythons(up: Up) -> dict[str, str]:
    """The Python each service under `up` was started with, by service."""
    found = {}
    for proc in psutil.Process(up.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            argv = proc.cmdline()
            if "service" in argv and argv.index("service") + 1 < len(argv) and "-m" in argv:
                found[argv[argv.index("service") + 1]] = argv[0]
    return found


def _engines(up: Up) -> set[int]:
    return {p.pid for p in psutil.Process(up.proc.pid).children(recursive=True) if "llama-server" in p.name()}


class _Load(threading.Thread):
    """A client asking the demo model every 50 ms, as the OpenAI SDK does by default (it tries a
    request again on a dropped connection), counting what failed."""

    def __init__(self, up: Up) -> None:
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=up.base_url, api_key=up.key)
        self.ok, self.failed, self.running = 0, list[str](), True

    def run(self) -> None:
        while self.running:
            try:
                self.client.completions.create(model=DEMO, prompt="hi", max_tokens=1)
                self.ok += 1
            except openai.OpenAIError as exc:
                self.failed.append(str(exc))
            time.sleep(0.05)


class _Replicas(threading.Thread):
    """The fewest ready replicas the demo model had while it wanted one, read every 0.3 s."""

    def __init__(self, up: Up) -> None:
        super().__init__(daemon=True)
        self.up, self.fewest, self.running = up, 99, True
        self.answered = self.unanswered = 0
        self.seen: list[tuple[float, int, int, str]] = []
        """(when, ready, wanted, state) each time one of them changed."""

    def run(self) -> None:
        async def watch(nc):
            while self.running:
                try:
                    models = (await call(nc, scheduler.MODEL_STATUS, Page())).models
                except BusError:  # the scheduler is being replaced: the next one is asked
                    self.unanswered += 1
                    await asyncio.sleep(0.3)
                    continue
                self.answered += 1
                for m in models:
                    if m.model == DEMO and m.wanted and self.seen and self.seen[0][1]:  # from its first ready
                        self.fewest = min(self.fewest, m.ready)
                    if m.model == DEMO and self.seen and self.seen[-1][1:] != (m.ready, m.wanted, m.state):
                        self.seen.append((time.time(), m.ready, m.wanted, m.state))
                    elif m.model == DEMO and not self.seen and m.ready:
                        self.seen.append((time.time(), m.ready, m.wanted, m.state))
                await asyncio.sleep(0.3)

        self.up.nats(watch)


def test_an_upgrade_replaces_every_process_under_load_none_failing_and_rolls_back(tmp_path):
    home = tmp_path / "home"
    up = Up(home)
    try:
        up.wait_ready()
        next_python = install(home, "next")
        engines = _engines(up)
        load, replicas = _Load(up), _Replicas(up)
        load.start()
        replicas.start()
        for _ in range(100):  # the scheduler has heard the replica is ready
            if replicas.seen:
                break
            time.sleep(0.1)
        started_at = time.monotonic()
        moved = _ctl(home, "upgrade", "next")
        moved_at = time.monotonic()
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert "machine 1 of 1" in moved.stdout and "every machine runs next" in moved.stdout
        assert _pythons(up) == dict.fromkeys(("catalog", "mirror", "scheduler", "router", "agent"), str(next_python))
        time.sleep(1)
        load.running = replicas.running = False
        load.join(30)
        replicas.join(30)
        assert load.failed == [] and load.ok > 20, (load.ok, load.failed[:3])
        assert replicas.fewest == 1, replicas.seen  # the agent handed its engine to the next one: never fewer
        assert replicas.answered > 20, (replicas.answered, replicas.unanswered)
        took = moved_at - started_at
        print(f"\nupgrade of one machine: {took:.1f} s; requests {load.ok} answered, {len(load.failed)} failed; ")
        print(f"fewest ready replicas of the demo model: {replicas.fewest} (of 1 wanted)")
        assert engines and all(psutil.Process(pid).is_running() for pid in engines)  # the same engine serves
        shown = json.loads(_ctl(home, "releases", "--json").stdout)
        assert [(r["version"], r["previous"], r["state"]) for r in shown] == [("next", "installed", "done")]

        back = _ctl(home, "upgrade", "--rollback")
        assert back.returncode == 0 and "every machine runs installed" in back.stdout, back.stdout + back.stderr
        assert set(_pythons(up).values()) == {sys.executable}

        missing = _ctl(home, "upgrade", "nope")
        assert missing.returncode == 1 and "release nope is not installed here" in missing.stdout, missing.stdout
        install(home, "broken", "#!/bin/sh\necho 'this release cannot start' >&2\nexit 3\n")
        broken = _ctl(home, "upgrade", "broken")
        assert broken.returncode == 1 and "paused at machine 1 of 1" in broken.stdout, broken.stdout
        assert "the catalog on broken exited with code 3 at start, saying: this release cannot start" in broken.stdout
        again = _ctl(home, "upgrade", "installed")
        assert again.returncode == 0, again.stdout + again.stderr
        assert up.client.completions.create(model=DEMO, prompt="hi", max_tokens=1).choices
    finally:
        up.stop()
