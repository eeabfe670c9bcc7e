"""What the agents say, read against the records: merge(spec, report), which reports change a
record, and observe(heartbeat) -> Plan over fake records."""

import msgspec

from llmgw.proto import Heartbeat, NodeInfo, ReplicaReport, ReplicaSpec, ReplicaState, Worker
from llmgw.scheduler.core import AgentStop, accept, merge, observe, spec_of
from llmgw.scheduler.inbox import Inbox

NOW = 1_000_000.0


def spec(rid="r1", node="a", **fields):
    return ReplicaSpec(id=rid, model="m", profile="cpu", node=node, memory_mb=1000, fingerprint="fp", **fields)


def report(rid="r1", node="a", state="ready", **fields):
    return ReplicaReport(id=rid, model="m", profile="cpu", node=node, state=state, updated=NOW, **fields)


def recorded(rid="r1", node="a", state="ready", **fields):
    return msgspec.structs.replace(merge(spec(rid, node, **fields), None), state=state, updated=NOW - 10)


def beat(node="a", replicas=(), workers=()):
    info = NodeInfo(node=node, hostname=node, cpus=8, memory_total_mb=8000, memory_available_mb=8000)
    return Heartbeat(info=info, replicas=list(replicas), workers=list(workers))


def test_a_record_is_the_spec_with_the_agents_latest_word():
    state = merge(spec(), report(url="http://a:8000", kv_events="tcp://a:9000"))
    assert (state.memory_mb, state.fingerprint) == (1000, "fp")
    assert (state.state, state.url, state.kv_events, state.updated) == ("ready", "http://a:8000", "tcp://a:9000", NOW)
    assert merge(spec(), None).state == "pending"
    assert spec_of(state) == spec()


def test_a_report_changes_only_a_record_still_in_play():
    known = recorded(state="starting")
    assert accept(known, report()).state == "ready" and accept(known, report()).memory_mb == 1000
    assert accept(None, report()) is None  # not ours, or gone
    assert accept(known, report(state="stopped")) is None  # the reconcile pass decides what follows
    assert accept(recorded(state="failed"), report()) is None  # replaced, never revived
    assert accept(recorded(state="ready"), report()) is None  # nothing new


def test_a_replicas_measured_memory_is_recorded_beside_its_estimate_when_it_moves_not_as_it_wanders():
    known = recorded(state="ready", estimate_mb=1200)
    first = accept(known, report(measured_mb=900))
    assert (first.estimate_mb, first.measured_mb) == (1200, 900)
    assert accept(first, report(measured_mb=930)) is None  # an RSS wanders: not written every heartbeat
    assert accept(first, report(measured_mb=1000)).measured_mb == 1000


def test_a_heartbeat_updates_the_records_of_the_replicas_it_reports():
    plan = observe(beat(replicas=[report(url="http://a:1")]), {"r1": recorded(state="starting")}, set(), NOW)
    assert [(r.id, r.state, r.url, r.memory_mb) for r in plan.records] == [("r1", "ready", "http://a:1", 1000)]
    assert plan.asks == [] and plan.forgets == []


def test_a_replica_running_that_nobody_recorded_is_stopped_but_not_one_being_stopped():
    running = [report("ghost"), report("leaving")]
    plan = observe(beat(replicas=running), {}, {"leaving"}, NOW)
    assert plan.asks == [AgentStop(node="a", id="ghost", reason="replaced while its node was lost")]
    assert plan.records == []


def test_a_recorded_replica_its_agent_no_longer_runs_is_forgotten_unless_not_yet_delivered():
    records = {"ran": recorded("ran"), "new": recorded("new", state="pending"), "b": recorded("b", node="b")}
    plan = observe(beat(), records, set(), NOW)
    assert [r.id for r in plan.forgets] == ["ran"]


def test_a_worker_for_no_recorded_replica_is_stopped():
    plan = observe(beat(node="b", workers=["gone", "r1"]), {"r1": recorded(workers=[Worker(node="b")])}, set(), NOW)
    assert plan.asks == [AgentStop(node="b", id="gone", reason="its replica is gone", worker=True)]


def test_a_replica_whose_worker_is_gone_fails_and_its_engine_is_stopped():
    plan = observe(beat(node="b"), {"r1": recorded(workers=[Worker(node="b", endpoint="b:1")])}, set(), NOW)
    why = "its worker on node 'b' is gone"
    assert [(r.id, r.state, r.error, r.updated) for r in plan.records] == [("r1", "failed", why, NOW)]
    assert plan.asks == [AgentStop(node="a", id="r1", reason=why)]


def test_no_replica_message_carries_an_engines_key():  # worked out from secrets: llmgw.bus.EngineKeys
    assert not [m for m in (ReplicaReport, ReplicaSpec, ReplicaState) if "api_key" in m.__struct_fields__]


async def test_the_inbox_keeps_only_the_latest_heartbeat_of_a_node_in_its_place():
    inbox = Inbox()
    inbox.put_latest("a", beat("a"))
    inbox.put(report())
    inbox.put_latest("a", beat("a", workers=["w"]))
    first, second = await inbox.get(), await inbox.get()
    assert first.workers == ["w"] and second == report()
    inbox.put_latest("a", beat("a"))
    assert (await inbox.get()).workers == []


def test_a_report_never_brings_a_replica_being_stopped_back():
    draining = recorded(state="draining")
    assert accept(draining, report()) is None  # the router must not route to it again
    assert accept(draining, report(state="starting", url="http://a:1")) is None
    plan = observe(beat(replicas=[report(url="http://a:1")]), {"r1": draining}, set(), NOW)  # adopted, no pass yet
    assert plan.records == [] and plan.asks == []


def test_a_record_is_exactly_a_spec_and_a_report():
    assert set(ReplicaState.__struct_fields__) == set(ReplicaSpec.__struct_fields__) | set(
        ReplicaReport.__struct_fields__
    )
