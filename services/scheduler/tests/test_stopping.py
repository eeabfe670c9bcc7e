"""Replicas being stopped hold their room until their agents stopped them; a start placed in room
that this pass frees waits for the stops that free it; a ready replica drains first."""

import itertools

import pytest

from llmgw.proto import Model, Profile, ReplicaState, Scaling, Worker, fingerprint
from llmgw.scheduler.core import Actual, Desired, Policy, reconcile
from services.scheduler.tests.fake_nodes import GB, NOW, Node


def _model(profile, name="m", replicas=1, capacity_class="standard"):
    return Model(
        name=name,
        source=f"o/r/{name}.gguf",
        profiles=[profile],
        scaling=Scaling(min=replicas, max=replicas),
        capacity_class=capacity_class,
    )


def _stopping(node="a", gpus=(), cores=0, workers=(), model="other"):
    return ReplicaState(
        id="old",
        model=model,
        profile="p",
        node=node,
        state="draining",
        gpus=list(gpus),
        cores=cores,
        workers=list(workers),
    )


def _pass(models, nodes, replicas=(), stopping=(), policy=Policy()):
    actual = Actual(
        nodes={n.info.node: n.view() for n in nodes},
        replicas=list(replicas),
        stopping=list(stopping),
        weights={m.source: GB for m in models},
    )
    ids = (f"r{i}" for i in itertools.count())
    return reconcile(Desired(models={m.name: m for m in models}), actual, NOW, policy, ids=ids)


CARD = Profile(name="gpu", gpus=1)
CORES = Profile(name="cpu", cpu_cores=16, host_memory_mb=1000)


@pytest.mark.parametrize(
    ("profile", "node", "stopping", "placed", "why"),
    [
        (CARD, Node("a").cards(1), [_stopping(gpus=["a-gpu0"])], [], "cards: needs 1 free any class cards"),
        (CORES, Node("a"), [_stopping(cores=16)], [], "cores: needs 16 cores, 0 of 16 free"),
        (CORES, Node("a"), [_stopping(node="b", workers=[Worker(node="a", cores=16)])], [], "cores: needs 16"),
        (CARD, Node("a").cards(2), [_stopping(gpus=["a-gpu0"])], [("a", ["a-gpu1"])], ""),
        (CARD, Node("a").cards(1), [_stopping(node="b", gpus=["b-gpu0"])], [("a", ["a-gpu0"])], ""),
        (CARD, Node("a").cards(1), [], [("a", ["a-gpu0"])], ""),
    ],
    ids=[
        "its cards",
        "its cores",
        "its worker's cores",
        "the cards it does not hold",
        "on another node",
        "once it stopped",
    ],
)
def test_a_replica_being_stopped_keeps_its_room_until_it_stopped(profile, node, stopping, placed, why):
    plan = _pass([_model(profile)], [node], stopping=stopping)
    assert [(s.replica.node, s.replica.gpus) for s in plan.starts] == placed
    assert why in plan.unplaced.get("m", "")
    assert plan.stops == []  # being stopped already: never stopped twice


def test_a_replica_being_stopped_is_never_preempted_again():
    batch = _model(CORES, name="batch", capacity_class="batch")
    urgent = _model(CORES, name="urgent", capacity_class="critical")
    plan = _pass([batch, urgent], [Node("a")], stopping=[_stopping(cores=16, model="batch")])
    assert plan.stops == [] and plan.starts == []
    assert "cores: needs 16 cores, 0 of 16 free" in plan.unplaced["urgent"]


def test_a_start_in_the_room_of_a_replica_stopped_in_this_pass_waits_for_that_stop():
    batch = _model(CORES, name="batch", capacity_class="batch")
    urgent = _model(CORES, name="urgent", capacity_class="critical")
    running = ReplicaState(
        id="b1",
        model="batch",
        profile="cpu",
        node="a",
        state="ready",
        cores=16,
        memory_mb=1000,
        fingerprint=fingerprint(batch, CORES),
    )
    plan = _pass([batch, urgent], [Node("a")], [running], policy=Policy(drain_s=7.0))
    assert [(s.replica.id, s.grace_s) for s in plan.stops] == [("b1", 0.0)]  # its room is needed at once
    assert [(s.replica.model, s.after) for s in plan.starts] == [("urgent", ["b1"])]


def test_a_ready_replica_stopped_drains_for_the_policys_grace_and_others_stop_at_once():
    m = _model(Profile(name="cpu", host_memory_mb=1000), replicas=0)
    fp = fingerprint(m, m.profiles[0])
    replicas = [
        ReplicaState(id=rid, model="m", profile="cpu", node=node, state=state, updated=NOW - 10, fingerprint=fp)
        for rid, node, state in (("ready", "a", "ready"), ("starting", "a", "starting"), ("lost", "gone", "ready"))
    ]
    plan = _pass([m], [Node("a")], replicas, policy=Policy(drain_s=7.0, lost_s=30.0))
    assert sorted((s.replica.id, s.grace_s) for s in plan.stops) == [("lost", 0.0), ("ready", 7.0), ("starting", 0.0)]
    none = _pass([m], [Node("a")], replicas[:1], policy=Policy(drain_s=0.0))
    assert [(s.replica.id, s.grace_s) for s in none.stops] == [("ready", 0.0)]


def test_a_start_waits_for_a_draining_replica_only_where_it_takes_its_cards():
    removed = ReplicaState(id="old", model="gone", profile="gpu", node="a", state="ready", gpus=["a-gpu0"])
    on_card = _pass([_model(CARD)], [Node("a").cards(1)], [removed], policy=Policy(drain_s=7.0))
    assert [(s.replica.id, s.grace_s) for s in on_card.stops] == [("old", 7.0)]
    assert [(s.replica.gpus, s.after) for s in on_card.starts] == [(["a-gpu0"], ["old"])]
    on_cpu = _pass([_model(CORES)], [Node("a").cards(1)], [removed], policy=Policy(drain_s=7.0))
    assert [(s.replica.gpus, s.after) for s in on_cpu.starts] == [([], [])]  # it takes no card of the old one
