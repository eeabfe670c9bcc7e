"""The agent builds its engines' command lines: a profile's args and env keep to llmgw.modelplan's
allow-list again here (replica.start can be called directly), with this node's opt-in
(`engine_args_allowed`) and no other's; a refused start starts nothing."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from llmgw.agent.config import AgentConfig
from llmgw.agent.core import EngineSetup, launch, worker_launch
from llmgw.agent.replicas import Replicas
from llmgw.bus import BadRequest, EngineKeys
from llmgw.proto import Model, Profile, ReplicaSpec, ReplicaStart

MODEL = Model(name="m", source="o/r/m.gguf", context=2048)


def setup(profile, allowed=()):
    return EngineSetup(
        binary="llama-server",
        weights=Path("/c/m.gguf"),
        port=9000,
        model=MODEL,
        profile=profile,
        api_key="K",
        node_cpus=8,
        allowed=frozenset(allowed),
    )


def test_an_allowed_flag_and_variable_reach_the_engine_after_the_agents_own():
    how = launch(setup(Profile(args=["-ctk", "q8_0", "--temp=0.6"], env={"OMP_PROC_BIND": "close"})))
    assert how.argv[-3:] == ["-ctk", "q8_0", "--temp=0.6"] and how.env == {
        "OMP_PROC_BIND": "close",
        "LLAMA_API_KEY": "K",
    }


def test_no_launch_is_planned_with_a_refused_argument_or_variable():
    with pytest.raises(ValueError, match="argument '--log-file' is refused"):
        launch(setup(Profile(args=["--log-file", "/tmp/x"])))
    with pytest.raises(ValueError, match="environment variable 'LD_PRELOAD' is refused"):
        launch(setup(Profile(env={"LD_PRELOAD": "/tmp/evil.so"})))


def test_a_worker_is_planned_with_no_refused_variable():
    with pytest.raises(ValueError, match="environment variable 'LD_PRELOAD' is refused"):
        worker_launch("ggml-rpc-server", "10.0.0.6", 20000, Profile(env={"LD_PRELOAD": "/x.so"}), 16, [])
    allowed = worker_launch("ggml-rpc-server", "10.0.0.6", 20000, Profile(env={"X": "1"}), 16, [], allowed={"X"})
    assert allowed.env == {"X": "1"}


def test_the_nodes_opt_in_lets_its_flag_through_and_nothing_it_sets_itself():
    lora = Profile(args=["--control-vector", "/srv/cv/a.gguf"])
    assert launch(setup(lora, allowed={"--control-vector"})).argv[-2:] == ["--control-vector", "/srv/cv/a.gguf"]
    with pytest.raises(ValueError, match="argument '--control-vector' is refused"):
        launch(setup(lora))
    with pytest.raises(ValueError, match="no node's opt-in lifts this"):
        launch(setup(Profile(args=["--port", "80"]), allowed={"--port"}))


def replicas(node, allowed=()):
    config = AgentConfig(node=node, engine_args_allowed=list(allowed))
    facts = SimpleNamespace(node=node, config=config, engines=SimpleNamespace(versions=lambda: {"llamacpp": "b1"}))
    return Replicas(facts, supervisor=None, room=None, weights=None, keys=EngineKeys(b""))


def start(node, profile):
    replica = ReplicaSpec(id="r1", model="m", profile=profile.name, node=node)
    return ReplicaStart(replica=replica, model=MODEL, profile=profile)


async def test_a_start_with_a_refused_argument_fails_saying_which_and_keeps_no_replica():
    here = replicas("a")
    with pytest.raises(BadRequest, match="replica r1: argument '--log-file' is refused: it names a file"):
        await here.start(start("a", Profile(args=["--log-file", "/tmp/x"])))
    with pytest.raises(BadRequest, match="replica r1: environment variable 'LD_PRELOAD' is refused"):
        await here.start(start("a", Profile(env={"LD_PRELOAD": "/tmp/evil.so"})))
    assert here.runs == {}


async def test_a_node_refuses_what_only_another_node_opted_into():
    replicas("a", ["--control-vector"])
    with pytest.raises(BadRequest, match="argument '--control-vector' is refused"):
        await replicas("b").start(start("b", Profile(args=["--control-vector", "/srv/cv/a.gguf"])))


def test_adapters_are_loaded_with_none_applied_and_each_named_by_the_model():
    import dataclasses

    from llmgw.agent.core import adapter_sources
    from llmgw.proto import Adapter

    adapters = {"sql": Path("/c/aa/sql.gguf"), "legal": Path("/c/bb/legal.gguf")}
    argv = launch(dataclasses.replace(setup(Profile()), adapters=adapters)).argv
    at = argv.index("--lora-init-without-apply")
    assert argv[at + 1 :][:4] == ["--lora", "/c/aa/sql.gguf", "--lora", "/c/bb/legal.gguf"]
    model = Model(name="m", source="o/r/m.gguf", adapters=[Adapter(name="sql", source="o/a/sql.gguf")])
    assert adapter_sources(model, ["sql"]) == ["o/a/sql.gguf"]
    with pytest.raises(ValueError, match="model 'm' has no adapter legal \\(it changed since it was placed\\)"):
        adapter_sources(model, ["sql", "legal"])
