"""Today's llmgw started on a data directory an earlier release wrote: the release before users and
tenants (`tests/releases.py`) runs `llmgw up`, makes a project with a limit and a key in it, answers
with that key and stops; today's `llmgw up` on the same directory answers the same key, in the
default tenant, under the same project's limit, and makes its first admin user."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai

from tests.releases import BEFORE_TENANTS, earlier
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
