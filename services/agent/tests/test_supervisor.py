"""The supervisor of the agent's children (engines and RPC workers alike), on small shell programs."""

import asyncio
import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from llmgw.agent.core import Launch
from llmgw.agent.supervisor import ChildSpec, StartFailed, Supervisor, end_leftovers


@pytest.fixture
async def supervisor(tmp_path):
    sup = Supervisor(tmp_path / "logs", tmp_path / "notes", grace_s=0.5)
    assert await sup.prepare() == []
    yield sup
    for name in list(sup.children):
        await sup.stop(name)


def child(tmp_path, script, up=None, exits=None, timeout_s=10.0, secrets=()):
    """A `sh -c script` child, up once `marker` exists (unless `up` says otherwise)."""
    marker = tmp_path / "marker"

    async def ready():
        return marker.exists()

    async def on_exit(c, code):
        exits.append((code, list(c.tail)))

    return ChildSpec(
        name="c1",
        launch=Launch(argv=["sh", "-c", script.replace("MARKER", str(marker))], env={"GREETING": "hello"}),
        up=up or ready,
        timeout_s=timeout_s,
        what="it",
        on_exit=on_exit,
        note={"replica": "r1", "model": "m"},
        secrets=secrets,
    )


async def until(check, timeout=10):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.05)


async def test_a_child_that_dies_after_serving_is_reported_with_its_status_and_last_lines(supervisor, tmp_path):
    exits = []
    c = await supervisor.start(child(tmp_path, 'echo "$GREETING"; touch MARKER; exec sleep 30', exits=exits))
    note = json.loads((tmp_path / "notes" / "c1.json").read_text())
    assert (note["replica"], note["model"], note["pid"]) == ("r1", "m", c.pid) and supervisor.pids() == {c.pid}
    os.kill(c.pid, signal.SIGKILL)
    await until(lambda: exits)
    assert exits == [(-signal.SIGKILL, ["hello"])]
    assert supervisor.children == {} and not (tmp_path / "notes" / "c1.json").exists()
    assert (tmp_path / "logs" / "c1.log").read_text() == "hello\n"


async def test_a_child_asked_to_stop_ends_gracefully_and_its_exit_is_no_news(supervisor, tmp_path):
    exits = []
    c = await supervisor.start(child(tmp_path, "touch MARKER; exec sleep 30", exits=exits))
    await supervisor.stop("c1")
    assert c.proc.returncode == -signal.SIGTERM and supervisor.children == {}
    await asyncio.sleep(0.2)
    assert exits == [] and not (tmp_path / "notes" / "c1.json").exists()


async def test_a_child_that_ignores_sigterm_is_killed_after_its_grace(supervisor, tmp_path):
    c = await supervisor.start(child(tmp_path, "trap '' TERM; touch MARKER; exec sleep 30", exits=[]))
    began = time.monotonic()
    await supervisor.stop("c1")
    assert c.proc.returncode == -signal.SIGKILL and 0.4 < time.monotonic() - began < 5


async def test_a_child_that_exits_at_start_fails_with_its_status_and_last_words_its_secret_hidden(supervisor, tmp_path):
    script = 'echo "key s3cret refused"; exit 3'
    with pytest.raises(StartFailed, match="it exited at start with status 3") as failed:
        await supervisor.start(child(tmp_path, script, exits=[], secrets=("s3cret",)))
    assert failed.value.tail == ["key *** refused"]
    assert "s3cret" not in (tmp_path / "logs" / "c1.log").read_text()
    assert supervisor.children == {} and list((tmp_path / "notes").iterdir()) == []


async def test_a_child_not_up_in_time_is_ended_leaving_nothing_behind(supervisor, tmp_path):
    async def never():
        return False

    began = time.monotonic()
    with pytest.raises(StartFailed, match="it not up within 0.3s \\(startup_timeout_s\\)"):
        await supervisor.start(child(tmp_path, "echo waiting; exec sleep 30", up=never, exits=[], timeout_s=0.3))
    assert time.monotonic() - began < 5
    assert supervisor.children == {} and list((tmp_path / "notes").iterdir()) == []
    assert not [p for p in psutil.Process().children() if p.name() == "sleep"]


def test_a_restarted_agent_ends_the_engines_a_previous_one_left_but_not_a_stranger(tmp_path):
    left = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (tmp_path / "r1.json").write_text(
        json.dumps({"replica": "r1", "model": "m", "pid": left.pid, "started": time.time()})
    )
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)  # the pid was reused since the note
    (tmp_path / "r2.json").write_text(json.dumps({"replica": "r2", "pid": stranger.pid, "started": 1.0}))
    try:
        assert end_leftovers(tmp_path) == [{"replica": "r1", "model": "m", "pid": left.pid}]
        assert left.wait(5) == -signal.SIGKILL and stranger.poll() is None
        assert list(tmp_path.iterdir()) == []
    finally:
        stranger.kill()
        stranger.wait()
