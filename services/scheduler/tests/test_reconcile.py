"""reconcile() over fake nodes: placement by memory, removal, surplus, failures backing off."""

import gc
import itertools
from unittest import mock

import msgspec
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from llmgw.proto import Model, NodeInfo, Profile, ReplicaState, Scaling, Worker, fingerprint
from llmgw.scheduler.core import (
    Actual,
    Desired,
    NodeView,
    _reconcile,
    _rollout,
    backoff_s,
    lost,
    lost_workers,
    reconcile,
    status,
    wanted,
)
from llmgw.scheduler.placement import need_of
from services.scheduler.tests.scheduler_sim import simulate as run_ticks

NOW = 1_000_000.0
GB = 2**30


def node(name, available_mb, seen=NOW):
    info = NodeInfo(node=name, hostname=name, cpus=8, memory_total_mb=available_mb, memory_available_mb=available_mb)
    return NodeView(info=info, last_seen=seen)


def model(name="m", replicas=1, memory=None, nodes=1):
    return Model(
        name=name,
        source=f"o/r/{name}.gguf",
        scaling=Scaling(min=replicas, max=replicas),
        profiles=[Profile(host_memory_mb=memory, nodes=nodes)],
    )


CURRENT = "current"
"""A replica started with its model's profile as the catalog has it now (`run` fills it in)."""


def replica(rid, model="m", node="a", state="ready", updated=NOW - 100, failures=0, memory=1000, fp=CURRENT):
    return ReplicaState(
        id=rid,
        model=model,
        profile="cpu",
        node=node,
        state=state,
        updated=updated,
        failures=failures,
        memory_mb=memory,
        fingerprint=fp,
    )


def run(models, nodes, replicas, weights=None, now=NOW):
    weights = weights if weights is not None else {m.source: GB for m in models}
    by_name = {m.name: m for m in models}
    replicas = [
        msgspec.structs.replace(r, fingerprint=fingerprint(by_name[r.model], by_name[r.model].profiles[0]))
        if r.fingerprint == CURRENT and r.model in by_name
        else r
        for r in replicas
    ]
    return reconcile(
        Desired(models=by_name),
        Actual(nodes={n.info.node: n for n in nodes}, replicas=replicas, weights=weights),
        now,
        ids=(f"r{i}-{now}" for i in itertools.count()),
    )


def test_a_missing_replica_goes_to_the_node_with_the_most_memory_left():
    plan = run([model()], [node("a", 4000), node("b", 9000)], [])
    assert [(s.replica.node, s.replica.memory_mb) for s in plan.starts] == [("b", need_of(Profile(), GB).memory_mb)]


def test_a_node_without_a_recent_heartbeat_gets_nothing():
    plan = run([model()], [node("a", 9000, seen=NOW - 60)], [])
    assert plan.starts == [] and "no heartbeat for 60s" in plan.unplaced["m"]


def test_when_no_node_has_the_memory_each_node_says_what_was_short():
    plan = run([model(memory=8000)], [node("a", 4000), node("b", 6000)], [])
    assert plan.starts == []
    assert plan.unplaced["m"] == "a: memory: needs 8000 MiB, 3488 MiB free; b: memory: needs 8000 MiB, 5488 MiB free"


def test_replicas_still_starting_claim_their_memory():
    plan = run([model(replicas=2, memory=3000)], [node("a", 6000)], [replica("x", state="starting", memory=3000)])
    assert plan.starts == [] and plan.unplaced["m"] == "a: memory: needs 3000 MiB, 2488 MiB free"


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


@given(
    st.integers(0, 6), st.lists(st.integers(0, 20_000), min_size=1, max_size=5), st.integers(0, 4), st.integers(1, 3)
)
def test_reconcile_never_overcommits_a_node_nor_runs_more_than_asked(want, memories, running, spans):
    for n in (nodes := [node(f"n{i}", m) for i, m in enumerate(memories)]):
        n.info.engines = {"llamacpp": "1", "llamacpp-rpc": "1"}
    live = [replica(f"x{i}", node="n0", memory=100) for i in range(running)]
    plan = run([model(replicas=want, memory=1500, nodes=spans)], nodes, live)
    if running >= want:
        assert plan.starts == [] and len(plan.stops) == running - want
    else:
        assert plan.stops == [] and len(plan.starts) <= want - running
        assert len(plan.starts) == want - running or "m" in plan.unplaced
    for n in nodes:
        placed = sum(s.replica.memory_mb for s in plan.starts if s.replica.node == n.info.node)
        placed += sum(w.memory_mb for s in plan.starts for w in s.replica.workers if w.node == n.info.node)
        assert placed <= max(0, n.info.memory_available_mb - 512)
    for s in plan.starts:  # a replica across nodes takes that many distinct nodes
        assert len({s.replica.node, *(w.node for w in s.replica.workers)}) == spans


def test_a_replica_its_agent_no_longer_reports_is_lost_but_one_not_yet_delivered_is_not():
    recorded = [
        replica("ran", state="ready"),
        replica("new", state="pending"),
        replica("here", state="starting"),
        replica("other", node="b"),
    ]
    assert [r.id for r in lost("a", {"here"}, recorded)] == ["ran"]


def test_a_replica_whose_worker_its_node_no_longer_reports_is_broken():
    spanning = [
        msgspec.structs.replace(replica(rid, state=state), workers=[Worker(node="b", endpoint="b:1")])
        for rid, state in (("ran", "ready"), ("new", "pending"), ("here", "starting"))
    ]
    assert [r.id for r in lost_workers("b", {"here"}, spanning)] == ["ran"]
    assert lost_workers("a", set(), spanning) == []  # its engine's node: that is lost()'s


def simulate(m, total_mb, replicas, ticks=40):
    """Apply plans tick by tick as the shell and the agents would: a started replica is ready a tick later.

    One node of `total_mb`, whose available memory is what its ready replicas leave. Returns the
    ready count seen after every tick and the replicas at the end.
    """

    def plan_for(current, now):
        used = sum(r.memory_mb for r in current if r.state == "ready")
        return run([m], [node("a", total_mb - used, seen=now)], current, now=now)

    return run_ticks(plan_for, replicas, NOW, ticks)


def test_a_restart_replaces_every_replica_one_at_a_time_and_never_runs_fewer():
    m = model(replicas=3, memory=1000)
    before = [replica(f"x{i}", memory=1000, updated=NOW - 100 + i) for i in range(3)]
    restarted = msgspec.structs.replace(m, generation=1)
    plan = run(
        [restarted],
        [node("a", 9000)],
        [msgspec.structs.replace(r, fingerprint=fingerprint(m, m.profiles[0])) for r in before],
    )
    assert len(plan.starts) == 1 and plan.stops == []  # one replacement beside the old ones first
    old = fingerprint(m, m.profiles[0])
    ready_seen, after = simulate(restarted, 9000, [msgspec.structs.replace(r, fingerprint=old) for r in before])
    assert min(ready_seen) >= 3
    assert len(after) == 3 and all(r.fingerprint == fingerprint(restarted, restarted.profiles[0]) for r in after)
    assert not {r.id for r in before} & {r.id for r in after}


def test_a_model_changed_after_a_pass_makes_its_replicas_stale_in_the_next():
    # each model's fingerprints are remembered for the object (`fingerprints`): a change is a
    # new record, and the record a pass saw dies without leaving its fingerprints behind
    m = model(replicas=2, memory=1000)
    running = [replica(f"x{i}", fp=fingerprint(m, m.profiles[0])) for i in range(2)]
    assert run([m], [node("a", 9000)], running).starts == []
    with pytest.raises(AttributeError):
        m.profiles[0].args = ["--flash-attn", "on"]  # frozen: no field is set in place
    changed = msgspec.structs.replace(m, profiles=[msgspec.structs.replace(m.profiles[0], args=["-fa", "on"])])
    assert len(run([changed], [node("a", 9000)], running).starts) == 1
    assert _rollout.fingerprints(changed)["cpu"] == fingerprint(changed, changed.profiles[0]) != running[0].fingerprint
    keys = {id(m), id(changed)}
    assert keys <= _rollout._OF_MODEL.keys()
    del m, changed
    gc.collect()
    assert not keys & _rollout._OF_MODEL.keys()


_STATES = ("pending", "fetching", "starting", "ready", "failed", "draining", "stopped")


@given(
    want=st.integers(0, 3),
    kept=st.lists(st.tuples(st.sampled_from(_STATES), st.booleans(), st.sampled_from(["a", "lost"])), max_size=4),
    rollout=st.sampled_from(["surge", "in-place"]),
    counted=st.none() | st.integers(0, 3),
)
@example(want=1, kept=[("failed", True, "a")], rollout="surge", counted=None)  # counted, but not live
@example(want=1, kept=[("draining", True, "a")], rollout="surge", counted=None)
@example(want=1, kept=[("ready", False, "a")], rollout="in-place", counted=None)  # live, but stale
@example(want=1, kept=[("ready", True, "lost")], rollout="surge", counted=None)  # on a lost node
@example(want=1, kept=[("ready", True, "a")], rollout="surge", counted=2)  # its profile counted
def test_a_model_the_pass_leaves_alone_has_nothing_to_do(want, kept, rollout, counted):
    # one walk judges each replica (live, current) and the pass leaves out the models it finds
    # settled: asking every model instead gives the same plan, so leaving one out hid nothing
    m = msgspec.structs.replace(model(replicas=want, memory=1000), rollout=rollout)
    m = msgspec.structs.replace(m, profiles=[msgspec.structs.replace(m.profiles[0], replicas=counted)])
    other = model("o", replicas=1, memory=1000)
    replicas = [replica("o1", model="o")]
    replicas += [
        replica(f"x{i}", node=where, state=state, fp=CURRENT if current else "old", updated=NOW - 100 + i)
        for i, (state, current, where) in enumerate(kept)
    ]
    nodes = [node("a", 9000), node("lost", 9000, seen=NOW - 3600)]
    plans = [run([m, other], nodes, replicas)]
    with mock.patch.object(_reconcile, "settled", lambda *_: False):
        plans.append(run([m, other], nodes, replicas))
    said = [
        (
            sorted((s.replica.id, s.reason) for s in p.stops),
            sorted((s.replica.model, s.replica.node) for s in p.starts),
            p.unplaced,
        )
        for p in plans
    ]
    assert said[0] == said[1]


def test_in_place_stops_one_stale_replica_before_its_replacement_and_dips_by_one_at_most():
    m = model(replicas=3, memory=3000)
    old = fingerprint(m, m.profiles[0])
    changed = msgspec.structs.replace(m, context=8192, rollout="in-place")
    before = [replica(f"x{i}", memory=3000, fp=old) for i in range(3)]
    first = run([changed], [node("a", 512)], before)  # full: the three use all there is
    assert len(first.stops) == 1 and len(first.starts) == 1
    ready_seen, after = simulate(changed, 9000 + 512, before)
    assert min(ready_seen) == 2 and ready_seen[-1] == 3
    assert all(r.fingerprint == fingerprint(changed, changed.profiles[0]) for r in after)


def test_a_surge_with_no_room_beside_says_so_and_stops_nothing():
    m = model(replicas=1, memory=3000)
    stale = [replica("x", memory=3000, fp="old")]
    plan = run([m], [node("a", 1000 + 512)], stale)  # the stale one holds its 3000 already
    assert plan.stops == [] and plan.starts == []
    assert "`--in-place` stops that one first" in plan.unplaced["m"]


def test_a_replacement_that_fails_takes_no_second_replica_down_in_place():
    m = msgspec.structs.replace(model(replicas=2), rollout="in-place")
    replicas = [replica("x", fp="old"), replica("failed", state="failed", updated=NOW - 1, fp=CURRENT)]
    plan = run([m], [node("a", 9000)], replicas)
    assert plan.stops == [] and "backing off" in plan.unplaced["m"]


def test_changing_counts_or_weights_leaves_running_replicas_alone():
    m = model(replicas=2)
    weighted = msgspec.structs.replace(m, profiles=[msgspec.structs.replace(m.profiles[0], weight=5, replicas=2)])
    assert fingerprint(m, m.profiles[0]) == fingerprint(weighted, weighted.profiles[0])
    plan = run(
        [weighted],
        [node("a", 9000)],
        [replica("x", fp=fingerprint(m, m.profiles[0])), replica("y", fp=fingerprint(m, m.profiles[0]))],
    )
    assert plan.starts == [] and plan.stops == []


@pytest.mark.parametrize("rollout", ["surge", "in-place"])
@given(want=st.integers(1, 4), stale=st.integers(0, 4), fresh=st.integers(0, 4), room=st.integers(1, 8))
def test_a_rollout_converges_and_never_dips_more_than_its_kind_allows(rollout, want, stale, fresh, room):
    assume(stale + fresh <= room)  # what runs fits the node to begin with
    m = msgspec.structs.replace(model(replicas=want, memory=1000), rollout=rollout)
    replicas = [replica(f"s{i}", memory=1000, fp="old") for i in range(stale)]
    replicas += [replica(f"f{i}", memory=1000) for i in range(fresh)]
    ready_seen, after = simulate(m, room * 1000 + 512, replicas, ticks=60)
    floor = min(want, stale + fresh) - (1 if rollout == "in-place" else 0)
    assert min(ready_seen) >= min(floor, room)
    for seen in ready_seen:
        assert seen <= max(want + 1, stale + fresh)
    assert sum(r.memory_mb for r in after) <= room * 1000
    if room > want:  # room for a surge: every stale replica is replaced and the count is right
        assert len(after) == want and all(r.fingerprint != "old" for r in after)


def test_a_replica_left_draining_by_an_earlier_scheduler_is_stopped():
    plan = run([model()], [node("a", 9000)], [replica("x"), replica("y", state="draining")])
    assert [(s.replica.id, s.reason) for s in plan.stops] == [("y", "it was being stopped")]


def on_demand(idle_s=300):
    return Model(name="m", source="o/r/m.gguf", scaling=Scaling(min=0, max=1, idle_timeout_s=idle_s))


def test_an_on_demand_model_starts_on_its_first_request_and_not_before():
    nodes = [node("a", 9000)]
    assert run([on_demand()], nodes, []).starts == []
    woken = reconcile(
        Desired(models={"m": on_demand()}, demand={"m": NOW - 1}),
        Actual(nodes={"a": nodes[0]}, weights={"o/r/m.gguf": GB}),
        NOW,
        ids=iter(["r1"]),
    )
    assert [s.replica.id for s in woken.starts] == ["r1"]


def test_an_on_demand_model_scales_to_zero_after_its_idle_timeout():
    nodes = {"a": node("a", 9000)}
    running = [replica("r1")]
    running = [
        msgspec.structs.replace(r, fingerprint=fingerprint(on_demand(), on_demand().profiles[0])) for r in running
    ]
    actual = Actual(nodes=nodes, replicas=running, weights={"o/r/m.gguf": GB})
    asked = reconcile(Desired(models={"m": on_demand()}, demand={"m": NOW - 299}), actual, NOW, ids=iter([]))
    assert asked.stops == []
    idle = reconcile(Desired(models={"m": on_demand()}, demand={"m": NOW - 301}), actual, NOW, ids=iter([]))
    assert [s.replica.id for s in idle.stops] == ["r1"] and idle.stops[0].drain


def test_an_idle_model_says_so_and_how_it_wakes():
    plan = run([on_demand()], [node("a", 9000)], [])
    never = status(on_demand(), [], plan, NOW)
    slept = status(on_demand(), [], plan, NOW, last_asked=NOW - 400)
    assert (never.state, never.wanted) == ("idle", 0) and "first request starts it" in never.reason
    assert slept.state == "idle" and "not asked for in 300s" in slept.reason


def test_a_model_with_a_minimum_keeps_it_when_idle():
    m = Model(name="m", source="o/r/m.gguf", scaling=Scaling(min=2, max=2, idle_timeout_s=60))
    assert wanted(m.scaling, NOW, NOW - 3600) == 2 and wanted(m.scaling, NOW, NOW) == 2
