"""Remove with --purge across services: the catalog, a real mirror, and two agents on one nats-server.

Each agent is the real service with its own node name and cache; one of them runs a real
llama-server on the file, so it keeps it. No scheduler runs here: the replica is started by
asking its agent directly, as the scheduler would.
"""

import pytest

from llmgw.agent.service import Agent, AgentConfig
from llmgw.bus import NotFound, call
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.gguf import TinyLlama, write_random_llama
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import (
    FileRef,
    Model,
    ModelPurge,
    ModelPut,
    ModelRef,
    Profile,
    ReplicaSpec,
    ReplicaStart,
    Scaling,
    agent,
    catalog,
    mirror,
)

SHARED, OWN = "test/shared/m.gguf", "test/own/m.gguf"


def cached(node_agent, source):
    """Whether `agent`'s cache holds `source`."""
    return any(source in sources for sources in node_agent.weights.entries().values())


@pytest.fixture
async def fleet(serve, nc, tmp_path):
    """A catalog, a mirror holding two files, and agents 'a' and 'b' that both cached them."""
    mirror_root = tmp_path / "mirror"
    write_random_llama(mirror_root / SHARED)
    write_random_llama(mirror_root / OWN, TinyLlama(seed=1))
    await serve(Mirror(MirrorConfig(root=str(mirror_root))), MirrorConfig())
    config = CatalogConfig(purge_wait_s=0.5, purge_gather_s=1.0)
    await serve(Catalog(config), config)
    agents = {}
    for node in ("a", "b"):
        cfg = AgentConfig(node=node, data_dir=str(tmp_path / node), heartbeat_s=60)
        agents[node] = await serve(Agent(cfg), cfg)
        for source in (SHARED, OWN):  # each node fetched both files, as for a replica
            info = await call(nc, mirror.FILE_STAT, FileRef(source=source))
            await agents[node].weights.fetch(info)
    for name, source in (("first", SHARED), ("second", SHARED), ("own", OWN)):
        model = Model(name=name, source=source, context=256, scaling=Scaling(min=0, max=1))
        await call(nc, catalog.MODEL_PUT, ModelPut(model=model, by="test"))
    return mirror_root, agents


async def test_a_purge_deletes_the_file_from_the_mirror_and_every_node(fleet, nc):
    mirror_root, agents = fleet
    report = await call(nc, catalog.MODEL_PURGE, ModelPurge(name="own", by="test"), timeout=20)
    assert report.entry.model.name == "own" and report.kept == []
    assert sorted((d.where, d.source) for d in report.deleted) == [("a", OWN), ("b", OWN), ("mirror", OWN)]
    assert not (mirror_root / OWN).exists() and not (mirror_root / "test" / "own").exists()
    assert not any(cached(a, OWN) for a in agents.values())
    with pytest.raises(NotFound):
        await call(nc, catalog.MODEL_GET, ModelRef(name="own"))


async def test_a_purge_keeps_a_file_another_model_uses_and_says_which(fleet, nc):
    mirror_root, agents = fleet
    report = await call(nc, catalog.MODEL_PURGE, ModelPurge(name="first"), timeout=20)
    assert report.deleted == []
    assert [(k.source, k.why) for k in report.kept] == [(SHARED, "model second uses it")]
    assert (mirror_root / SHARED).is_file() and all(cached(a, SHARED) for a in agents.values())


async def test_a_node_keeps_a_file_its_running_replica_uses(fleet, nc):
    mirror_root, agents = fleet
    model = Model(name="own", source=OWN, context=256, scaling=Scaling(min=0, max=1))
    replica = ReplicaSpec(id="r1", model="own", profile="cpu", node="a")
    started = await call(
        nc, agent.REPLICA_START, ReplicaStart(replica=replica, model=model, profile=Profile(slots=1)), node="a"
    )
    assert started.state == "fetching"
    report = await call(nc, catalog.MODEL_PURGE, ModelPurge(name="own"), timeout=20)
    assert sorted(d.where for d in report.deleted) == ["b", "mirror"]
    assert [(k.where, k.why) for k in report.kept] == [("a", "replica r1 runs on it")]
    assert cached(agents["a"], OWN) and not cached(agents["b"], OWN)


async def test_purging_an_unknown_model_is_a_404_and_deletes_nothing(fleet, nc):
    mirror_root, _ = fleet
    with pytest.raises(NotFound, match="'nope' is not in the catalog"):
        await call(nc, catalog.MODEL_PURGE, ModelPurge(name="nope"))
    assert (mirror_root / OWN).is_file() and (mirror_root / SHARED).is_file()


async def test_a_file_cached_under_two_sources_is_kept_while_the_other_is_in_use(fleet, nc, tmp_path):
    mirror_root, agents = fleet
    twin = "test/twin/m.gguf"
    (mirror_root / twin).parent.mkdir(parents=True)
    (mirror_root / twin).write_bytes((mirror_root / OWN).read_bytes())
    info = await call(nc, mirror.FILE_STAT, FileRef(source=twin))
    await agents["a"].weights.fetch(info)
    assert agents["a"].weights.fetches == 2  # the same content: not fetched again
    report = await call(nc, catalog.MODEL_PURGE, ModelPurge(name="own"), timeout=20)
    assert ("a", f"the same file is also {twin}") in [(k.where, k.why) for k in report.kept]
