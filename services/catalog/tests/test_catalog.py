"""The catalog on a real JetStream KV bucket: get/list/put/remove, compare-and-set, bad input."""

import pytest

from llmgw.bus import BadRequest, Conflict, NotFound, call, request_raw
from llmgw.catalog.core import check_model
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.proto import Empty, Model, ModelPurge, ModelPut, ModelRef, Profile, Scaling, catalog
from llmgw.proto.catalog import SetReplicas, StartModel, StopModel

M = Model(name="tiny", source="o/r/tiny.gguf")


@pytest.fixture
async def client(serve, nc):
    await serve(Catalog(CatalogConfig()), CatalogConfig())
    return nc


async def test_a_model_put_is_got_listed_and_removed(client):
    put = await call(client, catalog.MODEL_PUT, ModelPut(model=M, by="ops"))
    got = await call(client, catalog.MODEL_GET, ModelRef(name="tiny"))
    assert got.model == M and got.revision == put.revision and got.changed_by == "ops"
    listed = await call(client, catalog.MODEL_LIST, Empty())
    assert [e.model.name for e in listed.models] == ["tiny"]
    await call(client, catalog.MODEL_REMOVE, ModelRef(name="tiny"))
    with pytest.raises(NotFound, match="'tiny' is not in the catalog"):
        await call(client, catalog.MODEL_GET, ModelRef(name="tiny"))
    assert (await call(client, catalog.MODEL_LIST, Empty())).models == []


async def test_two_changes_from_one_revision_one_wins_the_other_gets_409(client):
    first = await call(client, catalog.MODEL_PUT, ModelPut(model=M))
    changed = Model(name="tiny", source="o/r/tiny.gguf", context=8192)
    await call(client, catalog.MODEL_PUT, ModelPut(model=changed, revision=first.revision))
    with pytest.raises(Conflict, match="changed since revision"):
        await call(client, catalog.MODEL_PUT, ModelPut(model=M, revision=first.revision))
    with pytest.raises(Conflict, match=r"already exists: give the new one another name \(serve --name\)"):
        await call(client, catalog.MODEL_PUT, ModelPut(model=M, revision=0))
    got = await call(client, catalog.MODEL_GET, ModelRef(name="tiny"))
    assert got.model.context == 8192


async def test_a_remove_or_purge_at_a_stale_revision_is_a_409_and_removes_nothing(client):
    first = await call(client, catalog.MODEL_PUT, ModelPut(model=M))
    await call(client, catalog.MODEL_CHANGE, StopModel(name="tiny"))
    with pytest.raises(Conflict, match=f"at revision {first.revision + 1}, not {first.revision}"):
        await call(client, catalog.MODEL_REMOVE, ModelRef(name="tiny", revision=first.revision))
    with pytest.raises(Conflict, match=f"not {first.revision}"):
        await call(client, catalog.MODEL_PURGE, ModelPurge(name="tiny", revision=first.revision))
    got = await call(client, catalog.MODEL_GET, ModelRef(name="tiny"))
    assert got.revision == first.revision + 1
    removed = await call(client, catalog.MODEL_REMOVE, ModelRef(name="tiny", revision=got.revision))
    assert removed.revision == got.revision
    assert (await call(client, catalog.MODEL_LIST, Empty())).models == []


async def test_removing_an_unknown_model_is_a_404(client):
    with pytest.raises(NotFound):
        await call(client, catalog.MODEL_REMOVE, ModelRef(name="nope"))


async def test_a_schema_invalid_put_names_the_field_and_stores_nothing(client):
    msg = await request_raw(
        client,
        catalog.MODEL_PUT.subject(),
        b'{"model": {"name": "x", "source": "o/r/x.gguf", "context": -3}}',
        timeout=5,
    )
    assert msg.headers["Nats-Service-Error-Code"] == "400"
    assert "model.context must be 128 or more" in msg.headers["Nats-Service-Error"]
    assert (await call(client, catalog.MODEL_LIST, Empty())).models == []


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


async def test_changes_through_nats_stop_start_and_count_per_profile(client):
    two = Model(
        name="two", source="o/r/two.gguf", profiles=[Profile(name="gpu", gpus=1, priority=5), Profile(name="cpu")]
    )
    await call(client, catalog.MODEL_PUT, ModelPut(model=two))
    counted = await call(client, catalog.MODEL_CHANGE, SetReplicas(name="two", counts={"gpu": 7, "cpu": 4}, by="ops"))
    assert counted.model.scaling == Scaling(min=11, max=11)
    stopped = await call(client, catalog.MODEL_CHANGE, StopModel(name="two"))
    assert stopped.model.scaling.min == 0 and stopped.model.stopped == Scaling(min=11, max=11)
    with pytest.raises(Conflict, match="already stopped"):
        await call(client, catalog.MODEL_CHANGE, StopModel(name="two"))
    with pytest.raises(Conflict, match="revision"):
        await call(client, catalog.MODEL_CHANGE, StartModel(name="two", revision=counted.revision))
    started = await call(client, catalog.MODEL_CHANGE, StartModel(name="two"))
    assert started.model == counted.model
    with pytest.raises(BadRequest, match="no profile tpu"):
        await call(client, catalog.MODEL_CHANGE, SetReplicas(name="two", counts={"tpu": 1}))
    assert (await call(client, catalog.MODEL_GET, ModelRef(name="two"))).model == counted.model


async def test_a_catalog_restart_loses_nothing(serve, nc):
    first = Catalog(CatalogConfig())
    await serve(first, CatalogConfig())
    await call(nc, catalog.MODEL_PUT, ModelPut(model=M))
    await first.ctx.service.stop()
    await serve(Catalog(CatalogConfig()), CatalogConfig())
    assert (await call(nc, catalog.MODEL_GET, ModelRef(name="tiny"))).model == M


async def test_a_change_missing_what_its_action_needs_is_a_400_naming_the_field(client):
    await call(client, catalog.MODEL_PUT, ModelPut(model=M))
    msg = await request_raw(client, catalog.MODEL_CHANGE.subject(), b'{"action": "scale", "name": "tiny"}', timeout=5)
    assert msg.headers["Nats-Service-Error-Code"] == "400"
    said = msg.headers["Nats-Service-Error"]
    assert said == "scaling is missing: give it (ModelChange on llmgw.v1.catalog.model.change)"
