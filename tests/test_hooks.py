"""Webhooks on the real router, posting to real receiver processes (`tests/receiver.py`): a hook
made with `llmgw ctl hook put` (its secret shown once), tested ("it answered 204"), told of a
replica that failed and a model backing off with a body signed by its secret, tried again until a
flaky receiver takes it, a dead letter for one that never answers, nothing for a tenant whose
models it is not; URLs that are not http(s) or point at llmgw's own admin ports refused."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from llmgw.bus import call, free_port
from llmgw.gguf import write_random_llama
from llmgw.proto import BUCKETS, KeyCreate, Limits, ModelStatus, ReplicaReport, agent, people
from llmgw.proto.people import Tenant
from tests.fleets import serve_router

RECEIVER = Path(__file__).parent / "receiver.py"


class Receiver:
    """A receiver process on a free port, and what it was sent."""

    def __init__(self, folder: Path, mode: str) -> None:
        self.log = folder / f"received-{mode.replace(':', '-')}.jsonl"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        cmd = [sys.executable, str(RECEIVER), str(self.port), str(self.log), mode]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "listening"

    def got(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    async def wait(self, count: int, timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(got := self.got()) >= count:
                return got
            await asyncio.sleep(0.1)
        raise AssertionError(f"{self.url} was sent {len(self.got())} notices, not {count}")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def receivers(tmp_path):
    made: dict[str, Receiver] = {}
    yield lambda mode: made.setdefault(mode, Receiver(tmp_path, mode))
    for receiver in made.values():
        receiver.stop()


def _ctl(nats_server, *words: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "llmgw.ctl", "ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl")]
    return subprocess.run([*cmd, *words], capture_output=True, text=True, timeout=60)


async def test_hooks_are_told_of_failures_signed_tried_again_and_dead_lettered(
    serve, nc, tmp_path, nats_server, receivers
):
    fast = {"hook_tries": 3, "hook_first_wait_s": 0.2, "hook_timeout_s": 1.0, "notify_every_s": 0.3}
    await serve_router(serve, nc, tmp_path, write_random_llama(tmp_path / "tiny.gguf"), **fast)
    ctl = lambda *w: asyncio.to_thread(_ctl, nats_server, *w)  # noqa: E731
    ok, flaky, silent = receivers("ok"), receivers("fail:2"), receivers("hang")

    for url, why in (
        ("ftp://example.com/x", "is not an http:// or https:// URL"),
        ("http://127.0.0.1:9464/metrics", "points at llmgw's own port 9464"),
    ):
        refused = await ctl("hook", "put", "bad", url)
        assert refused.returncode == 1 and why in refused.stderr, refused.stderr
    made = await ctl("hook", "put", "ops", ok.url, "--events", "replica.failed,model.backing-off")
    assert made.returncode == 0 and "shown this once" in made.stderr, made.stderr
    secret = made.stdout.strip()
    tested = await ctl("hook", "test", "ops")
    assert tested.returncode == 0 and "it answered 204" in tested.stdout, tested.stdout + tested.stderr
    assert (await ctl("hook", "put", "flaky", flaky.url, "--events", "replica.failed")).returncode == 0
    assert (await ctl("hook", "put", "silent", silent.url, "--events", "replica.failed")).returncode == 0
    await call(nc, people.TENANT_PUT, Tenant(name="lab", models=["other"], by="t"))
    lab = receivers("fail:0")
    assert (await ctl("hook", "put", "labs", lab.url, "--tenant", "lab")).returncode == 0
    listed = (await ctl("hook", "list")).stdout
    assert "ops" in listed and secret not in listed

    failed = ReplicaReport(id="r1", model="tiny", profile="default", node="n1", state="failed", error="out of memory")
    await nc.publish(agent.REPLICA_CHANGED.subject("n1", "r1"), msgspec.json.encode(failed))
    got = (await ok.wait(2))[1]  # the test notice, then this
    notice = json.loads(got["body"])
    assert (
        notice["kind"] == "replica.failed" and "replica r1 of tiny on node n1 failed: out of memory" in notice["text"]
    )
    headers = {k.lower(): v for k, v in got["headers"].items()}
    signed = f"{headers['x-llmgw-timestamp']}.{got['body']}".encode()
    assert headers["x-llmgw-signature"] == "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    assert len(await flaky.wait(3)) == 3  # two 500s, then taken

    status = await nc.jetstream().key_value(BUCKETS["status"])
    backing = ModelStatus(model="tiny", state="backing-off", reason="its engine exits at start", ready=0, wanted=1)
    await status.put("tiny", msgspec.json.encode(backing))
    got = await ok.wait(3)
    assert json.loads(got[2]["body"])["kind"] == "model.backing-off"

    for _ in range(100):
        dead = await ctl("hook", "dead", "--json")
        letters = json.loads(dead.stdout)["letters"]
        if letters:
            break
        await asyncio.sleep(0.3)
    assert [(d["hook"], d["tries"], d["notice"]["kind"]) for d in letters] == [("silent", 3, "replica.failed")]
    assert "no answer" in letters[0]["last"]
    assert lab.got() == []  # tenant lab may not use tiny: not told of it


async def test_a_budget_nearly_and_wholly_spent_is_told_to_its_tenant_once(serve, nc, tmp_path, nats_server, receivers):
    fast = {"hook_tries": 2, "hook_first_wait_s": 0.2, "hook_timeout_s": 1.0, "notify_every_s": 0.2}
    served = await serve_router(serve, nc, tmp_path, write_random_llama(tmp_path / "tiny.gguf"), **fast)
    await call(nc, people.TENANT_PUT, Tenant(name="lab", by="t"))
    money, other = receivers("ok"), receivers("fail:0")
    for name, url, tenant in (("money", money.url, "lab"), ("elsewhere", other.url, "default")):
        made = await asyncio.to_thread(
            _ctl, nats_server, "hook", "put", name, url, "--tenant", tenant, "--events", "budget.80,budget.spent"
        )
        assert made.returncode == 0, made.stderr
    key = await served.router.accounts.create_key(KeyCreate(name="ci", tenant="lab", limits=Limits(tokens_per_day=100)))
    limits = await nc.jetstream().key_value(BUCKETS["limits"])
    day = time.strftime("%Y%m%d", time.gmtime())
    await limits.put(f"key.{key.id}", json.dumps({"d": [day, 85]}).encode())
    first = json.loads((await money.wait(1))[0]["body"])
    assert (
        first["kind"] == "budget.80"
        and first["text"]
        == f"key 'ci' has used over 80% of its 100 tokens for the day {time.strftime('%Y-%m-%d', time.gmtime())}"
    )
    await limits.put(f"key.{key.id}", json.dumps({"d": [day, 100]}).encode())
    second = json.loads((await money.wait(2))[1]["body"])
    assert second["kind"] == "budget.spent" and "requests get 429" in second["text"]
    await asyncio.sleep(1.0)  # more rounds: each was sent once
    assert len(money.got()) == 2 and other.got() == []  # another tenant's hooks are not told


async def test_an_upgrades_progress_is_told_to_the_fleets_operators(serve, nc, tmp_path, nats_server, receivers):
    from llmgw.proto.release import RELEASE_CHANGED, Release

    fast = {"hook_tries": 2, "hook_first_wait_s": 0.2, "hook_timeout_s": 1.0, "notify_every_s": 0.2}
    await serve_router(serve, nc, tmp_path, write_random_llama(tmp_path / "tiny.gguf"), **fast)
    await call(nc, people.TENANT_PUT, Tenant(name="lab", by="t"))
    ops, lab = receivers("ok"), receivers("fail:0")
    for name, url, tenant in (("ops", ops.url, "default"), ("lab", lab.url, "lab")):
        made = await asyncio.to_thread(_ctl, nats_server, "hook", "put", name, url, "--tenant", tenant)
        assert made.returncode == 0, made.stderr
    steps = ["router", "agent"]
    for release in (  # as an agent publishes its machine's upgrade: a step, a pause, the end
        Release(node="m2", version="0.2.0", previous="0.1.0", state="running", steps=steps, done=1),
        Release(node="m2", version="0.2.0", previous="0.1.0", state="failed", steps=steps, error="agent exited"),
        Release(node="m2", version="0.2.0", previous="0.1.0", state="done", steps=steps, done=2),
    ):
        await nc.publish(RELEASE_CHANGED.subject("m2"), msgspec.json.encode(release))
        await asyncio.sleep(0.3)
    told = [json.loads(n["body"]) for n in await ops.wait(2)]
    assert [(n["kind"], n["text"]) for n in told] == [
        ("upgrade.progress", "node m2's upgrade to 0.2.0 paused: agent exited"),
        ("upgrade.progress", "node m2 runs 0.2.0 now (before it: 0.1.0)"),
    ]
    await asyncio.sleep(0.5)
    assert lab.got() == []  # the fleet's own events go to its operators' (the default tenant's) hooks
