"""The v1 contract across releases, on one real nats-server: the release before users and tenants
(`tests/releases.py`, run from its own source in processes of its own) and today's side by side.
An agent of the earlier release under today's mirror, catalog, scheduler and router serves a
model; today's agent under the earlier release's services does too. What holds them together is
the contract's rule: a v1 message only gains fields, each with a default, and each side ignores
the fields it does not know (msgspec's default), so an upgrade may run either half first."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from llmgw.agent.service import Agent, AgentConfig
from llmgw.bus import BusError, call, free_port, new_fleet_secret, node_secret, read_identity, write_secret
from llmgw.gguf import write_random_llama
from llmgw.proto import KeyCreate, Model, ModelPut, Page, catalog, router, scheduler
from llmgw.scheduler.service import Scheduler, SchedulerConfig
from tests.fleets import SOURCE, serve_router
from tests.releases import BEFORE_TENANTS, earlier


@pytest.fixture(scope="module")
def before(tmp_path_factory) -> dict[str, str]:
    """The environment that runs the earlier release."""
    return earlier(BEFORE_TENANTS, tmp_path_factory.mktemp("release"))


class _Earlier:
    """The earlier release's services, each `llmgw service NAME` in a process of its own."""

    def __init__(self, nats_server, env: dict[str, str], home: Path) -> None:
        self.nats_server, self.env, self.home = nats_server, env, home
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *flags: str, node: str = "") -> None:
        cmd = [sys.executable, "-m", "llmgw.ctl", "service", name, "--nats-url", self.nats_server.url]
        cmd += ["--creds", self.nats_server.creds(name, node), "--data-dir", str(self.home), "--admin-port", "0"]
        log = open(self.home / f"{name}.log", "ab")
        self.procs.append(subprocess.Popen([*cmd, *flags], stdout=log, stderr=log, env=self.env))

    def log(self, name: str) -> str:
        return (self.home / f"{name}.log").read_text()[-3000:]

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _key(nats_server) -> str:
    """The scheduler's public key, which agents check its signatures with."""
    return read_identity(nats_server.creds("scheduler")).public


async def _answered(base_url: str, key: str, model: str, why) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
    deadline = time.monotonic() + 180
    while True:
        try:
            done = await client.completions.create(model=model, prompt="hi", max_tokens=2)
            assert done.choices
            return
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{model} never answered: {exc}\n{why()}") from None
        await asyncio.sleep(0.5)


async def test_an_agent_of_the_earlier_release_serves_under_todays_services(serve, nc, nats_server, tmp_path, before):
    signing = SchedulerConfig(tick_s=0.3, creds=nats_server.creds("scheduler"))  # it signs starts and stops
    await serve(Scheduler(signing), signing)
    served = await serve_router(serve, nc, tmp_path, write_random_llama(tmp_path / "tiny.gguf"))
    fleet = (tmp_path / "engine-fleet.secret").read_text()
    write_secret(tmp_path / "engine-old.secret", node_secret(fleet, "old-1"))
    (home := tmp_path / "old").mkdir()
    old = _Earlier(nats_server, before, home)
    try:
        flags = [
            "--node",
            "old-1",
            "--engine-secret",
            str(tmp_path / "engine-old.secret"),
            "--scheduler-key",
            _key(nats_server),
        ]
        old.start(
            "agent",
            *flags,
            "--heartbeat-s",
            "0.5",
            "--membw-delay-max-s",
            "0.5",
            "--ports",
            "23100-23199",
            node="old-1",
        )
        await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="tiny", source=SOURCE), by="t"))
        await _answered(f"{served.router.http.url}/v1", served.user_key, "tiny", lambda: old.log("agent"))
        nodes = (await call(nc, scheduler.NODE_LIST, Page())).nodes
        assert [n.node for n in nodes] == ["old-1"]
    finally:
        old.stop()


async def test_todays_agent_serves_under_the_earlier_releases_services(serve, nc, nats_server, tmp_path, before):
    tiny = write_random_llama(tmp_path / "tiny.gguf")
    sha256 = hashlib.sha256(tiny.read_bytes()).hexdigest()
    mirror_toml = tmp_path / "mirror.toml"
    mirror_toml.write_text(
        f'root = "{tmp_path / "mirror"}"\nkeep_free_bytes = 0\n'
        f'[[imports]]\npath = "{tiny}"\nsource = "{SOURCE}"\nsha256 = "{sha256}"\n'
    )
    secret = tmp_path / "engine-fleet.secret"
    write_secret(secret, new_fleet_secret())
    write_secret(tmp_path / "engine-new.secret", node_secret(secret.read_text(), "new-1"))
    port = free_port()
    (home := tmp_path / "old").mkdir()
    old = _Earlier(nats_server, before, home)
    try:
        old.start("mirror", "--config", str(mirror_toml))
        old.start("catalog")
        old.start("scheduler", "--tick-s", "0.3")
        old.start("router", "--http-port", str(port), "--engine-secret", str(secret))
        config = AgentConfig(
            node="new-1",
            engine_secret=str(tmp_path / "engine-new.secret"),
            data_dir=str(tmp_path / "new"),
            heartbeat_s=0.5,
            membw_delay_max_s=0.5,
            ports="23200-23299",
            scheduler_key=_key(nats_server),
        )
        await serve(Agent(config), config)
        for _ in range(120):  # the earlier release's router starts in a process of its own
            try:
                made = await call(nc, router.KEY_CREATE, KeyCreate(name="client"))  # today's message to it
                break
            except BusError:
                await asyncio.sleep(0.5)
        else:
            raise AssertionError(old.log("router"))
        await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="tiny", source=SOURCE), by="t"))
        why = lambda: "\n".join(f"--- {n}\n{old.log(n)}" for n in ("scheduler", "router", "mirror"))  # noqa: E731
        await _answered(f"http://127.0.0.1:{port}/v1", made.key, "tiny", why)
    finally:
        old.stop()
