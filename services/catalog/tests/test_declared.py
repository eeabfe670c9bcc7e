"""Models declared in YAML: every bad input refused with where and what; the API defers to the file."""

import pytest

from llmgw.bus import BadRequest, call
from llmgw.catalog.core import check_catalog, check_model
from llmgw.catalog.declared import declared_changes, load_declared
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.proto import (
    Empty,
    Model,
    ModelEntry,
    ModelPut,
    ModelRef,
    Profile,
    Scaling,
    ScheduleWindow,
    catalog,
)
from llmgw.proto.catalog import StopModel

GOOD = b"""
models:
  - name: big
    source: o/r/big.gguf
    aliases: [large]
    profiles: [{name: gpu, gpus: 2, tensor_parallel: 2}]
  - name: small
    source: o/r/small.gguf
    fallbacks: [big]
"""


def test_a_good_file_gives_its_models():
    models = load_declared(GOOD, "models.yaml")
    assert [m.name for m in models] == ["big", "small"] and models[0].profiles[0].tensor_parallel == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"models:\n  - {name: a, source: o/r/a.gguf, contxt: 10}\n", r"models\[0\]: unknown field 'contxt'"),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, profiles: [{name: p, gpu: 1}]}\n",
            r"models\[0\].profiles\[0\]: unknown field 'gpu'",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, context: lots}\n",
            r"Expected `int`, got `str` - at `\$.context`",
        ),
        (b"models:\n  - {name: a, source: o/r/a.gguf}\n  - {name: a, source: o/r/b.gguf}\n", "declared twice"),
        (b"models:\n  - {name: a, source: o/r/a.gguf, fallbacks: [a]}\n", "cannot fall back to itself"),
        (b"models:\n  - {name: a, source: o/r/a.gguf, fallbacks: [zz]}\n", "fallback 'zz' is not in the catalog"),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf}\n  - {name: b, source: o/r/b.gguf, aliases: [a]}\n",
            "alias 'a' is another model's name|that name is an alias of model 'b'",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, profiles: [{name: g, gpus: 3, tensor_parallel: 2}]}\n",
            "tensor_parallel 2 does not divide its 3 GPUs",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a, profiles: [{name: g, engine: vllm, gpus: 1, nodes: 2}]}\n",
            "only llama.cpp spans nodes here",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, profiles: [{name: c, kv_events: true}]}\n",
            "kv_events is vLLM's",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, profiles: [{name: c, min_compute: '8.9'}]}\n",
            "say which cards it needs, and it takes none; set gpus",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, profiles: [{name: c, keep_within: rack}]}\n",
            "keep_within 'rack' only applies to a replica across nodes; set nodes above 1",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, profiles: [{name: c, cpu_moe_layers: 4}]}\n",
            "cpu_moe_layers 4 keeps experts in host memory beside cards, and a CPU profile holds every weight",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a, profiles: [{name: g, engine: vllm, gpus: 1, cpu_moe_layers: 4}]}\n",
            r"cpu_moe_layers is llama.cpp's \(--n-cpu-moe\); drop it or use engine llamacpp",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, profiles: [{name: g, gpus: 1, nodes: 2, cpu_moe_layers: 4}]}"
            b"\n",
            "cpu_moe_layers and nodes 2 are one or the other",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, profiles: [{name: g, gpus: 2, cpu_moe_layers: 4}]}\n",
            "over 2 cards those layers are the first card's",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, profiles: [{name: g, gpus: 1, args: [--n-cpu-moe, '4']}]}\n",
            "--n-cpu-moe.*set the profile's cpu_moe_layers",
        ),
        (
            b"models:\n  - {name: a, source: o/r/a.gguf, profiles: [{name: c, nodes: 0}]}\n",
            r"Expected `int` >= 1 - at `\$.profiles\[0\].nodes`",
        ),
        (b"- just a list\n", "one key, 'models'"),
        (b"models: [\n", "not YAML"),
    ],
)
def test_a_bad_file_is_refused_with_the_place_and_the_fix(text, message):
    with pytest.raises(BadRequest, match=message):
        load_declared(text, "models.yaml")


def test_counts_per_profile_and_a_schedule_are_one_or_the_other():
    m = Model(
        name="m",
        source="o/r/m.gguf",
        profiles=[Profile(name="cpu", replicas=2)],
        scaling=Scaling(min=2, max=2, schedule=[ScheduleWindow(start="08:00", end="18:00", min=4, max=4)]),
    )
    with pytest.raises(BadRequest, match="one or the other"):
        check_model(m)


def test_an_alias_already_taken_is_refused_naming_its_owner():
    others = {"big": Model(name="big", source="o/r/b.gguf", aliases=["large"])}
    with pytest.raises(BadRequest, match="already an alias of model 'big'"):
        check_catalog(Model(name="m", source="o/r/m.gguf", aliases=["large"]), others)
    with pytest.raises(BadRequest, match="that name is an alias of model 'big'"):
        check_catalog(Model(name="large", source="o/r/m.gguf"), others)


async def test_declared_models_are_written_at_start_and_changed_only_in_their_file(serve, nc, tmp_path):
    path = tmp_path / "models.yaml"
    path.write_bytes(GOOD)
    config = CatalogConfig(declared=str(path))
    await serve(Catalog(config), config)
    listed = await call(nc, catalog.MODEL_LIST, Empty())
    assert [(e.model.name, e.declared_in) for e in listed.models] == [("big", str(path)), ("small", str(path))]
    with pytest.raises(BadRequest, match=f"declared in {path}; change it there"):
        await call(nc, catalog.MODEL_CHANGE, StopModel(name="big"))
    with pytest.raises(BadRequest, match="declared in"):
        await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="small", source="o/r/x.gguf")))
    with pytest.raises(BadRequest, match="alias 'large' is already an alias of model 'big'"):
        await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="new", source="o/r/n.gguf", aliases=["large"])))


async def test_a_model_others_fall_back_to_cannot_be_removed(serve, nc):
    await serve(Catalog(CatalogConfig()), CatalogConfig())
    await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="big", source="o/r/b.gguf")))
    await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="small", source="o/r/s.gguf", fallbacks=["big"])))
    with pytest.raises(BadRequest, match="'big' is a fallback of small"):
        await call(nc, catalog.MODEL_REMOVE, ModelRef(name="big"))


def test_a_file_read_again_writes_only_what_changed_and_drops_what_it_no_longer_declares():
    big, small = load_declared(GOOD, "models.yaml")
    entries = {
        "big": ModelEntry(model=big, revision=3, declared_in="models.yaml"),
        "old": ModelEntry(model=Model(name="old", source="o/r/o.gguf"), revision=5, declared_in="models.yaml"),
        "mine": ModelEntry(model=Model(name="mine", source="o/r/m.gguf"), revision=7),
    }
    writes, gone = declared_changes([big, small], entries, "models.yaml")
    assert writes == [(small, 0)] and [e.model.name for e in gone] == ["old"]
    bigger = Model(name="big", source="o/r/big.gguf", context=8192)
    assert declared_changes([bigger], entries, "models.yaml")[0] == [(bigger, 3)]


def test_a_declared_alias_that_an_api_made_model_holds_is_refused():
    mine = {"mine": ModelEntry(model=Model(name="mine", source="o/r/m.gguf", aliases=["large"]), revision=1)}
    with pytest.raises(BadRequest, match="already an alias of model 'mine'"):
        declared_changes(load_declared(GOOD, "models.yaml"), mine, "models.yaml")
