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
from llmgw.agent.supervisor import ChildSpec, StartFailed, Supervisor, find_left


@pytest.fixture
async def supervisor(tmp_path):
    sup = Supervisor(tmp_path / "logs", tmp_path / "notes", grace_s=0.5)
    assert await sup.prepare() == ([], [])
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


def test_a_restarted_agent_ends_the_workers_a_previous_one_left_hands_over_its_engines_and_spares_a_stranger(tmp_path):
    worker = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (tmp_path / "w1.worker.json").write_text(
        json.dumps({"replica": "w1", "model": "m", "pid": worker.pid, "started": time.time()})
    )
    engine = subprocess.Popen(["sleep", "301"], start_new_session=True)
    (tmp_path / "e1.json").write_text(
        json.dumps({"replica": "e1", "pid": engine.pid, "started": time.time(), "survives": True})
    )
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)  # the pid was reused since the note
    (tmp_path / "r2.json").write_text(json.dumps({"replica": "r2", "pid": stranger.pid, "started": 1.0}))
    (tmp_path / "dead.json").write_text(json.dumps({"replica": "r3", "pid": 2**22 + 1, "started": time.time()}))
    try:
        left, ended = find_left(tmp_path)
        assert ended == [{"replica": "w1", "model": "m", "pid": worker.pid}]
        assert [(e.name, e.pid, e.cmdline) for e in left] == [("e1", engine.pid, ["sleep", "301"])]
        assert worker.wait(5) == -signal.SIGKILL and stranger.poll() is None and engine.poll() is None
        assert sorted(p.name for p in tmp_path.iterdir()) == ["e1.json"]  # the engine's, for whoever adopts it
    finally:
        for proc in (stranger, engine):
            proc.kill()
            proc.wait()


async def test_an_engine_left_behind_is_adopted_watched_and_stopped_like_its_own(supervisor, tmp_path):
    engine = subprocess.Popen(["sh", "-c", "exec sleep 300"], start_new_session=True)
    (tmp_path / "notes" / "c1.json").write_text(
        json.dumps({"replica": "r1", "pid": engine.pid, "started": time.time(), "survives": True})
    )
    (tmp_path / "notes" / "c1.out").write_text("printed before\n")
    exits = []
    [left], [] = await supervisor.prepare()
    adopted = supervisor.adopt(child(tmp_path, "", exits=exits), left)
    assert supervisor.pids() == {engine.pid} and adopted.pid == engine.pid
    await supervisor.stop("c1")
    assert engine.wait(5) == -signal.SIGTERM and exits == [] and list((tmp_path / "notes").iterdir()) == []
    engine = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (tmp_path / "notes" / "c1.json").write_text(
        json.dumps({"replica": "r1", "pid": engine.pid, "started": time.time(), "survives": True})
    )
    [left], [] = await supervisor.prepare()
    supervisor.adopt(child(tmp_path, "", exits=exits), left)
    engine.kill()
    engine.wait()  # reaped here (its parent); an adopted engine's status is not known to the agent
    await until(lambda: exits)
    assert exits == [(-1, [])] and supervisor.children == {}
