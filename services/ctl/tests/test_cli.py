"""What `llmgw ctl` prints: tables for people and JSON with the same fields, and one sentence for each
change saying what changed and what happens next."""

import msgspec
import pytest

from llmgw.ctl.sentences import added, purged, said
from llmgw.ctl.tables import model_rows, models_table, replica_rows, replicas_table
from llmgw.proto import (
    Adapter,
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
from llmgw.proto.catalog import (
    RestartModel,
    ScaleModel,
    SetAdapters,
    SetAliases,
    SetClass,
    SetContext,
    SetGpus,
    SetOwner,
    SetReplicas,
    StartModel,
    StopModel,
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
        "MIB",
        "PLANNED/USED",
        "~TOK/S",
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


def test_one_core_is_one_core():
    """'1 cores' was noise a newcomer saw."""
    one = Model(name="one", source="o/r/o.gguf", profiles=[Profile(name="cpu", cpu_cores=1, host_memory_mb=1024)])
    four = Model(name="four", source="o/r/f.gguf", profiles=[Profile(name="cpu", cpu_cores=4, host_memory_mb=1024)])
    rows = models_table(ModelList(models=[entry(one), entry(four)]), ReplicaList(replicas=[])).splitlines()
    assert "1 core, 1.0 GiB" in rows[1] and "4 cores, 1.0 GiB" in rows[2]


def test_model_get_shows_the_yaml_add_takes_with_what_was_set_only():
    """`ctl model get` printed the whole entry as JSON, every default included."""
    import msgspec

    from llmgw.ctl.tables import model_yaml
    from llmgw.proto import ModelEntry, Scaling

    model = Model(
        name="m",
        source="o/r/m.gguf",
        context=8192,
        profiles=[Profile(name="cpu", cpu_cores=2, host_memory_mb=2048)],
        scaling=Scaling(min=1, max=3),
        aliases=["mm"],
    )
    text = model_yaml(ModelEntry(model=model, revision=7, changed_by="ops", declared_in="models.yaml"))
    header, body = text.split("\n", 1)
    assert header == "# m: revision 7, changed by ops, declared in models.yaml (change it there)"
    assert msgspec.yaml.decode(body.encode(), type=Model) == model  # what `add` takes back
    assert "engine:" not in body and "slots:" not in body and "- name: cpu" in body


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


def test_models_as_json_carry_ready_wanted_and_status_as_the_table_shows_them():
    parked = Model(name="big", source="o/r/big.gguf", aliases=["b"])
    statuses = ModelStatusList(models=[ModelStatus(model="big", state="parked", ready=0, wanted=1, reason="no room")])
    replicas = ReplicaList(replicas=[ReplicaState(id="a", model="big", profile="cpu", node="n", state="starting")])
    [row] = msgspec.to_builtins(model_rows(ModelList(models=[entry(parked)]), replicas, statuses))["models"]
    assert (row["name"], row["ready"], row["wanted"], row["status"], row["warning"]) == (
        "big",
        0,
        1,
        "parked",
        "no room",
    )
    assert (
        row["aliases"] == ["b"]
        and row["profiles"] == {"cpu": None}
        and row["reserves"] == "half the cores, weights+10%"
    )
    assert row["model"]["source"] == "o/r/big.gguf" and row["revision"] == 1


def test_the_replica_table_shows_each_replica_and_the_first_line_of_its_error():
    replicas = ReplicaList(
        replicas=[
            ReplicaState(id="r1", model="m", profile="cpu", node="n1", state="ready", url="http://n1:9000"),
            ReplicaState(id="r2", model="m", profile="gpu", node="n2", state="failed", error="exited 1\nmore"),
        ]
    )
    rows = replicas_table(replicas).splitlines()
    assert rows[0].split() == [
        "ID",
        "NODE",
        "MODEL",
        "PROFILE",
        "STATE",
        "MIB",
        "PLANNED/USED",
        "~TOK/S",
        "URL",
        "ERROR",
    ]
    assert rows[1].split() == ["r1", "n1", "m", "cpu", "ready", "-", "-", "http://n1:9000"]
    assert rows[2].split()[:5] == ["r2", "n2", "m", "gpu", "failed"] and rows[2].endswith("exited 1")
    assert [row.id for row in replica_rows(replicas).replicas] == ["r1", "r2"]


def test_the_replica_and_model_tables_show_the_estimate_beside_the_measured_memory():
    replicas = ReplicaList(
        replicas=[
            ReplicaState(id="r1", model="m", profile="cpu", node="n1", state="ready", estimate_mb=812, measured_mb=640),
            ReplicaState(id="r2", model="m", profile="cpu", node="n2", state="starting", estimate_mb=812),
        ]
    )
    rows = replicas_table(replicas).splitlines()
    assert rows[1].split()[5] == "812/640" and rows[2].split()[5] == "812/-"
    assert [(r.estimate_mb, r.measured_mb) for r in replica_rows(replicas).replicas] == [(812, 640), (812, 0)]
    listed = ModelList(models=[entry(Model(name="m", source="o/r/m.gguf"))])
    assert "812/640" in models_table(listed, replicas).splitlines()[1]
    [row] = msgspec.to_builtins(model_rows(listed, replicas))["models"]
    assert (row["estimate_mb"], row["measured_mb"]) == (812, 640)


TWO = Model(
    name="m",
    source="o/r/m.gguf",
    scaling=Scaling(min=3, max=3),
    profiles=[Profile(name="gpu", gpus=2, replicas=2), Profile(name="cpu", replicas=1)],
)


def changed(**kw):
    return ModelEntry(model=msgspec.structs.replace(TWO, **kw), revision=7)


@pytest.mark.parametrize(
    ("change", "after", "sentence"),
    [
        (
            StopModel(name="m"),
            changed(stopped=TWO.scaling, scaling=Scaling(min=0, max=0)),
            "Stopped m: its replicas stop; `llmgw ctl model start m` brings back 3 replicas.",
        ),
        (StartModel(name="m"), changed(), "Started m: the scheduler brings back 3 replicas (gpu=2, cpu=1)."),
        (
            RestartModel(name="m"),
            changed(generation=1),
            "Restarting m (generation 1): its replicas start again one at a time; "
            "each replacement is ready before the old one stops.",
        ),
        (
            ScaleModel(name="m", scaling=Scaling(min=1, max=4)),
            changed(scaling=Scaling(min=1, max=4)),
            "m now runs 1..4 replicas: the scheduler starts or stops replicas to match.",
        ),
        (
            SetReplicas(name="m", counts={"gpu": 2}),
            changed(),
            "m now runs 3 replicas (gpu=2, cpu=1): those short start first, then those over stop.",
        ),
        (
            SetContext(name="m", context=8192),
            changed(context=8192, rollout="in-place"),
            "m: context 8192, max output unset; its replicas restart one at a time, "
            "each stops before its replacement starts.",
        ),
        (
            SetContext(name="m", max_output=100),
            changed(max_output=100),
            "m: max output 100, applied at once; no replica restarts.",
        ),
        (
            SetGpus(name="m", gpus={"gpu": 4}),
            changed(profiles=[Profile(name="gpu", gpus=4, replicas=2), Profile(name="cpu", replicas=1)]),
            "m: profile gpu takes 4 GPUs a replica; its replicas restart one at a time, "
            "each replacement is ready before the old one stops.",
        ),
        (
            SetClass(name="m", capacity_class="batch"),
            changed(capacity_class="batch"),
            "m is now class batch: critical and standard models may take its room; nothing restarts.",
        ),
        (SetOwner(name="m", owner="ml"), changed(owner="ml"), "m is now owned by ml; nothing restarts."),
        (
            SetAliases(name="m", add_aliases=["x"]),
            changed(aliases=["x"]),
            "m: aliases x; routers answer to them at once, nothing restarts.",
        ),
        (
            SetAdapters(name="m", add=[Adapter(name="sql", source="o/a/sql.gguf")]),
            changed(adapters=[Adapter(name="sql", source="o/a/sql.gguf")]),
            "m: adapters m:sql; where the set changed, its replicas load it one at a time, "
            "each replacement is ready before the old one stops.",
        ),
    ],
)
def test_each_change_says_what_changed_and_what_happens_next(change, after, sentence):
    assert said(change, after) == sentence


def test_adding_a_model_says_where_it_is_and_what_the_scheduler_does_next():
    assert added(changed()) == (
        "m is in the catalog: the scheduler places 3 replicas (gpu=2, cpu=1); `llmgw ctl models` shows how it is doing."
    )
    on_demand = ModelEntry(
        model=Model(name="o", source="o/r/o.gguf", scaling=Scaling(min=0, max=1, idle_timeout_s=60)), revision=1
    )
    assert "none runs until a request asks for it" in added(on_demand)


@pytest.mark.parametrize(
    ("tokens_per_s", "cell"),
    [(0.0, "-"), (102.4, "102"), (12.3, "12 (slow)"), (3.04, "3.0 (very slow)")],
)
def test_the_speed_cell_marks_slow_and_very_slow_ways(tokens_per_s, cell):
    from llmgw.ctl.tables import speed_cell

    assert speed_cell(tokens_per_s) == cell
