"""`llmgw console` in a real terminal: tmux runs it at 80x24 against a real `llmgw up`, send-keys
drive a scale of the demo model from its menu, capture-pane reads each screen. The screens are
kept under build/screens/ (not committed) for a reviewer, as the browser tests keep screenshots."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmgw.bus import call
from llmgw.proto import ModelRef, catalog
from tests.test_up import DEMO, Up

SCREENS = Path(__file__).parents[2] / "build" / "screens"
SESSION = "llmgw-console-test"


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _screen(name: str) -> str:
    text = _tmux("capture-pane", "-p", "-t", SESSION)
    SCREENS.mkdir(parents=True, exist_ok=True)
    (SCREENS / f"{name}.txt").write_text(text)
    return text


def _until(name: str, found, within: float = 30.0) -> str:
    deadline = time.monotonic() + within
    while True:
        text = _screen(name)
        if found(text):
            return text
        assert time.monotonic() < deadline, f"never on the screen ({name}):\n{text}"
        time.sleep(0.3)


@pytest.fixture
def up(tmp_path):
    assert shutil.which("tmux"), "tmux is missing: ./dev installs Debian's tmux"
    running = Up(tmp_path / "home")
    running.wait_ready()
    yield running
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    running.stop()


def test_a_scale_from_the_models_menu_in_a_real_terminal(up):
    console = f"{sys.executable} -m llmgw.ctl console --data-dir {up.home} --lang en"
    _tmux("new-session", "-d", "-s", SESSION, "-x", "80", "-y", "24", f"NO_COLOR=1 {console}")
    fleet = _until("1-fleet", lambda t: "ready" in t and "NODE" in t)
    assert f"{DEMO}:ready" in fleet.replace(" ", "")  # in 80 columns, the node's replicas are seen
    _tmux("send-keys", "-t", SESSION, "2")
    # the models table's own row: the fleet's read rate ("11/11") holds a "1/1" too
    _until("2-models", lambda t: re.search(rf"^ {DEMO} +1/1 ", t, re.MULTILINE) is not None)
    _tmux("send-keys", "-t", SESSION, "Enter")
    _until("3-menu", lambda t: "Replicas per profile" in t and "Restart" in t)
    _tmux("send-keys", "-t", SESSION, "Enter")
    _until("4-form", lambda t: "Replicas of" in t)
    for key in ("End", "BSpace", "BSpace", "2", "Enter"):  # the count there ("0") replaced by 2
        _tmux("send-keys", "-t", SESSION, key)
        time.sleep(0.1)
    _until("5-done", lambda t: f"{DEMO}: done" in t)

    async def scaled(nc):
        return await call(nc, catalog.MODEL_GET, ModelRef(name=DEMO))

    assert sum(p.replicas or 0 for p in up.nats(scaled).model.profiles) == 2
    _tmux("send-keys", "-t", SESSION, "?")
    keys = _until("6-keys", lambda t: "Cancel (esc)" in t)  # the list of keys, over the tabs
    assert "? " in keys and "2,m  Models" in keys and "enter  menu" in keys
    _tmux("send-keys", "-t", SESSION, "Escape", "q")
