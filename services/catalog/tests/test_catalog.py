"""The catalog on a real JetStream KV bucket: get/list/put/remove, compare-and-set, bad input."""

import pytest

from llmgw.bus import BadRequest, Conflict, NotFound, request
from llmgw.catalog.core import check_model
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.proto import Empty, Model, ModelChange, ModelEntry, ModelList, ModelPut, ModelRef, Profile, Scaling, Subjects

M = Model(name="tiny", source="o/r/tiny.gguf")


@pytest.fixture
async def catalog(serve, nc):
    await serve(Catalog(CatalogConfig()), CatalogConfig())
    return nc


async def test_a_model_put_is_got_listed_and_removed(catalog):
    put = await request(catalog, Subjects.CATALOG_MODEL_PUT, ModelPut(model=M, by="ops"), ModelEntry)
    got = await request(catalog, Subjects.CATALOG_MODEL_GET, ModelRef(name="tiny"), ModelEntry)
    assert got.model == M and got.revision == put.revision and got.changed_by == "ops"
    listed = await request(catalog, Subjects.CATALOG_MODEL_LIST, Empty(), ModelList)
    assert [e.model.name for e in listed.models] == ["tiny"]
    await request(catalog, Subjects.CATALOG_MODEL_REMOVE, ModelRef(name="tiny"), ModelEntry)
    with pytest.raises(NotFound, match="'tiny' is not in the catalog"):
        await request(catalog, Subjects.CATALOG_MODEL_GET, ModelRef(name="tiny"), ModelEntry)
    assert (await request(catalog, Subjects.CATALOG_MODEL_LIST, Empty(), ModelList)).models == []


async def test_two_changes_from_one_revision_one_wins_the_other_gets_409(catalog):
    first = await request(catalog, Subjects.CATALOG_MODEL_PUT, ModelPut(model=M), ModelEntry)
    changed = Model(name="tiny", source="o/r/tiny.gguf", context=8192)
    await request(catalog, Subjects.CATALOG_MODEL_PUT, ModelPut(model=changed, revision=first.revision), ModelEntry)
    with pytest.raises(Conflict, match="changed since revision"):
        await request(catalog, Subjects.CATALOG_MODEL_PUT, ModelPut(model=M, revision=first.revision), ModelEntry)
    with pytest.raises(Conflict, match="already exists"):
        await request(catalog, Subjects.CATALOG_MODEL_PUT, ModelPut(model=M, revision=0), ModelEntry)
    got = await request(catalog, Subjects.CATALOG_MODEL_GET, ModelRef(name="tiny"), ModelEntry)
    assert got.model.context == 8192


async def test_removing_an_unknown_model_is_a_404(catalog):
    with pytest.raises(NotFound):
        await request(catalog, Subjects.CATALOG_MODEL_REMOVE, ModelRef(name="nope"), ModelEntry)


async def test_a_schema_invalid_put_names_the_field_and_stores_nothing(catalog):
    msg = await catalog.request(
        Subjects.CATALOG_MODEL_PUT, b'{"model": {"name": "x", "source": "o/r/x.gguf", "context": -3}}', timeout=5
    )
    assert msg.headers["Nats-Service-Error-Code"] == "400"
    assert "$.model.context" in msg.headers["Nats-Service-Error"]
    assert (await request(catalog, Subjects.CATALOG_MODEL_LIST, Empty(), ModelList)).models == []


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (Model(name="m", source="o/r/f.gguf", profiles=[Profile(name="a"), Profile(name="a")]), "repeated: a"),
        (Model(name="m", source="o/r/f.gguf", scaling=Scaling(min=3, max=1)), "min 3 is above max 1"),
        (Model(name="m", source="o/r/f.safetensors"), "not a .gguf"),
    ],
)
def test_a_model_that_breaks_a_rule_is_refused_saying_which(model, message):
    with pytest.raises(BadRequest, match=message):
        check_model(model)


async def test_changes_through_nats_stop_start_and_count_per_profile(catalog):
    two = Model(
        name="two", source="o/r/two.gguf", profiles=[Profile(name="gpu", gpus=1, priority=5), Profile(name="cpu")]
    )
    await request(catalog, Subjects.CATALOG_MODEL_PUT, ModelPut(model=two), ModelEntry)
    counted = await request(
        catalog,
        Subjects.CATALOG_MODEL_CHANGE,
        ModelChange(name="two", action="replicas", counts={"gpu": 7, "cpu": 4}, by="ops"),
        ModelEntry,
    )
    assert counted.model.scaling == Scaling(min=11, max=11)
    stopped = await request(catalog, Subjects.CATALOG_MODEL_CHANGE, ModelChange(name="two", action="stop"), ModelEntry)
    assert stopped.model.scaling.min == 0 and stopped.model.stopped == Scaling(min=11, max=11)
    with pytest.raises(Conflict, match="already stopped"):
        await request(catalog, Subjects.CATALOG_MODEL_CHANGE, ModelChange(name="two", action="stop"), ModelEntry)
    with pytest.raises(Conflict, match="revision"):
        await request(
            catalog,
            Subjects.CATALOG_MODEL_CHANGE,
            ModelChange(name="two", action="start", revision=counted.revision),
            ModelEntry,
        )
    started = await request(catalog, Subjects.CATALOG_MODEL_CHANGE, ModelChange(name="two", action="start"), ModelEntry)
    assert started.model == counted.model
    with pytest.raises(BadRequest, match="no profile tpu"):
        await request(
            catalog,
            Subjects.CATALOG_MODEL_CHANGE,
            ModelChange(name="two", action="replicas", counts={"tpu": 1}),
            ModelEntry,
        )
    assert (await request(catalog, Subjects.CATALOG_MODEL_GET, ModelRef(name="two"), ModelEntry)).model == counted.model


async def test_a_catalog_restart_loses_nothing(serve, nc):
    first = Catalog(CatalogConfig())
    await serve(first, CatalogConfig())
    await request(nc, Subjects.CATALOG_MODEL_PUT, ModelPut(model=M), ModelEntry)
    await first.ctx.service.stop()
    await serve(Catalog(CatalogConfig()), CatalogConfig())
    assert (await request(nc, Subjects.CATALOG_MODEL_GET, ModelRef(name="tiny"), ModelEntry)).model == M
