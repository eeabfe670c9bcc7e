"""The catalog lets in only the engine flags and environment operators tune (llmgw.modelplan's
allow-list): anything else is a 400 naming the argument and why, on put, change and in the
declared file; the catalog's own `engine_args_allowed` lets in what chosen nodes opted into."""

import msgspec
import pytest

from llmgw.bus import BadRequest, call, request_raw
from llmgw.catalog.core import check_model
from llmgw.catalog.declared import load_declared
from llmgw.catalog.edits import apply_change
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.proto import Empty, Model, ModelPut, Profile, catalog
from llmgw.proto.catalog import StopModel


def model(args=(), env=None, engine="llamacpp"):
    profile = Profile(name="gpu", gpus=1, engine=engine, args=list(args), env=env or {}, node_selector={"lora": "yes"})
    return Model(name="m", source="o/r/m.gguf", profiles=[profile])


@pytest.fixture
async def client(serve, nc):
    await serve(Catalog(CatalogConfig()), CatalogConfig())
    return nc


async def test_a_put_with_a_log_file_is_a_400_naming_it_and_stores_nothing(client):
    body = msgspec.json.encode(ModelPut(model=model(["--log-file", "/tmp/x"])))
    msg = await request_raw(client, catalog.MODEL_PUT.subject(), body, timeout=5)
    assert msg.headers["Nats-Service-Error-Code"] == "400"
    said = msg.headers["Nats-Service-Error"]
    assert "model 'm' profile 'gpu': argument '--log-file' is refused: it names a file" in said
    assert (await call(client, catalog.MODEL_LIST, Empty())).models == []


async def test_a_put_with_ld_preload_in_its_environment_is_refused_saying_why(client):
    with pytest.raises(BadRequest, match="environment variable 'LD_PRELOAD' is refused: it is the dynamic loader's"):
        await call(client, catalog.MODEL_PUT, ModelPut(model=model(env={"LD_PRELOAD": "/tmp/evil.so"})))


async def test_a_put_with_the_flags_operators_tune_is_stored_as_given(client):
    tuned = model(["--flash-attn", "on", "-ctk", "q8_0", "--temp", "0.6"], {"OMP_PROC_BIND": "close"})
    put = await call(client, catalog.MODEL_PUT, ModelPut(model=tuned))
    assert put.model.profiles[0].args == ["--flash-attn", "on", "-ctk", "q8_0", "--temp", "0.6"]


async def test_the_catalogs_opt_in_lets_in_a_flag_chosen_nodes_allow(serve, nc):
    config = CatalogConfig(engine_args_allowed=["--control-vector"])
    await serve(Catalog(config), config)
    put = await call(nc, catalog.MODEL_PUT, ModelPut(model=model(["--control-vector", "/srv/cv/a.gguf"])))
    stopped = await call(nc, catalog.MODEL_CHANGE, StopModel(name="m"))
    assert put.model.profiles[0].args[0] == "--control-vector" and stopped.model.stopped is not None
    with pytest.raises(BadRequest, match="argument '--log-file' is refused"):
        await call(nc, catalog.MODEL_PUT, ModelPut(model=model(["--log-file", "/tmp/x"])))


def test_what_the_agent_sets_itself_is_refused_saying_which_profile_field_says_it():
    with pytest.raises(BadRequest, match=r"argument '-ngl' is refused: .*set the profile's gpus"):
        check_model(model(["-ngl", "99"]))
    with pytest.raises(BadRequest, match="argument '--api-key' is refused"):
        check_model(model(["--api-key", "mine"], engine="vllm"))


def test_a_change_to_a_model_keeps_to_the_rule_and_to_the_opt_in():
    lora = model(["--control-vector", "/srv/cv/a.gguf"])
    with pytest.raises(BadRequest, match="argument '--control-vector' is refused"):
        apply_change(lora, StopModel(name="m"))
    assert apply_change(lora, StopModel(name="m"), ["--control-vector"]).stopped is not None


def test_a_declared_model_with_a_refused_argument_is_refused_saying_where():
    text = b"models: [{name: m, source: o/r/m.gguf, profiles: [{name: cpu, args: ['--slot-save-path', '/tmp']}]}]"
    with pytest.raises(BadRequest, match="model 'm' profile 'cpu': argument '--slot-save-path' is refused"):
        load_declared(text, "models.yaml")
    assert load_declared(text, "models.yaml", ["--slot-save-path"])[0].name == "m"
