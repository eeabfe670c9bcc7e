"""A control-plane outage is not a node outage: the scheduler judges nodes only on the time it
was connected to NATS and hearing from at least one node."""

import itertools

import msgspec

from llmgw.proto import Model, ReplicaState, Scaling, fingerprint
from llmgw.scheduler.core import Actual, Desired, Hearing, Policy, heard, listen, reconcile
from services.scheduler.tests.fake_nodes import CPU, GB, NOW, Node

POLICY = Policy()  # suspect after 10 s, lost after 30 s
MODEL = Model(name="m", source="o/r/m.gguf", scaling=Scaling(min=2, max=2))


def _ready(rid, node):
    return ReplicaState(
        id=rid,
        model="m",
        profile="cpu",
        node=node,
        state="ready",
        fingerprint=fingerprint(MODEL, CPU),
        updated=NOW - 600,
    )


def _pass(nodes, hearing, known=(NOW - 600, 0.0), now=NOW):
    """One reconcile pass at `now` over replicas x on a and y on b; `nodes`: (Node, deaf_s when heard)."""
    views = {n.info.node: msgspec.structs.replace(n.view(), deaf_s=deaf) for n, deaf in nodes}
    actual = Actual(
        nodes=views,
        replicas=[_ready("x", "a"), _ready("y", "b")],
        weights={MODEL.source: GB},
        deaf_s=hearing.deaf_s,
        known_since=known[0],
        known_deaf_s=known[1],
    )
    return reconcile(Desired(models={"m": MODEL}), actual, now, POLICY, ids=(f"r{i}" for i in itertools.count()))


def _beats(h, start, end, every=2.0):
    """Heartbeats every `every` seconds from `start`, the last at `end`."""
    for t in [*itertools.takewhile(lambda t: t < end, itertools.count(start, every)), end]:
        h = heard(h, t, POLICY.stale_s)
    return h


def test_every_node_silent_at_once_is_the_scheduler_deaf_and_no_node_is_lost():
    h = _beats(Hearing(), NOW - 300, NOW - 45)  # both nodes' last heartbeat 45 s ago
    at_last = h.deaf_s
    h = listen(h, NOW, connected=True, window_s=POLICY.stale_s)
    assert h.deaf_s - at_last == 45 - POLICY.stale_s  # only the first stale_s of the silence counts
    plan = _pass([(Node("a").silent_for(45), at_last), (Node("b").silent_for(45), at_last)], h)
    print(f"every node silent 45 s: judged silent {45 - (h.deaf_s - at_last):g} s, {len(plan.stops)} stops")
    assert plan.stops == [] and plan.starts == []


def test_a_node_silent_while_another_is_heard_is_lost_and_replaced():
    h = _beats(Hearing(), NOW - 300, NOW)  # a beats on; b's last heartbeat was 45 s ago
    plan = _pass([(Node("a"), h.deaf_s), (Node("b").silent_for(45), h.deaf_s)], h)
    assert [(s.replica.id, s.reason) for s in plan.stops] == [("y", "node 'b' lost: no heartbeat for 45s")]
    assert [s.replica.node for s in plan.starts] == ["a"]


def test_a_nats_outage_longer_than_lost_s_loses_no_node_but_one_that_stays_silent_after_is_lost():
    h = _beats(Hearing(), NOW - 300, NOW - 72)
    at_last = h.deaf_s
    h = listen(h, NOW - 2, connected=False, window_s=POLICY.stale_s)  # 70 s away from NATS
    h = heard(h, NOW, POLICY.stale_s)  # back: a's heartbeat comes first, b's not yet
    plan = _pass([(Node("a"), h.deaf_s), (Node("b").silent_for(72), at_last)], h)
    assert plan.stops == [] and plan.starts == []
    h = _beats(h, NOW + 2, NOW + 40)  # a beats on, b never again: lost once heard-from time passes lost_s
    plan = _pass([(Node("a").silent_for(-40), h.deaf_s), (Node("b").silent_for(72), at_last)], h, now=NOW + 40)
    assert [(s.replica.id, s.reason) for s in plan.stops] == [("y", "node 'b' lost: no heartbeat for 40s")]


def test_time_away_from_nats_is_deaf_time_whatever_was_heard_before():
    h = heard(Hearing(), NOW - 10, POLICY.stale_s)
    assert listen(h, NOW, connected=False, window_s=POLICY.stale_s).deaf_s == 10
    assert listen(h, NOW, connected=True, window_s=POLICY.stale_s).deaf_s == 0
    assert listen(Hearing(), NOW, connected=True, window_s=POLICY.stale_s).deaf_s == 0  # starts counting


def test_a_replica_on_a_node_never_heard_of_is_not_lost_while_the_scheduler_heard_nobody():
    h = listen(Hearing(), NOW - 60, connected=True, window_s=POLICY.stale_s)
    known = (NOW - 60, h.deaf_s)
    h = listen(h, NOW, connected=True, window_s=POLICY.stale_s)  # 60 s, no heartbeat from anyone
    assert _pass([], h, known).stops == []
    assert [s.replica.id for s in _pass([], msgspec.structs.replace(h, deaf_s=0.0), known).stops] == ["x", "y"]


def test_an_agent_back_with_its_engines_adopted_reports_them_ready_and_the_records_stay_as_they_are():
    from llmgw.proto import Heartbeat, NodeInfo, ReplicaReport
    from llmgw.scheduler.core import observe

    recorded = {"x": msgspec.structs.replace(_ready("x", "a"), url="http://a:20000")}
    report = ReplicaReport(id="x", model="m", profile="cpu", node="a", state="ready", url="http://a:20000")
    beat = Heartbeat(
        info=NodeInfo(node="a", hostname="a", cpus=1, memory_total_mb=1, memory_available_mb=1), replicas=[report]
    )
    plan = observe(beat, recorded, {}, NOW)
    assert (plan.records, plan.forgets, plan.asks) == ([], [], [])
    replaced = observe(beat, {}, {}, NOW)  # given up while its agent was away: its engine is stopped
    assert [(a.id, a.reason) for a in replaced.asks] == [("x", "replaced while its node was lost")]
