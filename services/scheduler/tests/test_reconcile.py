"""reconcile() over fake nodes: placement by memory, removal, surplus, failures backing off."""

import itertools

from hypothesis import given
from hypothesis import strategies as st

from llmgw.proto import Model, NodeInfo, Profile, ReplicaState, Scaling
from llmgw.scheduler.core import NodeView, backoff_s, lost, memory_need_mb, reconcile

NOW = 1_000_000.0
GB = 2**30


def node(name, available_mb, seen=NOW):
    info = NodeInfo(node=name, hostname=name, cpus=8, memory_total_mb=available_mb, memory_available_mb=available_mb)
    return NodeView(info=info, last_seen=seen)


def model(name="m", replicas=1, memory=None):
    return Model(name=name, source=f"o/r/{name}.gguf", scaling=Scaling(min=replicas, max=replicas),
                 profiles=[Profile(host_memory_mb=memory)])


def replica(rid, model="m", node="a", state="ready", updated=NOW - 100, failures=0, memory=1000):
    return ReplicaState(id=rid, model=model, profile="cpu", node=node, state=state, updated=updated,
                        failures=failures, memory_mb=memory)


def run(models, nodes, replicas, weights=None):
    weights = weights if weights is not None else {m.source: GB for m in models}
    return reconcile({m.name: m for m in models}, {n.info.node: n for n in nodes}, replicas, weights, NOW,
                     (f"r{i}" for i in itertools.count()))


def test_a_missing_replica_goes_to_the_node_with_the_most_memory_left():
    plan = run([model()], [node("a", 4000), node("b", 9000)], [])
    assert [(s.replica.node, s.replica.memory_mb) for s in plan.starts] == [("b", memory_need_mb(Profile(), GB))]


def test_a_node_without_a_recent_heartbeat_gets_nothing():
    plan = run([model()], [node("a", 9000, seen=NOW - 60)], [])
    assert plan.starts == [] and "no heartbeat for 60s" in plan.unplaced["m"]


def test_when_no_node_has_the_memory_each_node_says_what_was_short():
    plan = run([model(memory=8000)], [node("a", 4000), node("b", 6000)], [])
    assert plan.starts == []
    assert plan.unplaced["m"] == "a: needs 8000 MiB, 3488 MiB free; b: needs 8000 MiB, 5488 MiB free"


def test_replicas_still_starting_claim_their_memory():
    plan = run([model(replicas=2, memory=3000)], [node("a", 6000)], [replica("x", state="starting", memory=3000)])
    assert plan.starts == [] and plan.unplaced["m"] == "a: needs 3000 MiB, 2488 MiB free"


def test_a_replica_of_a_removed_model_is_stopped():
    plan = run([], [node("a", 9000)], [replica("x", model="gone")])
    assert [(s.replica.id, s.reason) for s in plan.stops] == [("x", "model 'gone' was removed from the catalog")]


def test_a_model_that_runs_enough_changes_nothing():
    plan = run([model()], [node("a", 9000)], [replica("x")])
    assert plan.starts == [] and plan.stops == []


def test_surplus_replicas_are_stopped_newest_first():
    plan = run([model(replicas=1)], [node("a", 9000)], [replica("old", updated=1), replica("new", updated=2)])
    assert [s.replica.id for s in plan.stops] == ["new"]


def test_a_failed_replica_is_replaced_only_after_its_backoff():
    failed = replica("x", state="failed", updated=NOW - 1)
    failed.error = "engine exited"
    waiting = run([model()], [node("a", 9000)], [failed])
    assert waiting.starts == [] and "backing off after 1 failures" in waiting.unplaced["m"]
    failed.updated = NOW - backoff_s(1) - 1
    retried = run([model()], [node("a", 9000)], [failed])
    assert [s.replica.failures for s in retried.starts] == [1]
    assert [s.replica.id for s in retried.stops] == ["x"]


def test_a_model_whose_file_the_mirror_has_not_confirmed_is_not_placed():
    plan = run([model()], [node("a", 9000)], [], weights={})
    assert plan.starts == [] and "has not confirmed" in plan.unplaced["m"]


def test_backoff_doubles_and_is_capped():
    assert [backoff_s(n) for n in (1, 2, 3)] == [5, 10, 20] and backoff_s(50) == 300


@given(st.integers(0, 6), st.lists(st.integers(0, 20_000), min_size=1, max_size=5), st.integers(0, 4))
def test_reconcile_never_overcommits_a_node_nor_runs_more_than_asked(want, memories, running):
    nodes = [node(f"n{i}", m) for i, m in enumerate(memories)]
    live = [replica(f"x{i}", node="n0", memory=100) for i in range(running)]
    plan = run([model(replicas=want, memory=1500)], nodes, live)
    if running >= want:
        assert plan.starts == [] and len(plan.stops) == running - want
    else:
        assert plan.stops == [] and len(plan.starts) <= want - running
        assert len(plan.starts) == want - running or "m" in plan.unplaced
    for n in nodes:
        placed = sum(s.replica.memory_mb for s in plan.starts if s.replica.node == n.info.node)
        assert placed <= max(0, n.info.memory_available_mb - 512)


def test_a_replica_its_agent_no_longer_reports_is_lost_but_one_not_yet_delivered_is_not():
    recorded = [replica("ran", state="ready"), replica("new", state="pending"), replica("here", state="starting"),
                replica("other", node="b")]
    assert [r.id for r in lost("a", {"here"}, recorded)] == ["ran"]
