"""A try's end as the balancer hears it: what the engine said it held, reckoned on the bytes the
prompt's blocks were cut from."""

import types

import aiohttp
from prometheus_client import CollectorRegistry

from llmgw.proto import Model, ReplicaState
from llmgw.router.config import RouterConfig
from llmgw.router.metrics import Metrics
from llmgw.router.request.core import Usage, check_request
from llmgw.router.request.outcome import Served
from llmgw.router.request.relay import Try
from llmgw.router.routing.balance import Balancer
from llmgw.router.routing.health import Health


async def test_a_whole_prompt_of_many_byte_characters_held_by_its_engine_keeps_the_index_whole():
    # Blocks are cut from the prompt's UTF-8 bytes (three a character here); the engine's share
    # of cached tokens is reckoned on those bytes. Reckoned on its characters, a full hit read as
    # a third of one and the replica's index shrank to this prompt alone.
    text = "系统提示：请根据文档回答问题。" * 60
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    prepared = check_request("/v1/chat/completions", body, Model(name="m", source="hf://o/r/m.gguf"))
    assert len(prepared.blocks) >= 10 and prepared.size > 2 * len(prepared.prompt)
    balancer = Balancer()
    balancer.served("m-1", prepared.blocks, 900, 0)  # it read the prompt once before
    replica = ReplicaState(id="m-1", model="m", profile="cpu", node="n", state="ready", url="http://127.0.0.1:1")
    directory = types.SimpleNamespace(replicas=types.SimpleNamespace(items={"m-1": replica}))
    async with aiohttp.ClientSession() as client:
        health = Health(directory, balancer, client, RouterConfig())
        served = Served(status=200, model="m", replica="m-1", usage=Usage(prompt=900, cached=900, completion=1))
        ended: list[Served] = []
        sent = Served(status=503, model="m", replica="m-1")  # as the proxy names a try before its answer
        tried = Try(health, Metrics(CollectorRegistry()), prepared, sent, ended.append)
        assert tried.sent.believed == len(prepared.blocks)
        tried.end(True, served)
    assert ended == [served]
    assert balancer.indexes["m-1"].capacity == balancer.index_blocks
    assert balancer.held("m-1", prepared.blocks) == len(prepared.blocks)


async def _ended(body: dict, usages: list[Usage]) -> Balancer:
    """A balancer that heard tries of `body` on replica m-1 end with these usages."""
    prepared = check_request("/v1/chat/completions", body, Model(name="m", source="hf://o/r/m.gguf"))
    balancer = Balancer()
    replica = ReplicaState(id="m-1", model="m", profile="cpu", node="n", state="ready", url="http://127.0.0.1:1")
    directory = types.SimpleNamespace(replicas=types.SimpleNamespace(items={"m-1": replica}))
    async with aiohttp.ClientSession() as client:
        health = Health(directory, balancer, client, RouterConfig())
        for usage in usages:
            sent = Served(status=503, model="m", replica="m-1")
            tried = Try(health, Metrics(CollectorRegistry()), prepared, sent, [].append)
            tried.end(True, Served(status=200, model="m", replica="m-1", usage=usage))
    return balancer


TEXT = "A document about river stones. " * 40  # ~1,240 bytes


async def test_the_engines_timings_at_a_tries_end_teach_the_balancer_what_a_request_weighs_there():
    body = {"model": "m", "messages": [{"role": "user", "content": TEXT}]}
    usages = [  # llama-server's timings
        Usage(prompt=300, cached=cached, completion=90, prompt_ms=prompt_ms, generation_ms=3000.0)
        for cached, prompt_ms in ((0, 1300.0), (270, 200.0)) * 4
    ]
    balancer = await _ended(body, usages)
    # a tenth of the prompt (~124 bytes) read in 200 ms, all of it in 1,300: ~0.98 ms a byte and
    # ~80 fixed; the answers' three seconds are not counted (others' prompts are read beside them)
    assert 70 <= balancer.request_cost("m-1") <= 100


async def test_a_request_for_several_answers_teaches_the_balancer_nothing_of_its_engines_pace():
    body = {"model": "m", "messages": [{"role": "user", "content": TEXT}], "n": 3}
    usage = Usage(prompt=300, cached=0, completion=3, prompt_ms=1300.0, generation_ms=0.0)  # three tasks' timings
    balancer = await _ended(body, [usage] * 4)
    assert "m-1" not in balancer.paces
