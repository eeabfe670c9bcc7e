"""What `llmgw ctl` prints: the models table and the sentence a purge answers with."""

from llmgw.ctl.cli import models_table, purged
from llmgw.proto import (
    FilePlace,
    Model,
    ModelEntry,
    ModelList,
    ModelStatus,
    ModelStatusList,
    Profile,
    PurgeReport,
    ReplicaList,
    ReplicaState,
    Scaling,
)


def entry(model):
    return ModelEntry(model=model, revision=1)


def test_the_table_shows_counts_what_a_replica_reserves_and_why_replicas_failed():
    counted = Model(
        name="big",
        source="o/r/big.gguf",
        scaling=Scaling(min=3, max=3),
        profiles=[
            Profile(name="gpu", gpus=2, gpu_class="h100-80g", priority=10, replicas=2),
            Profile(name="cpu", cpu_cores=16, host_memory_mb=40960, replicas=1),
        ],
    )
    small = Model(name="small", source="o/r/s.gguf", aliases=["s"], fallbacks=["big"])
    replicas = ReplicaList(
        replicas=[
            ReplicaState(id="a", model="big", profile="gpu", node="n", state="ready"),
            ReplicaState(
                id="b", model="small", profile="cpu", node="n", state="failed", error="engine exited with status 1"
            ),
        ]
    )
    rows = models_table(ModelList(models=[entry(counted), entry(small)]), replicas).splitlines()
    assert rows[0].split() == [
        "MODEL",
        "READY",
        "STATUS",
        "CLASS",
        "RESERVES",
        "PROFILES",
        "ALIASES",
        "FALLBACKS",
        "WARNINGS",
    ]
    assert rows[1].split()[:5] == ["big", "1/3", "running", "standard", "2xh100-80g"] and "gpu=2, cpu=1" in rows[1]
    assert "half the cores, weights+10%" in rows[2] and rows[2].endswith("1 failed: engine exited with status 1")


def test_a_replica_across_nodes_reserves_its_share_on_each():
    big = Model(name="big", source="o/r/big.gguf", profiles=[Profile(name="rpc", nodes=3, keep_within="rack")])
    cards = Model(name="huge", source="o/r/h.gguf", profiles=[Profile(name="g", gpus=8, nodes=2)])
    rows = models_table(ModelList(models=[entry(big), entry(cards)]), ReplicaList(replicas=[])).splitlines()
    assert "half the cores, weights/3+10% on each of 3 nodes" in rows[1]
    assert "8xgpu on each of 2 nodes" in rows[2]


def test_a_purge_says_what_it_deleted_where_and_what_it_kept():
    report = PurgeReport(
        entry=entry(Model(name="m", source="o/r/m.gguf")),
        deleted=[FilePlace(source="o/r/m.gguf", where="mirror"), FilePlace(source="o/r/m.gguf", where="node-a")],
        kept=[FilePlace(source="o/r/m.gguf", where="node-b", why="replica r1 runs on it")],
    )
    assert purged(report) == (
        "Removed m from the catalog. Deleted o/r/m.gguf from mirror, node-a. "
        "Kept o/r/m.gguf (node-b): replica r1 runs on it."
    )
    nothing = PurgeReport(entry=entry(Model(name="m", source="o/r/m.gguf")))
    assert purged(nothing).endswith("No copy of o/r/m.gguf was found to delete.")


def test_the_table_shows_the_schedulers_status_and_why_a_model_is_parked():
    parked = Model(name="big", source="o/r/big.gguf")
    statuses = ModelStatusList(
        models=[
            ModelStatus(
                model="big", state="parked", ready=0, wanted=1, reason="a: memory: needs 90000 MiB, 2000 MiB free"
            )
        ]
    )
    rows = models_table(ModelList(models=[entry(parked)]), ReplicaList(replicas=[]), statuses).splitlines()
    assert rows[1].split()[:3] == ["big", "0/1", "parked"]
    assert rows[1].endswith("a: memory: needs 90000 MiB, 2000 MiB free")
